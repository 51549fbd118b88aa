from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg.rows import TupleRow

import pgq_supervisor as pgq
from pgq_supervisor import testing
from pgq_supervisor.db import Conn


def test_enqueue_drain_roundtrip(conn: Conn) -> None:
    registry = pgq.Registry()
    seen: list[int] = []

    @registry.handler("add")
    def add(payload: dict[str, int], job: pgq.Job) -> dict[str, int]:
        seen.append(payload["a"])
        return {"sum": payload["a"] + payload["b"], "attempt": job.attempt}

    job_id = pgq.enqueue(conn, "add", {"a": 1, "b": 2})
    result = testing.drain(conn, registry)
    assert result.succeeded == 1
    rec = pgq.get_job(conn, job_id)
    assert rec.state is pgq.JobState.SUCCEEDED
    assert rec.result == {"sum": 3, "attempt": 1}
    assert seen == [1]


def test_bundle_completion_job(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("part")
    def part(payload: dict[str, int]) -> None:
        return None

    @registry.handler("done")
    def done(payload: dict[str, str]) -> str:
        return payload["bundle_id"]

    bundle = pgq.enqueue_bundle(
        conn, "batch", [pgq.NewJob("part", {"i": i}) for i in range(5)], on_complete="done"
    )
    result = testing.drain(conn, registry)
    assert result.succeeded == 6
    b = pgq.get_bundle(conn, bundle.id)
    assert b.num_jobs_stopped == 5 and b.is_complete


def test_async_handlers_run_inline_and_in_a_drain(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("aadd")
    async def aadd(payload: dict[str, int], job: pgq.Job) -> dict[str, int]:
        await asyncio.sleep(0)  # a real suspension on the loop, not a wait
        if payload["a"] < 0:
            raise ValueError("negative")
        return {"sum": payload["a"] + payload["b"], "attempt": job.attempt}

    @registry.handler("awrite")
    async def awrite(payload: dict[str, int], conn: psycopg.AsyncConnection[TupleRow]) -> None:
        return None

    assert testing.run_inline(registry, "aadd", {"a": 1, "b": 2}) == {"sum": 3, "attempt": 1}
    ok = pgq.enqueue(conn, "aadd", {"a": 2, "b": 3})
    bad = pgq.enqueue(conn, "aadd", {"a": -1, "b": 0}, max_retry_count=0)
    result = testing.drain(conn, registry, ignore=["awrite"])
    assert (result.succeeded, result.failed) == (1, 1)
    assert pgq.get_job(conn, ok).result == {"sum": 5, "attempt": 1}
    assert pgq.get_job(conn, bad).state is pgq.JobState.FAILED
    stuck = pgq.enqueue(conn, "awrite", {})
    with pytest.raises(TypeError, match="is async and takes conn"):
        testing.drain(conn, registry)
    assert pgq.get_job(conn, stuck).state is pgq.JobState.PENDING  # released, not half-run
