"""The heartbeat never waits for a row lock, so it never deadlocks with its own worker's
completion: two connections force the interleaving that deadlocked (the beat locking the
lease's rows in id order, the completion locking its batch in another), and PostgreSQL's
deadlock counter for the test's database stays where it was.

Each transaction that holds rows here is the worker's completion (`succeed`, as the worker
runs it); the beat and progress writes run with a lock_timeout, so that a statement that waits
fails the test instead of hanging it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.jobs import Job, JobId, JobState
from pgq_supervisor.worker.heartbeat import Heartbeat
from tests.support.db import age_heartbeat, claim, deadlocks, flush_stats, get
from tests.support.waiting import until

S = "pgq"
APP = "pgq-heartbeat-locks-test"


def two_jobs(conn: Conn) -> tuple[Job, Job]:
    """Two jobs claimed under one lease, in id order (the order a beat locks them in)."""
    pgq.enqueue_many(conn, [pgq.NewJob("t"), pgq.NewJob("t")])
    jobs = claim(conn, ["t"], limit=2)
    assert len(jobs) == 2 and jobs[0].lease == jobs[1].lease
    first, second = sorted(jobs, key=lambda j: j.id)
    return first, second


def impatient(dsn: str) -> Conn:
    """An autocommit connection on which a statement that waits 5 s for a lock fails."""
    c = db.connect(dsn, application_name=APP)
    c.execute("SET lock_timeout = '5s'")
    return c


@pytest.fixture
def completion(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """The worker's job connection, in a transaction (as a `conn` handler's completion, or a
    batch's): quick to find a deadlock it is part of."""
    with psycopg.connect(dsn) as c:
        c.execute("SET deadlock_timeout = '100ms'")
        c.commit()
        yield c


def alive_age(conn: Conn, job_id: JobId) -> float:
    row = conn.execute(
        "SELECT extract(epoch FROM now() - pgq.job_alive_at(state, worker_alive_at, worker_id))"
        "::float8 FROM pgq.job WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return float(row[0])


def test_a_beat_skips_a_row_its_completion_holds_and_keeps_the_job(
    conn: Conn, dsn: str, completion: psycopg.Connection[tuple[object, ...]]
) -> None:
    first, second = two_jobs(conn)
    for job in (first, second):
        age_heartbeat(conn, job.id, 60)
    hb = Heartbeat(lambda: impatient(dsn), S, 5.0, "worker-1")
    try:
        hb.hold(first.lease, [first.id, second.id])
        assert db.succeed(completion, S, second.lease, [(second.id, "1")]) == {second.id}
        # the completion's transaction holds `second`: the beat writes neither job's row (its
        # child's row in `worker` keeps both alive, schema/0025), waits for nothing, and keeps
        # both (`second` is not lost: its completion may yet roll back)
        assert hb.beat_once() == 2
        assert hb.holding() == 2
        assert alive_age(conn, first.id) < 30
        assert alive_age(conn, second.id) < 30
        stamps = conn.execute(
            "SELECT count(*) FROM pgq.job"
            " WHERE id = %s AND worker_alive_at < now() - interval '59 s'",
            (first.id,),
        ).fetchone()
        assert stamps == (1,)  # the job's own row was not written
        completion.commit()
        # now it is finished: no longer held
        assert hb.beat_once() == 1
        assert hb.holding() == 1
        assert get(conn, second.id).state is JobState.SUCCEEDED
    finally:
        hb.stop()


def test_a_beat_and_a_completion_locking_in_opposite_orders_do_not_deadlock(
    conn: Conn, dsn: str, completion: psycopg.Connection[tuple[object, ...]]
) -> None:
    before = deadlocks(conn)
    first, second = two_jobs(conn)
    beat_conn = db.connect(dsn, application_name=APP)
    beat_conn.execute("SET lock_timeout = '20s'")  # only a hang's guard: the test fails first
    outcome: dict[str, object] = {}

    def beat() -> None:
        try:
            outcome["kept"] = db.heartbeat(beat_conn, S, [first.id, second.id], first.lease)
        except DatabaseError as exc:
            outcome["beat error"] = str(exc)

    def beat_waits_for_a_lock() -> bool:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
            (beat_conn.info.backend_pid,),
        ).fetchone()
        return row is not None and row[0] == "Lock"

    try:
        # the completion holds the later row; the beat starts (and, as it used to, takes the
        # earlier row and waits for the later); then the completion wants the earlier row
        assert db.succeed(completion, S, second.lease, [(second.id, "2")]) == {second.id}
        thread = threading.Thread(target=beat)
        thread.start()
        until(lambda: not thread.is_alive() or beat_waits_for_a_lock(), "the beat to end or wait")
        try:
            done = db.succeed(completion, S, first.lease, [(first.id, "1")])
            completion.commit()
            outcome["completed"] = sorted(done)  # the second landed before
        except DatabaseError as exc:
            completion.rollback()
            outcome["completion error"] = str(exc)
        thread.join(timeout=30)
        assert not thread.is_alive()
        flush_stats(beat_conn)
        flush_stats(completion)
    finally:
        beat_conn.close()

    expected = {"kept": {first.id, second.id}, "completed": [first.id]}
    assert (outcome, deadlocks(conn) - before) == (expected, 0)
    assert get(conn, first.id).state is get(conn, second.id).state is JobState.SUCCEEDED


def test_a_progress_write_skips_a_row_its_completion_holds(
    conn: Conn, dsn: str, completion: psycopg.Connection[tuple[object, ...]]
) -> None:
    """Progress is written by the heartbeat thread too, several jobs in one statement."""
    first, second = two_jobs(conn)
    writer = impatient(dsn)
    try:
        assert db.succeed(completion, S, second.lease, [(second.id, "2")]) == {second.id}
        written = db.set_progress(
            writer, S, [(first.id, first.lease, "0.5"), (second.id, second.lease, "0.7")]
        )
        assert written == {first.id}
        completion.commit()
    finally:
        writer.close()
    assert get(conn, first.id).progress == 0.5
    assert get(conn, second.id).progress is None
