"""Cancel of a running job, at the database: it ends at once, fenced, and the row lock decides
a race with the worker's own outcome."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db, testing
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobId, OutcomeKind
from tests.support.db import claim_one, count_rows, get, listening
from tests.support.waiting import DEADLINE, until

S = "pgq"


@pytest.fixture
def effects(conn: Conn) -> Iterator[None]:
    conn.execute("CREATE TABLE public.effect (job_id uuid NOT NULL)")
    yield


def _effects(conn: Conn) -> int:
    return count_rows(conn, "effect", schema="public")


def test_cancel_of_a_running_job_ends_it_fenced_with_a_cancelled_attempt(
    conn: Conn, dsn: str
) -> None:
    job_id = pgq.enqueue(conn, "t", max_retry_count=3)
    job = claim_one(conn, "t", worker_id="w-1")
    with listening(dsn, "pgq_job_stopped", "pgq_job_cancel") as listener:
        assert pgq.cancel_job(conn, job_id) is pgq.JobState.RUNNING
        got = listener.collect()
    assert got["pgq_job_stopped"] == [str(job_id)]
    assert [json.loads(p) for p in got["pgq_job_cancel"]] == [
        {"job_id": str(job_id), "worker_id": "w-1"}
    ]
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.CANCELLED
    assert rec.stopped_at is not None and rec.worker_alive_at is None
    assert rec.worker_id == "w-1"  # kept, as for every ended job
    assert rec.current_retry_count == 0  # the attempt was not retried
    (attempt,) = rec.attempts
    assert isinstance(attempt, dict)
    assert (attempt["kind"], attempt["attempt"], attempt["worker"]) == (
        AttemptKind.CANCELLED.value,
        1,
        "w-1",
    )
    # every later write of its worker is fenced out
    assert db.heartbeat(conn, S, [job_id], job.lease) == set()
    assert db.succeed(conn, S, job.lease, [(job_id, "1")]) == set()
    assert not db.end_attempt(conn, S, [job_id], lease=job.lease, error="x", kind=AttemptKind.ERROR)
    assert not db.end_attempt(
        conn, S, [job_id], worker_id="w-1", error="died", kind=AttemptKind.WORKER_DEATH
    )
    assert db.release(conn, S, worker_id="w-1") == []
    assert get(conn, job_id) == rec


def test_cancel_of_a_pending_job_sends_no_cancel_notification(conn: Conn, dsn: str) -> None:
    job_id = pgq.enqueue(conn, "t")
    with listening(dsn, "pgq_job_stopped", "pgq_job_cancel") as listener:
        assert pgq.cancel_job(conn, job_id) is pgq.JobState.PENDING
        got = listener.collect()
    assert got == {"pgq_job_stopped": [str(job_id)], "pgq_job_cancel": []}
    assert get(conn, job_id).attempts == []


def test_cancelled_among_finds_only_cancelled_jobs(conn: Conn) -> None:
    a, b, c = pgq.enqueue_many(conn, [pgq.NewJob("t"), pgq.NewJob("t"), pgq.NewJob("t")])
    claim_one(conn, "t")
    claim_one(conn, "t")
    pgq.cancel_job(conn, a)
    pgq.cancel_job(conn, c)
    assert db.cancelled_among(conn, S, [a, b, c]) == {a, c}
    assert db.cancelled_among(conn, S, []) == set()


# ---- the race with the worker's outcome: the row lock picks exactly one ----


def _waiting_on_a_lock(conn: Conn, application_name: str) -> None:
    """Returns once the session named `application_name` waits on a lock."""

    def waiting() -> bool:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND wait_event_type = 'Lock'",
            (application_name,),
        ).fetchone()
        return row is not None and row[0] > 0

    until(waiting, f"{application_name} to wait on a lock")


def _in_thread(dsn: str, name: str, use: Callable[[Conn], object]) -> Callable[[], object]:
    """Run `use` on a fresh connection named `name` in a thread; the returned call joins it."""
    out: list[object] = []

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True, application_name=name) as c:
            try:
                out.append(use(c))
            except Exception as exc:  # handed back to the test
                out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()

    def join() -> object:
        thread.join(DEADLINE)
        assert not thread.is_alive()
        (result,) = out
        if isinstance(result, Exception):
            raise result
        return result

    return join


@pytest.mark.usefixtures("effects")
def test_success_committing_first_wins_and_the_cancel_is_refused(conn: Conn, dsn: str) -> None:
    job_id = pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    with conn.transaction():  # a `conn` handler's transaction: its write, then its success
        conn.execute("INSERT INTO public.effect VALUES (%s)", (job_id,))
        assert db.succeed(conn, S, job.lease, [(job_id, '"ok"')]) == {job_id}
        join = _in_thread(dsn, "canceller", lambda c: db.cancel(c, S, job_id))
        with psycopg.connect(dsn, autocommit=True) as watcher:
            _waiting_on_a_lock(watcher, "canceller")
    result = join()
    assert isinstance(result, db.CancelResult)
    assert (result.cancelled, result.state) == (False, pgq.JobState.SUCCEEDED)
    assert get(conn, job_id).state is pgq.JobState.SUCCEEDED
    assert _effects(conn) == 1


@pytest.mark.usefixtures("effects")
def test_cancel_committing_first_wins_and_the_handlers_write_is_rolled_back(
    conn: Conn, dsn: str
) -> None:
    job_id = pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    with psycopg.connect(dsn, autocommit=True) as canceller, canceller.transaction():
        assert db.cancel(canceller, S, job_id).cancelled

        def handler_commit(c: Conn) -> set[JobId]:
            # what Completer.run_in_transaction does: a write, then the fenced success
            with c.transaction():
                c.execute("INSERT INTO public.effect VALUES (%s)", (job_id,))
                held = db.succeed(c, S, job.lease, [(job_id, '"ok"')])
                if not held:
                    raise pgq.LeaseLost("lost")
                return held

        join = _in_thread(dsn, "worker", handler_commit)
        _waiting_on_a_lock(conn, "worker")
    with pytest.raises(pgq.LeaseLost):
        join()
    assert get(conn, job_id).state is pgq.JobState.CANCELLED
    assert _effects(conn) == 0


@pytest.mark.usefixtures("effects")
def test_a_conn_handler_cancelled_while_it_runs_writes_nothing(conn: Conn, dsn: str) -> None:
    """The real Completer: the cancel commits while the handler runs; its success is fenced
    out and its write rolled back; the job is reported lost, not retried."""
    registry = pgq.Registry()

    @registry.handler("book")
    def book(payload: dict[str, str], job: pgq.Job, conn: Conn) -> str:
        conn.execute("INSERT INTO public.effect VALUES (%s)", (job.id,))
        with psycopg.connect(dsn, autocommit=True) as other:
            pgq.cancel_job(other, job.id)
        return "booked"

    job_id = pgq.enqueue(conn, "book", {})
    result = testing.drain(conn, registry)
    assert result.count(OutcomeKind.LOST) == 1 and result.succeeded == 0
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.CANCELLED and rec.result is None
    assert _effects(conn) == 0


def test_bundle_counts_a_cancelled_running_job(conn: Conn) -> None:
    bundle = pgq.enqueue_bundle(conn, "b", [pgq.NewJob("t"), pgq.NewJob("t")])
    job = claim_one(conn, "t")
    pgq.cancel_job(conn, job.id)
    assert pgq.get_bundle(conn, bundle.id).num_jobs_stopped == 1
