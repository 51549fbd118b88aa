"""`testing.drain` and `run_inline` where users' tests call them: inside a running event loop,
on a connection inside the test's transaction, and with a handler that raises past its job."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import testing
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobId, JobState, JsonValue


class Abort(BaseException):
    """What pytest.fail or a KeyboardInterrupt look like to drain: not an Exception."""


def registry_of_kinds() -> pgq.Registry:
    registry = pgq.Registry()

    @registry.handler("double")
    def double(payload: dict[str, int]) -> int:
        return payload["n"] * 2

    @registry.handler("adouble")
    async def adouble(payload: dict[str, int], job: pgq.Job) -> int:
        job.report_progress(0.5)
        await asyncio.sleep(0)  # a real suspension on the drain's loop, not a wait
        return payload["n"] * 2

    @registry.handler("abort")
    def abort(payload: dict[str, int]) -> None:
        raise Abort("stop the drain")

    return registry


def states(conn: Conn, ids: list[JobId]) -> list[JobState]:
    return [pgq.get_job(conn, i).state for i in ids]


def test_a_drain_that_raises_leaves_no_job_running(conn: Conn) -> None:
    ids = [
        pgq.enqueue(conn, "double", {"n": 1}, priority=3),
        pgq.enqueue(conn, "abort", priority=2),
        pgq.enqueue(conn, "double", {"n": 2}, priority=1),
    ]
    with pytest.raises(Abort):
        testing.drain(conn, registry_of_kinds())
    # the success before it is written; the job that raised and the one after go back
    assert states(conn, ids) == [JobState.SUCCEEDED, JobState.PENDING, JobState.PENDING]


def test_drain_inside_the_callers_transaction(dsn: str, conn: Conn) -> None:
    """Django's TestCase: the test's transaction is rolled back at its end, and all the
    drain wrote (claims, outcomes) goes with it; nothing commits on its own."""
    registry = registry_of_kinds()
    with psycopg.connect(dsn) as tx:  # not autocommit: a transaction from the first statement
        job_id = pgq.enqueue(tx, "double", {"n": 4})
        first = pgq.enqueue(tx, "abort", priority=1)  # claimed and run first
        with pytest.raises(Abort):
            testing.drain(tx, registry)
        # released in the transaction, both
        assert states(tx, [first, job_id]) == [JobState.PENDING, JobState.PENDING]
        pgq.cancel_job(tx, first)
        assert testing.drain(tx, registry).succeeded == 1
        assert pgq.get_job(tx, job_id).result == 8
        assert pgq.queue_stats(conn) == []  # another connection sees nothing yet
        tx.rollback()
    assert pgq.queue_stats(conn) == []


def test_drain_and_run_inline_inside_a_running_loop(conn: Conn) -> None:
    registry = registry_of_kinds()

    async def test_body() -> tuple[int, int, object, object, list[JsonValue]]:
        pgq.enqueue(conn, "adouble", {"n": 1})
        pgq.enqueue(conn, "double", {"n": 1})
        on_loop = await testing.drain_async(conn, registry)
        pgq.enqueue(conn, "adouble", {"n": 2})
        from_sync = testing.drain(conn, registry)  # its own loop, in a thread
        progress: list[JsonValue] = []
        inline = testing.run_inline(registry, "adouble", {"n": 3}, progress=progress)
        awaited = await testing.run_inline_async(registry, "adouble", {"n": 4})
        return on_loop.succeeded, from_sync.succeeded, inline, awaited, progress

    assert asyncio.run(test_body()) == (2, 1, 6, 8, [0.5])


def test_drain_async_releases_on_raise(conn: Conn) -> None:
    ids = [pgq.enqueue(conn, "abort", priority=1), pgq.enqueue(conn, "adouble", {"n": 1})]
    with pytest.raises(Abort):
        asyncio.run(testing.drain_async(conn, registry_of_kinds()))
    assert states(conn, ids) == [JobState.PENDING, JobState.PENDING]
