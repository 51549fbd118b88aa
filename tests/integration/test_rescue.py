"""The rescuer: jobs whose heartbeat is older than dead_after (database clock) lose their worker."""

from __future__ import annotations

import threading
from collections import Counter

import psycopg

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobId
from pgq_supervisor.supervisor.maintenance.rescuer import Rescuer
from tests.support.db import age_heartbeat, claim, claim_one, get, in_threads, raw_row

S = "pgq"


def test_only_stale_heartbeats_are_rescued(conn: Conn) -> None:
    stale_id, fresh_id, pending_id = pgq.enqueue_many(
        conn, [pgq.NewJob("t"), pgq.NewJob("t"), pgq.NewJob("t")]
    )
    stale = claim_one(conn, "t", worker_id="dead")
    fresh = claim_one(conn, "t", worker_id="alive")
    assert (stale.id, fresh.id) == (stale_id, fresh_id)
    age_heartbeat(conn, stale.id, 31)
    age_heartbeat(conn, fresh.id, 20)  # late, but not past dead_after
    untouched = {i: raw_row(conn, i) for i in (fresh_id, pending_id)}

    ended = db.rescue(conn, S, dead_after=30)
    assert [(e.job_id, e.job_type, e.new_state, e.retry_count) for e in ended] == [
        (stale_id, "t", pgq.JobState.PENDING, 1)
    ]
    assert {i: raw_row(conn, i) for i in (fresh_id, pending_id)} == untouched
    assert db.rescue(conn, S, dead_after=30) == []


def test_a_rescue_is_a_failed_attempt_with_its_error_in_the_history(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t")
    first = claim_one(conn, "t", worker_id="dead", max_retry_count=1)
    age_heartbeat(conn, job_id, 120)
    db.rescue(conn, S, dead_after=30)

    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.PENDING
    assert rec.current_retry_count == 1
    assert rec.start_at <= db.db_now(conn, S)  # eligible again at once
    assert (rec.worker_id, rec.worker_alive_at, rec.started_at) == (None, None, None)
    assert rec.error_msg is not None and rec.error_msg.startswith("worker died")
    (entry,) = rec.attempts
    assert isinstance(entry, dict)
    assert (entry["attempt"], entry["kind"], entry["worker"]) == (1, "rescued", "dead")
    assert entry["error"] == rec.error_msg

    second = claim_one(conn, "t", worker_id="dead-again", max_retry_count=1)
    assert second.attempt == 2 and second.lease != first.lease
    age_heartbeat(conn, job_id, 120)
    (ended,) = db.rescue(conn, S, dead_after=30)
    assert ended.new_state is pgq.JobState.FAILED  # a poison job ends instead of looping
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert [e["worker"] for e in rec.attempts if isinstance(e, dict)] == ["dead", "dead-again"]


def test_rescue_takes_at_most_limit_jobs_per_round(conn: Conn) -> None:
    ids = pgq.enqueue_many(conn, [pgq.NewJob("t") for _ in range(5)])
    claim(conn, ["t"], limit=5)
    conn.execute("UPDATE pgq.job SET worker_alive_at = now() - interval '1 hour'")
    assert len(db.rescue(conn, S, dead_after=30, limit=3)) == 3
    assert len(db.rescue(conn, S, dead_after=30, limit=3)) == 2
    assert {get(conn, i).state for i in ids} == {pgq.JobState.PENDING}


def test_concurrent_rescuers_rescue_each_job_once(conn: Conn, dsn: str) -> None:
    ids = pgq.enqueue_many(conn, [pgq.NewJob("t") for _ in range(200)])
    claim(conn, ["t"], limit=200)
    conn.execute("UPDATE pgq.job SET worker_alive_at = now() - interval '1 hour'")
    start = threading.Barrier(6)

    def rescuer(n: int) -> list[JobId]:
        with psycopg.connect(dsn, autocommit=True) as own:
            start.wait(timeout=30)
            got: list[JobId] = []
            while ended := db.rescue(own, S, dead_after=30, limit=7):
                got.extend(e.job_id for e in ended)
            return got

    rescued = Counter(i for got in in_threads(6, rescuer) for i in got)
    assert set(rescued) == set(ids)
    assert max(rescued.values()) == 1
    row = conn.execute(
        "SELECT count(*) FROM pgq.job WHERE jsonb_array_length(attempts) = 1"
        " AND current_retry_count = 1 AND state = 'pending'"
    ).fetchone()
    assert row is not None and row[0] == 200


def test_a_worker_that_heartbeats_is_not_rescued(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    age_heartbeat(conn, job_id, 120)
    assert db.heartbeat(conn, S, [job.id], job.lease) == {job.id}  # it was only slow
    assert db.rescue(conn, S, dead_after=30) == []
    assert get(conn, job_id).state is pgq.JobState.RUNNING


def test_rescuer_run_once_rescues_stale_jobs_only_and_counts_them(conn: Conn) -> None:
    retried, last_try, fresh = pgq.enqueue_many(
        conn, [pgq.NewJob("t"), pgq.NewJob("t", max_retry_count=0), pgq.NewJob("t")]
    )
    for worker in ("dead-1", "dead-2", "alive"):
        claim(conn, ["t"], worker_id=worker, max_retry_count=3 if worker != "dead-2" else 0)
    age_heartbeat(conn, retried, 31)
    age_heartbeat(conn, last_try, 31)
    age_heartbeat(conn, fresh, 20)  # late, but not past dead_after

    result = Rescuer(S, dead_after=30).run_once(conn)

    assert sorted((e.job_id, e.new_state) for e in result.ended) == sorted(
        [(retried, pgq.JobState.PENDING), (last_try, pgq.JobState.FAILED)]
    )
    assert get(conn, fresh).state is pgq.JobState.RUNNING
    assert Rescuer(S, dead_after=30).run_once(conn).ended == ()
