from __future__ import annotations

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
