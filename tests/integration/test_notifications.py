"""pgq_job_stopped / pgq_job_available on every transition that should wake someone."""

from __future__ import annotations

import pgq_supervisor as pgq
from pgq_supervisor import db, testing
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind
from tests.support.db import age_heartbeat, claim, claim_one, listening

S = "pgq"
AVAILABLE = "pgq_job_available"
STOPPED = "pgq_job_stopped"


def _ids(payloads: list[str]) -> list[str]:
    return [job_id for payload in payloads for job_id in payload.split(",")]


def test_success_notifies_stopped_with_the_job_ids(conn: Conn, dsn: str) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t") for _ in range(3)])
    jobs = claim(conn, ["t"], limit=3)
    with listening(dsn, STOPPED) as listener:
        db.succeed(conn, S, jobs[0].lease, [(j.id, None) for j in jobs])
        payloads = listener.collect()[STOPPED]
    assert len(payloads) == 1
    assert sorted(_ids(payloads)) == sorted(str(j.id) for j in jobs)


def test_a_large_batch_success_splits_its_notification(conn: Conn, dsn: str) -> None:
    registry = pgq.Registry()

    @registry.handler("noop")
    def noop(payload: dict[str, int]) -> None:
        return None

    ids = pgq.enqueue_many(conn, [pgq.NewJob("noop") for _ in range(500)])
    with listening(dsn, STOPPED) as listener:
        # one claim, one lease, one succeed statement for all 500
        assert testing.drain(conn, registry, batch=500).succeeded == 500
        payloads = listener.collect()[STOPPED]
    assert all(len(p) < 8000 for p in payloads)
    assert sorted(_ids(payloads)) == sorted(str(i) for i in ids)


def test_failure_cancel_and_rescue_notify_stopped(conn: Conn, dsn: str) -> None:
    failing, cancelled, dying = pgq.enqueue_many(
        conn, [pgq.NewJob("t", max_retry_count=0) for _ in range(3)]
    )
    with listening(dsn, STOPPED, AVAILABLE) as listener:
        job = claim_one(conn, "t")
        assert job.id == failing
        db.end_attempt(conn, S, [job.id], error="x", kind=AttemptKind.ERROR, lease=job.lease)
        assert listener.collect()[STOPPED] == [str(failing)]

        pgq.cancel_job(conn, cancelled)
        assert listener.collect()[STOPPED] == [str(cancelled)]

        job = claim_one(conn, "t")
        assert job.id == dying
        age_heartbeat(conn, dying, 600)
        assert [e.new_state for e in db.rescue(conn, S, dead_after=30)] == [pgq.JobState.FAILED]
        got = listener.collect()
        assert got[STOPPED] == [str(dying)]
        assert got[AVAILABLE] == []


def test_reset_and_rescue_with_retries_left_notify_available(conn: Conn, dsn: str) -> None:
    done, stuck = pgq.enqueue_many(conn, [pgq.NewJob("t"), pgq.NewJob("u")])
    job = claim_one(conn, "t")
    db.succeed(conn, S, job.lease, [(job.id, None)])
    claim_one(conn, "u")
    age_heartbeat(conn, stuck, 600)
    with listening(dsn, AVAILABLE) as listener:
        pgq.reset_job(conn, done)
        assert listener.collect()[AVAILABLE] == ["t"]
        assert [e.job_id for e in db.rescue(conn, S, dead_after=30)] == [stuck]
        assert listener.collect()[AVAILABLE] == ["u"]
