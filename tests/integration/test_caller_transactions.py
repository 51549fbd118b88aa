"""Every public writing call in every state the caller's connection can be in: it never commits
the caller's transaction, and is its own transaction only on an autocommit connection.

Each writer runs in each state, then the caller commits or rolls back; another connection
then sees all of the writer's effect, or none of it. A non-autocommit connection that has sent
nothing yet is what Django's `transaction.atomic()` and SQLAlchemy's `Session.begin()` look
like when the enqueue is their first statement.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Generic, LiteralString, TypeVar

import psycopg
import pytest
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import pgq_supervisor as pgq
from pgq_supervisor.db import AsyncConn, Conn
from pgq_supervisor.jobs import JobId, JobState
from tests.integration.caller_states import ASYNC_STATES, SYNC_STATES, case_id, matrix
from tests.support.db import finished

C = TypeVar("C", Conn, AsyncConn)
R = TypeVar("R")
MISSING = JobId(uuid.UUID("00000000-0000-4000-8000-000000000000"))  # names no job
# Everything a writer could touch, to show that a rolled-back call left nothing behind.
TABLES: list[LiteralString] = [
    "job", "job_bundle", "job_dependency", "type_pause", "workflow_step", "workflow_signal",
]  # fmt: skip


def _tables() -> list[sql.Composed]:
    return [sql.SQL("pgq.{}").format(sql.Identifier(t)) for t in TABLES]


@pytest.fixture
def dsn(module_dsn: str) -> Iterator[str]:
    """The module's database (a few hundred cases: one database each would cost most of their
    time), emptied of what each test wrote."""
    yield module_dsn
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(_tables())))


# ---- the writers: what each prepares (committed first), does, and how its effect shows --------

W = "w"  # the type every writer enqueues; "prep" is the type of the jobs prepared for it
COUNT_W: LiteralString = "SELECT count(*) FROM pgq.job WHERE type = 'w'"
COUNT_W_AND_EDGES: LiteralString = (
    "SELECT (SELECT count(*) FROM pgq.job WHERE type = 'w'),"
    " (SELECT count(*) FROM pgq.job_dependency)"
)
PREPARED_STATE: LiteralString = "SELECT state::text FROM pgq.job WHERE type = 'prep'"


def _pending(conn: Conn) -> JobId:
    return pgq.enqueue(conn, "prep")


def _failed(conn: Conn) -> JobId:
    return finished(conn, "prep", JobState.FAILED)


def _paused(conn: Conn) -> JobId:
    pgq.pause(conn, W)
    return MISSING  # (unused)


def _nothing(conn: Conn) -> JobId:
    return MISSING  # (unused)


@dataclass(frozen=True)
class Writer(Generic[C, R]):
    name: str
    call: Callable[[C, JobId], R]  # gets what `prepare` returned
    effect: LiteralString  # one row, read on another connection
    applied: tuple[object, ...]  # that row once the call's transaction committed
    prepare: Callable[[Conn], JobId] = _nothing


def _one_dependent(name: str, call: Callable[[C, JobId], R]) -> Writer[C, R]:
    """A writer of one job that depends on a pending one."""
    return Writer(name, call, COUNT_W_AND_EDGES, (1, 1), _pending)


SYNC_WRITERS: list[Writer[Conn, object]] = [
    Writer("enqueue", lambda c, _: pgq.enqueue(c, W, {"n": 1}), COUNT_W, (1,)),
    _one_dependent("enqueue_depends_on", lambda c, dep: pgq.enqueue(c, W, depends_on=[dep])),
    Writer("enqueue_many", lambda c, _: pgq.enqueue_many(c, [pgq.NewJob(W)] * 3), COUNT_W, (3,)),
    Writer(
        "enqueue_many_unique",
        lambda c, _: pgq.enqueue_many(c, [pgq.NewJob(W, unique_key=k) for k in "ab"]),
        COUNT_W,
        (2,),
    ),
    Writer(
        "enqueue_many_depends_on",
        lambda c, dep: pgq.enqueue_many(c, [pgq.NewJob(W, depends_on=[dep]), pgq.NewJob(W)]),
        COUNT_W_AND_EDGES,
        (2, 1),
        _pending,
    ),
    Writer(
        "enqueue_bundle",
        lambda c, _: pgq.enqueue_bundle(c, "b", [pgq.NewJob(W), pgq.NewJob(W)]),
        "SELECT (SELECT count(*) FROM pgq.job WHERE type = 'w'),"
        " (SELECT count(*) FROM pgq.job_bundle)",
        (2, 1),
    ),
    Writer("cancel_job", pgq.cancel_job, PREPARED_STATE, ("cancelled",), _pending),
    Writer("reset_job", pgq.reset_job, PREPARED_STATE, ("pending",), _failed),
    Writer("retry_failed", lambda c, _: pgq.retry_failed(c), PREPARED_STATE, ("pending",), _failed),
    Writer(
        "delete_finished",
        lambda c, _: pgq.delete_finished(c, 0),
        "SELECT count(*) FROM pgq.job",
        (0,),
        _failed,
    ),
    Writer("pause", lambda c, _: pgq.pause(c, W), "SELECT count(*) FROM pgq.type_pause", (1,)),
    Writer(
        "resume",
        lambda c, _: pgq.resume(c, W),
        "SELECT count(*) FROM pgq.type_pause",
        (0,),
        _paused,
    ),
]


ASYNC_WRITERS: list[Writer[AsyncConn, Awaitable[object]]] = [
    Writer("enqueue_async", lambda c, _: pgq.enqueue_async(c, W, {"n": 1}), COUNT_W, (1,)),
    _one_dependent(
        "enqueue_async_depends_on", lambda c, dep: pgq.enqueue_async(c, W, depends_on=[dep])
    ),
    Writer(
        "enqueue_many_async",
        lambda c, dep: pgq.enqueue_many_async(c, [pgq.NewJob(W, depends_on=[dep]), pgq.NewJob(W)]),
        COUNT_W_AND_EDGES,
        (2, 1),
        _pending,
    ),
    Writer(
        "enqueue_bundle_async",
        lambda c, _: pgq.enqueue_bundle_async(c, "b", [pgq.NewJob(W), pgq.NewJob(W)]),
        "SELECT (SELECT count(*) FROM pgq.job WHERE type = 'w'),"
        " (SELECT count(*) FROM pgq.job_bundle)",
        (2, 1),
    ),
    Writer("cancel_job_async", pgq.cancel_job_async, PREPARED_STATE, ("cancelled",), _pending),
    Writer("reset_job_async", pgq.reset_job_async, PREPARED_STATE, ("pending",), _failed),
    Writer(
        "retry_failed_async",
        lambda c, _: pgq.retry_failed_async(c),
        PREPARED_STATE,
        ("pending",),
        _failed,
    ),
    Writer(
        "delete_finished_async",
        lambda c, _: pgq.delete_finished_async(c, 0),
        "SELECT count(*) FROM pgq.job",
        (0,),
        _failed,
    ),
    Writer(
        "pause_async",
        lambda c, _: pgq.pause_async(c, W),
        "SELECT count(*) FROM pgq.type_pause",
        (1,),
    ),
    Writer(
        "resume_async",
        lambda c, _: pgq.resume_async(c, W),
        "SELECT count(*) FROM pgq.type_pause",
        (0,),
        _paused,
    ),
]


def snapshot(conn: Conn) -> dict[str, list[tuple[object, ...]]]:
    return {
        t: conn.execute(sql.SQL("SELECT * FROM {} ORDER BY 1").format(table)).fetchall()
        for t, table in zip(TABLES, _tables(), strict=True)
    }


def row(conn: Conn, query: LiteralString) -> tuple[object, ...]:
    found = conn.execute(query).fetchone()
    assert found is not None
    return tuple(found)


def _check(
    conn: Conn,
    before: dict[str, list[tuple[object, ...]]],
    w: Writer[Conn, object] | Writer[AsyncConn, Awaitable[object]],
    commit: bool,
) -> None:
    if commit:
        assert row(conn, w.effect) == w.applied, "the committed call's effect is missing"
    else:
        assert snapshot(conn) == before, "the rolled-back call left something behind"


# ---- the matrix ----------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "commit"), matrix(SYNC_STATES), ids=case_id)
@pytest.mark.parametrize("writer", SYNC_WRITERS, ids=lambda w: w.name)
def test_a_writer_commits_and_rolls_back_with_the_caller(
    conn: Conn, dsn: str, writer: Writer[Conn, object], state: str, commit: bool
) -> None:
    ctx = writer.prepare(conn)
    before = snapshot(conn)
    assert row(conn, writer.effect) != writer.applied
    with SYNC_STATES[state](dsn, commit) as caller:
        writer.call(caller, ctx)
        assert caller.info.transaction_status != TransactionStatus.INERROR
    _check(conn, before, writer, commit)


@pytest.mark.parametrize(("state", "commit"), matrix(ASYNC_STATES), ids=case_id)
@pytest.mark.parametrize("writer", ASYNC_WRITERS, ids=lambda w: w.name)
def test_an_async_writer_commits_and_rolls_back_with_the_caller(
    conn: Conn, dsn: str, writer: Writer[AsyncConn, Awaitable[object]], state: str, commit: bool
) -> None:
    ctx = writer.prepare(conn)
    before = snapshot(conn)

    async def scenario() -> None:
        async with ASYNC_STATES[state](dsn, commit) as caller:
            await writer.call(caller, ctx)

    asyncio.run(scenario())
    _check(conn, before, writer, commit)


# ---- an error inside a writer: the caller's transaction stays usable -----------------------


@dataclass(frozen=True)
class Failing:
    name: str
    call: Callable[[Conn], object]
    error: str  # what the InvalidInput says


SYNC_FAILING = [
    Failing(
        "enqueue_unknown_dependency",
        lambda c: pgq.enqueue(c, W, depends_on=[MISSING]),
        str(MISSING),
    ),
    Failing(
        "enqueue_many_unknown_dependency",
        lambda c: pgq.enqueue_many(c, [pgq.NewJob(W), pgq.NewJob(W, depends_on=[MISSING])]),
        str(MISSING),
    ),
    Failing(  # the bundle's row is written before its second job is refused
        "enqueue_bundle_bad_job",
        lambda c: pgq.enqueue_bundle(c, "b", [pgq.NewJob(W), pgq.NewJob(W, priority=2**40)]),
        "priority",
    ),
]


def _only_kept(conn: Conn, kept: JobId) -> None:
    after = snapshot(conn)
    assert [r[0] for r in after["job"]] == [kept]
    assert after["job_bundle"] == after["job_dependency"] == []


@pytest.mark.parametrize("state", SYNC_STATES)
@pytest.mark.parametrize("failing", SYNC_FAILING, ids=lambda f: f.name)
def test_an_error_inside_a_writer_leaves_the_callers_transaction_usable(
    conn: Conn, dsn: str, failing: Failing, state: str
) -> None:
    with SYNC_STATES[state](dsn, True) as caller:
        with pytest.raises(pgq.InvalidInput, match=failing.error):
            failing.call(caller)
        kept = pgq.enqueue(caller, "kept")  # the caller's transaction goes on, and commits
    _only_kept(conn, kept)


@pytest.mark.parametrize("state", ASYNC_STATES)
def test_an_error_inside_an_async_writer_leaves_the_callers_transaction_usable(
    conn: Conn, dsn: str, state: str
) -> None:
    async def scenario() -> JobId:
        async with ASYNC_STATES[state](dsn, True) as caller:
            with pytest.raises(pgq.InvalidInput, match=str(MISSING)):
                await pgq.enqueue_async(caller, W, depends_on=[MISSING])
            return await pgq.enqueue_async(caller, "kept")

    _only_kept(conn, asyncio.run(scenario()))


# ---- a connection whose transaction has failed ---------------------------------------------


@pytest.mark.parametrize("writer", SYNC_WRITERS, ids=lambda w: w.name)
def test_a_writer_on_a_failed_transaction_says_so_and_writes_nothing(
    conn: Conn, dsn: str, writer: Writer[Conn, object]
) -> None:
    ctx = writer.prepare(conn)
    before = snapshot(conn)
    with psycopg.connect(dsn) as caller:
        with pytest.raises(psycopg.errors.DivisionByZero):
            caller.execute("SELECT 1 / 0")
        with pytest.raises(pgq.DatabaseError, match="roll it back before using it"):
            writer.call(caller, ctx)
        caller.rollback()
        assert snapshot(conn) == before
        writer.call(caller, ctx)  # usable again once rolled back
    assert row(conn, writer.effect) == writer.applied


@pytest.mark.parametrize("writer", ASYNC_WRITERS, ids=lambda w: w.name)
def test_an_async_writer_on_a_failed_transaction_says_so_and_writes_nothing(
    conn: Conn, dsn: str, writer: Writer[AsyncConn, Awaitable[object]]
) -> None:
    ctx = writer.prepare(conn)
    before = snapshot(conn)

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as caller:
            with pytest.raises(psycopg.errors.DivisionByZero):
                await caller.execute("SELECT 1 / 0")
            with pytest.raises(pgq.DatabaseError, match="roll it back before using it"):
                await writer.call(caller, ctx)

    asyncio.run(scenario())
    assert snapshot(conn) == before


# ---- migrate, on a database without the schema -----------------------------------------------


def test_migrate_commits_and_rolls_back_with_the_caller(empty_dsn: str) -> None:
    """Every state in one database: a rolled-back migrate leaves it empty for the next."""
    with psycopg.connect(empty_dsn, autocommit=True) as check:
        for state, commit in matrix(SYNC_STATES):
            with SYNC_STATES[state](empty_dsn, commit) as caller:
                path = caller.execute("SHOW search_path").fetchone()
                assert pgq.migrate(caller) != []
                # the migrations' SET LOCAL search_path does not outlive the call
                assert caller.execute("SHOW search_path").fetchone() == path
            migrated = check.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgq'"
            ).fetchone()
            assert migrated == (1 if commit else 0,), (state, commit)
            if commit:
                check.execute("DROP SCHEMA pgq CASCADE")


# ---- Producer: one transaction of its own per call, through a pool ---------------------------

ProducerCall = Callable[[pgq.Producer, JobId], object]


@pytest.mark.parametrize(
    "call",
    [
        lambda p, dep: p.enqueue(W),
        lambda p, dep: p.enqueue(W, depends_on=[dep]),
        lambda p, dep: p.enqueue_many([pgq.NewJob(W), pgq.NewJob(W, depends_on=[dep])]),
    ],
    ids=["enqueue", "enqueue_depends_on", "enqueue_many_depends_on"],
)
def test_a_producer_commits_each_call_and_a_failed_one_writes_nothing(
    conn: Conn, dsn: str, call: ProducerCall
) -> None:
    dep = _pending(conn)
    with ConnectionPool(dsn, min_size=1, max_size=1, open=True) as pool:
        producer = pgq.Producer(pool)
        with pytest.raises(pgq.InvalidInput, match=str(MISSING)):
            producer.enqueue_many([pgq.NewJob(W), pgq.NewJob(W, depends_on=[MISSING])])
        assert row(conn, COUNT_W) == (0,)
        call(producer, dep)  # committed when it returns
        assert row(conn, COUNT_W) != (0,)


@pytest.mark.parametrize("deps", [False, True], ids=["plain", "depends_on"])
def test_an_async_producer_commits_each_call_and_a_failed_one_writes_nothing(
    conn: Conn, dsn: str, deps: bool
) -> None:
    dep = _pending(conn)

    async def scenario() -> None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
            producer = pgq.Producer(pool)
            with pytest.raises(pgq.InvalidInput, match=str(MISSING)):
                await producer.enqueue_async(W, depends_on=[MISSING])
            assert row(conn, COUNT_W) == (0,)
            await producer.enqueue_async(W, depends_on=[dep] if deps else ())
            assert row(conn, COUNT_W) == (1,)

    asyncio.run(scenario())
