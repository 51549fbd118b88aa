"""JSON whatever adapters the caller's connection carries: the queue's own statements load json
and jsonb as Python values, and what it writes never goes through the connection's json dumper.

Django registers a text loader for jsonb on its psycopg connections (and SQLAlchemy a json
function of the user's): here both json and jsonb load as `str` on the caller's connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import psycopg
import pydantic
from psycopg.abc import AdaptContext
from psycopg.types.json import JsonbDumper, set_json_dumps
from psycopg.types.string import TextLoader
from psycopg_pool import ConnectionPool

import pgq_supervisor as pgq
from pgq_supervisor import db, testing
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobState, JsonValue
from tests.support.db import SCHEMA
from tests.support.waiting import DEADLINE


class Resize(pydantic.BaseModel):
    path: str
    width: int


REGISTRY = pgq.Registry()


@REGISTRY.handler("resize")
def resize(payload: Resize, job: pgq.Job) -> dict[str, object]:
    job.report_progress({"pct": 50})
    return {"path": payload.path, "width": payload.width}


@REGISTRY.handler("refuse", max_retry_count=0)
def refuse(payload: Resize) -> None:
    raise pgq.PermanentError("no", data={"why": [payload.width]})


PAYLOAD: dict[str, JsonValue] = {"path": "a.png", "width": 200}


def loads_json_as_text(context: AdaptContext) -> None:
    """What Django does to its connections, for jsonb; json too."""
    context.adapters.register_loader("jsonb", TextLoader)
    context.adapters.register_loader("json", TextLoader)


@contextmanager
def django_like(dsn: str) -> Iterator[Conn]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        loads_json_as_text(conn)
        yield conn


def _run_both(conn: Conn) -> tuple[pgq.JobId, pgq.JobId]:
    """A job that succeeds and one that fails, run by drain on `conn`."""
    done = pgq.enqueue(conn, "resize", PAYLOAD)
    failed = pgq.enqueue(conn, "refuse", PAYLOAD)
    assert pgq.get_job(conn, done).payload == PAYLOAD
    result = testing.drain(conn, REGISTRY)  # the typed payload validates
    assert (result.succeeded, result.failed) == (1, 1), result.outcomes
    return done, failed


def _check_records(done: pgq.JobRecord, failed: pgq.JobRecord) -> None:
    assert done.state is JobState.SUCCEEDED
    assert (done.payload, done.result, done.progress) == (PAYLOAD, PAYLOAD, {"pct": 50})
    assert failed.error_data == {"exception": "PermanentError", "data": {"why": [200]}}
    assert isinstance(failed.attempts[0], dict)


def test_every_read_on_a_connection_that_loads_json_as_text_gives_python_values(
    dsn: str,
) -> None:
    with django_like(dsn) as conn:
        done, failed = _run_both(conn)
        _check_records(pgq.wait(conn, done, DEADLINE), pgq.get_job(conn, failed))
        assert [r.result for r in pgq.wait_many(conn, [done], DEADLINE)] == [PAYLOAD]
        listed = db.list_jobs(conn, SCHEMA, JobState.SUCCEEDED, None, 10)
        assert [r.payload for r in listed] == [PAYLOAD]
        page = db.jobs_page(conn, SCHEMA, state=JobState.SUCCEEDED)
        assert [r.progress for r in page] == [{"pct": 50}]
        db.register_supervisor(
            conn, SCHEMA, id="s", host="h", pid=1, procs=1, types=["resize"],
            started_at=datetime.now(UTC), children=[{"index": 0}],
        )  # fmt: skip
        assert [s.children for s in db.list_supervisors(conn, SCHEMA)] == [[{"index": 0}]]
        # and the connection keeps its own loaders for its own statements
        assert conn.execute("""SELECT '{"a": 1}'::jsonb, '[1]'::json""").fetchone() == (
            '{"a": 1}',
            "[1]",
        )


def test_the_same_through_a_pool_whose_connections_load_json_as_text(dsn: str) -> None:
    with ConnectionPool(
        dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, configure=loads_json_as_text
    ) as pool:
        with pool.connection() as conn:
            done, failed = _run_both(conn)
            _check_records(pgq.wait(conn, done, DEADLINE), pgq.get_job(conn, failed))
        producer = pgq.Producer(pool)
        pending = producer.enqueue("resize", PAYLOAD, unique_key="k")
        assert producer.enqueue("resize", {}, unique_key="k") == pending
        with pool.connection() as conn:
            assert pgq.get_job(conn, pending).payload == PAYLOAD


def test_the_same_on_an_async_connection_that_loads_json_as_text(dsn: str) -> None:
    async def scenario() -> list[pgq.JobRecord]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            loads_json_as_text(aconn)
            first = await pgq.enqueue_async(aconn, "resize", PAYLOAD, unique_key="k")
            assert await pgq.enqueue_async(aconn, "resize", {}, unique_key="k") == first
            with django_like(dsn) as conn:
                testing.drain(conn, REGISTRY)
            return [
                await pgq.wait_async(aconn, first, DEADLINE),
                *await pgq.wait_many_async(aconn, [first], DEADLINE),
            ]

    records = asyncio.run(scenario())
    assert [(r.payload, r.result) for r in records] == [(PAYLOAD, PAYLOAD)] * 2


def test_a_connections_json_dumper_does_not_change_what_is_written(dsn: str, conn: Conn) -> None:
    """JSON goes as text made by the queue, never through the caller's json dumper."""
    with psycopg.connect(dsn, autocommit=True) as caller:
        set_json_dumps(lambda _: '{"mangled": true}', caller)
        caller.adapters.register_dumper(dict, JsonbDumper)  # dicts as jsonb, through it
        one = pgq.enqueue(caller, "resize", PAYLOAD)
        many = pgq.enqueue_many(caller, [pgq.NewJob("resize", PAYLOAD)] * 2)
        unique = pgq.enqueue_many(caller, [pgq.NewJob("resize", PAYLOAD, unique_key="u")])
        bundle = pgq.enqueue_bundle(caller, "b", [pgq.NewJob("resize", PAYLOAD)])
        assert testing.drain(caller, REGISTRY).succeeded == 5
    records = db.list_jobs(conn, SCHEMA, JobState.SUCCEEDED, None, 10)  # default loaders
    assert len(records) == 5 and {one, *many, *unique} <= {r.id for r in records}
    assert bundle.id in {r.bundle_id for r in records}
    expected = (PAYLOAD, PAYLOAD, {"pct": 50})
    assert [(r.payload, r.result, r.progress) for r in records] == [expected] * 5
