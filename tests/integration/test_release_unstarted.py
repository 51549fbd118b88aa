"""The heartbeat thread's part in a batch behind a long job (issue 20): it releases the jobs not
started (fenced, notified, no attempt consumed), writes the successes buffered before the job
in hand, and keeps a batch whose release failed held until a retry lands."""

from __future__ import annotations

import time

from psycopg.conninfo import make_conninfo

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobState
from pgq_supervisor.worker.completion import Completer
from pgq_supervisor.worker.executor import Executor
from pgq_supervisor.worker.heartbeat import Heartbeat
from pgq_supervisor.worker.unstarted import Unstarted
from tests.support.db import get, listening
from tests.support.waiting import until

S = "pgq"
APP = "pgq-heartbeat-test"
WORKER = "worker-1"

registry = pgq.Registry()


@registry.handler("t")
def noop(payload: dict[str, int]) -> None:
    return None


def _parts(
    dsn: str, release_after: float, servers: list[str] | None = None
) -> tuple[Heartbeat, Completer, Unstarted]:
    """The heartbeat connects to the last of `servers` (default: the test's database)."""
    servers = servers or [dsn]
    hb = Heartbeat(lambda: db.connect(servers[-1], application_name=APP), S, 5.0, WORKER)
    completer = Completer(S, WORKER, heartbeat=hb)
    unstarted = Unstarted(release_after)
    hb.watch(unstarted, completer.flush)
    return hb, completer, unstarted


def _claim(conn: Conn, completer: Completer, n: int) -> list[pgq.Job]:
    pgq.enqueue_many(conn, [pgq.NewJob("t", {})] * n)
    jobs = completer.claim(conn, registry.claim_policy(("t",)), n)
    assert len(jobs) == n
    return jobs


def _pending_uncharged(conn: Conn, job: pgq.Job) -> bool:
    record = get(conn, job.id)
    return (
        record.state is JobState.PENDING
        and record.current_retry_count == 0
        and record.attempts == []
        and record.worker_id is None
    )


def test_behind_a_long_job_the_rest_goes_back_and_the_successes_before_it_are_written(
    conn: Conn, dsn: str
) -> None:
    hb, completer, unstarted = _parts(dsn, 0.25)
    executor = Executor(registry, WORKER)
    try:
        first, long, *rest = jobs = _claim(conn, completer, 5)
        started = time.monotonic() - 10  # the job in hand has run for ten seconds
        unstarted.load(jobs, started)
        assert unstarted.take(started) is first
        completer.settle(conn, executor.run(first))  # buffered: waits for the next claim
        assert get(conn, first.id).state is JobState.RUNNING
        assert unstarted.take(started) is long
        with listening(dsn, "pgq_job_available") as listener:
            assert hb.release_unstarted() == 3
            assert listener.collect()["pgq_job_available"] == ["t"]  # an idle child wakes
        assert all(_pending_uncharged(conn, j) for j in rest)
        assert get(conn, first.id).state is JobState.SUCCEEDED
        assert completer.buffered == 0
        assert get(conn, long.id).state is JobState.RUNNING
        assert hb.holding() == 1  # the job in hand only
        assert unstarted.take(time.monotonic()) is None  # the main thread skips them
        assert unstarted.finish() == []
        assert hb.release_unstarted() == 0  # once
    finally:
        hb.stop()


def test_a_failed_release_keeps_the_jobs_held_and_lands_on_a_retry(conn: Conn, dsn: str) -> None:
    unreachable = make_conninfo(dsn, host="127.0.0.1", port=1)  # nothing listens: refused
    servers = [unreachable]
    hb, completer, unstarted = _parts(dsn, 0.25, servers)
    try:
        first, *rest = jobs = _claim(conn, completer, 3)
        unstarted.load(jobs, time.monotonic() - 10)
        assert unstarted.take(time.monotonic() - 10) is first
        assert hb.release_unstarted() == 0
        assert hb.holding() == 3  # still held: heart-beaten, nobody else's yet
        assert all(get(conn, j.id).state is JobState.RUNNING for j in rest)
        assert unstarted.take(time.monotonic()) is None  # cut all the same: ours to release
        servers.append(dsn)  # the server is back
        assert hb.release_unstarted() == 2
        assert all(_pending_uncharged(conn, j) for j in rest)
        assert hb.holding() == 1
    finally:
        hb.stop()


def test_the_thread_wakes_for_a_batch_and_gives_back_its_rest_in_time(conn: Conn, dsn: str) -> None:
    hb, completer, unstarted = _parts(dsn, 0.2)
    hb.start()
    try:
        first, *rest = jobs = _claim(conn, completer, 4)
        now = time.monotonic()
        unstarted.load(jobs, now)  # wakes the thread, asleep with nothing to watch
        assert unstarted.take(now) is first
        until(lambda: all(_pending_uncharged(conn, j) for j in rest), "the rest released")
        assert time.monotonic() - now >= 0.2  # not before the job in hand ran that long
        assert unstarted.take(time.monotonic()) is None
    finally:
        hb.stop()


def test_a_release_the_main_thread_could_not_write_is_retried_by_the_heartbeat(
    conn: Conn, dsn: str
) -> None:
    """The batch's end releases its unstarted jobs on the job connection; when that write fails
    they stay held and the heartbeat thread releases them: no attempt is charged (before, they
    left the heartbeat and the rescuer charged each one)."""
    hb, completer, _ = _parts(dsn, 60.0)
    hb.start()
    try:
        jobs = _claim(conn, completer, 3)
        broken = db.connect(dsn)
        broken.close()  # the job connection gone: the release raises DatabaseError
        completer.release(broken, jobs)
        until(lambda: all(_pending_uncharged(conn, j) for j in jobs), "the retried release")
        assert hb.holding() == 0
    finally:
        hb.stop()


def test_an_unexpected_error_does_not_end_the_heartbeat_thread(conn: Conn, dsn: str) -> None:
    """A bug or an error other than DatabaseError once killed the thread silently: every held
    job then went stale and the rescuer charged them all."""
    calls: list[str] = []

    def connect() -> Conn:
        calls.append("connect")
        if len(calls) == 1:
            raise RuntimeError("a bug in connecting")
        return db.connect(dsn, application_name=APP)

    hb = Heartbeat(connect, S, 0.05, WORKER)
    completer = Completer(S, WORKER, heartbeat=hb)
    jobs = _claim(conn, completer, 1)
    conn.execute(
        "UPDATE pgq.job SET worker_alive_at = now() - interval '1 hour' WHERE id = %s",
        (jobs[0].id,),
    )
    hb.start()
    try:

        def beaten() -> bool:
            row = conn.execute(
                "SELECT pgq.job_alive_at(state, worker_alive_at, worker_id)"
                " > now() - interval '1 minute' FROM pgq.job WHERE id = %s",
                (jobs[0].id,),
            ).fetchone()
            return bool(row and row[0])

        until(beaten, "a heartbeat after the error")
        assert len(calls) >= 2
    finally:
        hb.stop()
