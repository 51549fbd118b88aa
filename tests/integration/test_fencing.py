"""Fencing: a worker that lost its lease (rescued, reset, finished elsewhere) writes nothing."""

from __future__ import annotations

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, Job, LeaseToken
from pgq_supervisor.worker.completion import Completer
from pgq_supervisor.worker.executor import Executor
from tests.support.db import age_heartbeat, claim, claim_one, get, raw_row

S = "pgq"


def _stale_writes(conn: Conn, job: Job, lease: LeaseToken) -> None:
    """Every write a worker can make about `job`, under `lease`: each must touch nothing."""
    assert db.heartbeat(conn, S, [job.id], lease) == set()
    assert db.succeed(conn, S, lease, [(job.id, '{"late": true}')]) == set()
    assert (
        db.end_attempt(conn, S, [job.id], error="late error", kind=AttemptKind.ERROR, lease=lease)
        == []
    )
    assert (
        db.end_attempt(
            conn,
            S,
            [job.id],
            error="late",
            kind=AttemptKind.PERMANENT,
            lease=lease,
            allow_retry=False,
        )
        == []
    )
    assert db.release(conn, S, ids=[job.id], lease=lease) == []


def test_rescued_job_cannot_be_completed_by_its_old_holder(conn: Conn) -> None:
    pgq.enqueue(conn, "t", {"n": 1})
    old = claim_one(conn, "t", worker_id="paused-worker")
    age_heartbeat(conn, old.id, 120)
    assert [r.job_id for r in db.rescue(conn, S, dead_after=30)] == [old.id]
    new = claim_one(conn, "t", worker_id="live-worker")
    assert new.id == old.id and new.lease != old.lease

    before = raw_row(conn, old.id)
    _stale_writes(conn, old, old.lease)
    assert raw_row(conn, old.id) == before

    assert db.heartbeat(conn, S, [new.id], new.lease) == {new.id}
    assert db.succeed(conn, S, new.lease, [(new.id, '{"by": "live"}')]) == {new.id}
    rec = get(conn, new.id)
    assert rec.state is pgq.JobState.SUCCEEDED
    assert rec.result == {"by": "live"}


def test_rescued_job_waiting_for_retry_ignores_its_old_holder(conn: Conn) -> None:
    pgq.enqueue(conn, "t")
    old = claim_one(conn, "t")
    age_heartbeat(conn, old.id, 120)
    db.rescue(conn, S, dead_after=30)
    before = raw_row(conn, old.id)
    assert get(conn, old.id).state is pgq.JobState.PENDING
    _stale_writes(conn, old, old.lease)
    assert raw_row(conn, old.id) == before


def test_force_reset_fences_the_old_lease(conn: Conn) -> None:
    pgq.enqueue(conn, "t")
    old = claim_one(conn, "t")
    pgq.reset_job(conn, old.id, force=True)
    rec = get(conn, old.id)
    assert rec.state is pgq.JobState.PENDING
    assert (rec.worker_id, rec.worker_alive_at, rec.started_at) == (None, None, None)

    before = raw_row(conn, old.id)
    _stale_writes(conn, old, old.lease)
    assert raw_row(conn, old.id) == before


def test_finished_job_ignores_a_second_completion(conn: Conn) -> None:
    pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    assert db.succeed(conn, S, job.lease, [(job.id, '"first"')]) == {job.id}
    before = raw_row(conn, job.id)
    _stale_writes(conn, job, job.lease)
    assert raw_row(conn, job.id) == before
    assert get(conn, job.id).result == "first"


def test_heartbeat_returns_only_the_jobs_still_held(conn: Conn) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t"), pgq.NewJob("t")])
    kept, lost = claim(conn, ["t"], limit=2)
    assert kept.lease == lost.lease  # one claim, one lease
    pgq.reset_job(conn, lost.id, force=True)
    before = raw_row(conn, lost.id)
    assert db.heartbeat(conn, S, [kept.id, lost.id], kept.lease) == {kept.id}
    assert raw_row(conn, lost.id) == before
    assert db.succeed(conn, S, kept.lease, [(kept.id, None), (lost.id, None)]) == {kept.id}
    assert raw_row(conn, lost.id) == before


def test_heartbeat_moves_worker_alive_at_on_the_database_clock(conn: Conn) -> None:
    pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    age_heartbeat(conn, job.id, 60)
    stale = get(conn, job.id).worker_alive_at
    assert db.heartbeat(conn, S, [job.id], job.lease) == {job.id}
    fresh = get(conn, job.id).worker_alive_at
    assert stale is not None and fresh is not None
    assert (fresh - stale).total_seconds() >= 59


@pytest.mark.parametrize("fails", [False, True], ids=["success", "failure"])
def test_executor_reports_a_lost_lease_and_writes_nothing(
    conn: Conn, dsn: str, fails: bool
) -> None:
    registry = pgq.Registry()
    after_reset: list[tuple[object, ...]] = []

    @registry.handler("t", max_retry_count=3)
    def handler(payload: dict[str, int], job: pgq.Job) -> dict[str, int]:
        # Another process takes the job away while this handler runs.
        with psycopg.connect(dsn, autocommit=True) as admin:
            pgq.reset_job(admin, job.id, force=True)
            after_reset.append(raw_row(admin, job.id))
        if fails:
            raise RuntimeError("too late to matter")
        return {"done": 1}

    pgq.enqueue(conn, "t", {"n": 1})
    executor, completer = Executor(registry, "worker-1"), Completer(S, "worker-1")
    job = claim_one(conn, "t")
    completer.settle(conn, executor.run(job))
    completer.flush(conn)
    outcomes = completer.take_outcomes()
    assert [(o.job.id, o.kind) for o in outcomes] == [(job.id, "lost")]
    assert raw_row(conn, job.id) == after_reset[0]
    rec = get(conn, job.id)
    assert rec.state is pgq.JobState.PENDING
    assert (rec.result, rec.error_msg, rec.attempts) == (None, None, [])
