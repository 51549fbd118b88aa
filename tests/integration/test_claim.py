"""The claim: one statement, SKIP LOCKED, priority then FIFO, start_at and type filters."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import psycopg

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobId
from tests.support.db import claim, claim_one, count_rows, get, in_threads


def test_concurrent_claims_take_each_job_exactly_once(conn: Conn, dsn: str) -> None:
    ids = pgq.enqueue_many(conn, [pgq.NewJob("work", {"i": i}) for i in range(1000)])
    start = threading.Barrier(8)

    def worker(n: int) -> list[JobId]:
        got: list[JobId] = []
        with psycopg.connect(dsn, autocommit=True) as own:
            start.wait(timeout=30)
            while True:
                jobs = claim(own, ["work"], worker_id=f"w{n}", limit=1 + n % 5)
                if not jobs:
                    return got
                got.extend(j.id for j in jobs)

    per_thread = in_threads(8, worker)
    claimed = Counter(job_id for got in per_thread for job_id in got)
    assert set(claimed) == set(ids)
    assert max(claimed.values()) == 1
    assert count_rows(conn, where="state = 'running'") == 1000
    # every thread's claims are recorded under its own worker id
    for n, got in enumerate(per_thread):
        rows = conn.execute(
            "SELECT count(*) FROM pgq.job WHERE id = ANY(%s) AND worker_id = %s", (got, f"w{n}")
        ).fetchone()
        assert rows is not None and rows[0] == len(got)


def test_claim_takes_highest_priority_then_oldest(conn: Conn) -> None:
    low_old = pgq.enqueue(conn, "t", {"n": "low_old"}, priority=0)
    high_1 = pgq.enqueue(conn, "t", {"n": "high_1"}, priority=10)
    low_new = pgq.enqueue(conn, "t", {"n": "low_new"}, priority=0)
    high_2 = pgq.enqueue(conn, "t", {"n": "high_2"}, priority=10)
    negative = pgq.enqueue(conn, "t", {"n": "negative"}, priority=-5)
    order = [claim_one(conn, "t").id for _ in range(5)]
    assert order == [high_1, high_2, low_old, low_new, negative]
    assert claim(conn, ["t"]) == []


def test_fifo_holds_within_one_transaction(conn: Conn) -> None:
    with conn.transaction():
        first = pgq.enqueue(conn, "t", {"n": 1})
        second = pgq.enqueue(conn, "t", {"n": 2})
        third = pgq.enqueue(conn, "t", {"n": 3})
    assert [claim_one(conn, "t").id for _ in range(3)] == [first, second, third]


def test_fifo_holds_within_one_bulk_enqueue(conn: Conn) -> None:
    ids = pgq.enqueue_many(conn, [pgq.NewJob("t", {"n": i}) for i in range(50)])
    assert [claim_one(conn, "t").id for _ in range(50)] == ids


def test_future_start_at_is_not_claimable_until_due(conn: Conn) -> None:
    later = db.db_now(conn, "pgq") + timedelta(minutes=5)
    delayed = pgq.enqueue(conn, "t", start_at=later, priority=100)
    ready = pgq.enqueue(conn, "t")
    assert claim_one(conn, "t").id == ready
    assert claim(conn, ["t"], limit=10) == []
    assert get(conn, delayed).state is pgq.JobState.PENDING

    conn.execute(
        "UPDATE pgq.job SET start_at = now() - interval '1 second' WHERE id = %s", [delayed]
    )
    assert claim_one(conn, "t").id == delayed


def test_claim_serves_only_the_requested_types(conn: Conn) -> None:
    a = pgq.enqueue(conn, "a", priority=1)
    b = pgq.enqueue(conn, "b", priority=2)
    c = pgq.enqueue(conn, "c", priority=3)
    got = claim(conn, ["a", "b"], limit=10)
    assert {j.id for j in got} == {a, b}
    assert get(conn, c).state is pgq.JobState.PENDING
    assert claim(conn, ["a", "b"], limit=10) == []
    assert claim(conn, ["nothing"], limit=10) == []
    assert [j.id for j in claim(conn, ["c"])] == [c]


def test_claim_stamps_the_job_with_a_fresh_lease(conn: Conn) -> None:
    default_budget = pgq.enqueue(conn, "t")
    own_budget = pgq.enqueue(conn, "t", max_retry_count=7)
    before = db.db_now(conn, "pgq")
    first = claim_one(conn, "t", worker_id="sup-1/child-3", max_retry_count=2)
    second = claim_one(conn, "t", worker_id="sup-1/child-3", max_retry_count=2)
    assert (first.id, second.id) == (default_budget, own_budget)
    assert first.lease != second.lease
    assert (first.attempt, first.max_retry_count) == (1, 2)
    assert second.max_retry_count == 7  # the job's own budget beats the handler default

    rec = get(conn, first.id)
    assert rec.state is pgq.JobState.RUNNING
    assert rec.worker_id == "sup-1/child-3"
    assert rec.started_at is not None and rec.started_at >= before
    assert rec.worker_alive_at is not None and rec.worker_alive_at >= before
    assert rec.stopped_at is None
    lease = conn.execute("SELECT lease FROM pgq.job WHERE id = %s", [first.id]).fetchone()
    assert lease is not None and lease[0] == first.lease


def test_reclaim_after_release_gets_a_new_lease_without_using_an_attempt(conn: Conn) -> None:
    pgq.enqueue(conn, "t")
    first = claim_one(conn, "t")
    assert db.release(conn, "pgq", lease=first.lease) == [first.id]
    again = claim_one(conn, "t")
    assert again.id == first.id
    assert again.lease != first.lease
    assert again.attempt == 1
    assert get(conn, first.id).attempts == []
