"""SQLAlchemy sessions and connections (psycopg dialect) passed straight to the queue's API.

The job joins the session's transaction: the user's row and the job appear together on
commit and vanish together on rollback, also when the enqueue is the first statement of
`Session.begin()` (the driver connection has sent nothing yet then).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import pgq_supervisor as pgq
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobId, JobState
from pgq_supervisor.testing import drain
from tests.readme import blocks

INSERT = text("INSERT INTO orders (note) VALUES (:note)")


def sa_url(dsn: str) -> URL:
    """The SQLAlchemy URL (psycopg dialect) of a libpq keyword DSN."""
    d = psycopg.conninfo.conninfo_to_dict(dsn)
    host, port = str(d.get("host", "127.0.0.1")), d.get("port")
    if host.startswith("/"):  # a Unix socket (the embedded server): libpq's options in the query
        query = {"host": host} | ({} if port is None else {"port": str(port)})
        return URL.create(
            "postgresql+psycopg",
            username=str(d.get("user", "postgres")),
            database=str(d["dbname"]),
            query=query,
        )
    return URL.create(
        "postgresql+psycopg",
        username=str(d.get("user", "postgres")),
        host=host,
        port=int(str(port)) if port is not None else None,
        database=str(d["dbname"]),
    )


@pytest.fixture
def engine(dsn: str) -> Iterator[Engine]:
    eng = create_engine(sa_url(dsn))
    with eng.begin() as c:
        c.execute(text("CREATE TABLE orders (id serial PRIMARY KEY, note text NOT NULL)"))
    yield eng
    eng.dispose()


def async_engine(engine: Engine) -> AsyncEngine:
    return create_async_engine(engine.url)


def seen(dsn: str, note: str, job_id: JobId) -> tuple[bool, bool]:
    """(the order is there, the job is there), read on another connection."""
    with psycopg.connect(dsn, autocommit=True) as other:
        order = other.execute("SELECT 1 FROM orders WHERE note = %s", [note]).fetchone()
        job = other.execute("SELECT 1 FROM pgq.job WHERE id = %s", [job_id]).fetchone()
    return order is not None, job is not None


@pytest.mark.parametrize("commit", [True, False])
def test_session_commit_or_rollback_takes_the_job_along(
    engine: Engine, dsn: str, commit: bool
) -> None:
    with Session(engine) as session:
        session.execute(INSERT, {"note": "a"})
        job_id = pgq.enqueue(session, "mail.send", {"to": "a"})
        session.commit() if commit else session.rollback()
    assert seen(dsn, "a", job_id) == (commit, commit)


@pytest.mark.parametrize("commit", [True, False])
def test_enqueue_first_in_session_begin(engine: Engine, dsn: str, commit: bool) -> None:
    """The enqueue is the block's first statement: it must not commit on its own."""
    with Session(engine) as session:
        ids: list[JobId] = []
        try:
            with session.begin():
                ids.append(pgq.enqueue(session, "mail.send"))
                session.execute(INSERT, {"note": "b"})
                if not commit:
                    raise LookupError("roll back")
        except LookupError:
            pass
    assert seen(dsn, "b", ids[0]) == (commit, commit)


@pytest.mark.parametrize("commit", [True, False])
def test_core_connection(engine: Engine, dsn: str, commit: bool) -> None:
    with engine.connect() as c:
        job_id = pgq.enqueue(c, "mail.send")  # first: begins the connection's transaction
        c.execute(INSERT, {"note": "c"})
        c.commit() if commit else c.rollback()
    assert seen(dsn, "c", job_id) == (commit, commit)


def test_connection_closed_without_commit_drops_the_job(engine: Engine, dsn: str) -> None:
    with engine.connect() as c:
        job_id = pgq.enqueue(c, "mail.send")
    assert seen(dsn, "c", job_id) == (False, False)


@pytest.mark.parametrize("commit", [True, False])
def test_async_session(engine: Engine, dsn: str, commit: bool) -> None:
    async def go() -> JobId:
        eng = async_engine(engine)
        try:
            async with AsyncSession(eng) as session:
                await session.execute(INSERT, {"note": "d"})
                job_id = await pgq.enqueue_async(session, "mail.send")
                await session.commit() if commit else await session.rollback()
                return job_id
        finally:
            await eng.dispose()

    assert seen(dsn, "d", asyncio.run(go())) == (commit, commit)


@pytest.mark.parametrize("commit", [True, False])
def test_enqueue_first_in_async_session_begin(engine: Engine, dsn: str, commit: bool) -> None:
    async def go() -> JobId:
        eng = async_engine(engine)
        ids: list[JobId] = []
        try:
            async with AsyncSession(eng) as session:
                try:
                    async with session.begin():
                        ids.append(await pgq.enqueue_async(session, "mail.send"))
                        await session.execute(INSERT, {"note": "e"})
                        if not commit:
                            raise LookupError("roll back")
                except LookupError:
                    pass
            return ids[0]
        finally:
            await eng.dispose()

    assert seen(dsn, "e", asyncio.run(go())) == (commit, commit)


@pytest.mark.parametrize("commit", [True, False])
def test_async_connection(engine: Engine, dsn: str, commit: bool) -> None:
    async def go() -> JobId:
        eng = async_engine(engine)
        try:
            async with eng.connect() as c:
                job_id = await pgq.enqueue_async(c, "mail.send")
                await c.execute(INSERT, {"note": "f"})
                await c.commit() if commit else await c.rollback()
                return job_id
        finally:
            await eng.dispose()

    assert seen(dsn, "f", asyncio.run(go())) == (commit, commit)


def test_reads_waits_and_drains_on_a_session(engine: Engine) -> None:
    registry = pgq.Registry()

    @registry.handler("double")
    def double(payload: dict[str, int]) -> int:
        return payload["n"] * 2

    with Session(engine) as session:
        job_id = pgq.enqueue(session, "double", {"n": 21})
        assert pgq.get_job(session, job_id).state is JobState.PENDING
        # inside the session's transaction: claims and outcomes are savepoints in it
        assert drain(session, registry).succeeded == 1
        assert pgq.get_job(session, job_id).result == 42
        session.commit()
        assert pgq.wait(session, job_id, timeout=30).state is JobState.SUCCEEDED


def test_async_wait_on_an_async_session(engine: Engine, conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "double")
    pgq.cancel_job(conn, job_id)

    async def go() -> JobState:
        eng = async_engine(engine)
        try:
            async with AsyncSession(eng) as session:
                return (await pgq.wait_async(session, job_id, timeout=30)).state
        finally:
            await eng.dispose()

    assert asyncio.run(go()) is JobState.CANCELLED


def test_a_sync_call_given_an_async_session_says_so(engine: Engine) -> None:
    from pgq_supervisor.frameworks import as_psycopg

    with pytest.raises(TypeError, match="_async"):
        as_psycopg(AsyncSession(async_engine(engine)))  # type: ignore[arg-type]


def test_the_readme_block_runs_as_written(
    engine: Engine, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (code,) = blocks("SQLAlchemy", "python")
    monkeypatch.setenv("PGQ_DSN", dsn)
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/frameworks.md", "exec"), namespace)
    with psycopg.connect(dsn) as other:
        assert other.execute("SELECT path FROM upload").fetchall() == [("a.png",)]
        job = other.execute("SELECT id FROM pgq.job").fetchone()
    assert job is not None and job[0] == namespace["job_id"]
