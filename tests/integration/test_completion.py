"""The Completer: every way a child writes what became of its jobs, on a real database.

Successes ride on the next claim or are flushed, failures are written at
once, a lost lease writes nothing, and across a lost connection buffered successes are written
once it comes back, or forgotten to run again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.jobs import JobId, OutcomeKind
from pgq_supervisor.worker import runs
from pgq_supervisor.worker.completion import Completer
from pgq_supervisor.worker.executor import Executor
from pgq_supervisor.worker.heartbeat import Heartbeat
from tests.support.db import age_heartbeat, get, raw_row

S = "pgq"
WORKER = "worker-1"
APP = "pgq-completion-test"


def _registry() -> pgq.Registry:
    registry = pgq.Registry()

    @registry.handler("t", max_retry_count=1, retry=lambda attempt, rng: 0.0)
    def echo(payload: dict[str, int]) -> dict[str, int]:
        if payload.get("fail"):
            raise RuntimeError("asked to fail")
        return payload

    return registry


REGISTRY = _registry()
POLICY = REGISTRY.claim_policy(["t"])


@pytest.fixture
def worker_conn(dsn: str) -> Iterator[Conn]:
    """The worker's own connection, findable by its application_name (to be cut)."""
    with db.connect(dsn, application_name=APP) as c:
        yield c


@pytest.fixture
def heartbeat(dsn: str) -> Iterator[Heartbeat]:
    """A heartbeat that is never started: holding() tells how many jobs the completer left in it."""
    hb = Heartbeat(lambda: db.connect(dsn), S, 5.0, WORKER)
    yield hb
    hb.stop()


def _xmin(conn: Conn, ids: list[JobId]) -> set[str]:
    """The transactions that wrote these rows last."""
    rows = conn.execute("SELECT xmin::text FROM pgq.job WHERE id = ANY(%s)", (ids,)).fetchall()
    return {r[0] for r in rows}


def _states(conn: Conn, ids: list[JobId]) -> list[pgq.JobState]:
    return [get(conn, i).state for i in ids]


def _cut(dsn: str) -> None:
    """Terminate the worker's connection from outside, as a server restart would."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (APP,),
        ).fetchall()
    assert killed == [(True,)]


def _run_all(completer: Completer, conn: Conn, jobs: list[pgq.Job]) -> None:
    executor = Executor(REGISTRY, WORKER)
    for job in jobs:
        completer.settle(conn, executor.run(job))


def test_successes_ride_on_the_next_claim_in_its_transaction(
    conn: Conn, worker_conn: Conn, heartbeat: Heartbeat
) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t", {"n": n}) for n in range(5)])
    completer = Completer(S, WORKER, heartbeat=heartbeat)
    first = completer.claim(worker_conn, POLICY, 3)
    assert heartbeat.holding() == 3
    _run_all(completer, worker_conn, first)
    ids = [j.id for j in first]
    assert completer.buffered == 3 and completer.take_outcomes() == []
    assert _states(conn, ids) == [pgq.JobState.RUNNING] * 3  # not written yet

    second = completer.claim(worker_conn, POLICY, 2)
    assert _states(conn, ids) == [pgq.JobState.SUCCEEDED] * 3
    assert [get(conn, j.id).result for j in first] == [j.payload for j in first]
    # one statement wrote the successes and claimed the next batch: one transaction
    assert len(_xmin(conn, ids + [j.id for j in second])) == 1
    outcomes = completer.take_outcomes()
    assert [(o.job.id, o.kind) for o in outcomes] == [(i, OutcomeKind.SUCCEEDED) for i in ids]
    assert heartbeat.holding() == 2  # the settled jobs left the heartbeat, the new ones came


def test_bundled_successes_ride_on_the_claim_and_are_counted(conn: Conn, worker_conn: Conn) -> None:
    bundle = pgq.enqueue_bundle(conn, "import", [pgq.NewJob("t", {"n": n}) for n in range(3)])
    completer = Completer(S, WORKER)
    jobs = completer.claim(worker_conn, POLICY, 3)
    _run_all(completer, worker_conn, jobs)
    later = pgq.enqueue(conn, "t", {"n": 9})

    (claimed,) = completer.claim(worker_conn, POLICY, 10)
    assert claimed.id == later
    assert _states(conn, [j.id for j in jobs]) == [pgq.JobState.SUCCEEDED] * 3
    # one statement, as without a bundle: its trigger counted the bundle (schema/0024)
    assert len(_xmin(conn, [j.id for j in jobs] + [later])) == 1
    stopped = pgq.get_bundle(conn, bundle.id)
    assert (stopped.num_jobs, stopped.num_jobs_stopped) == (3, 3)
    assert [o.kind for o in completer.take_outcomes()] == [OutcomeKind.SUCCEEDED] * 3


def test_a_failure_is_written_at_once_and_a_success_waits(
    conn: Conn, worker_conn: Conn, heartbeat: Heartbeat
) -> None:
    ok, bad = pgq.enqueue_many(conn, [pgq.NewJob("t", {}), pgq.NewJob("t", {"fail": 1})])
    completer = Completer(S, WORKER, heartbeat=heartbeat)
    _run_all(completer, worker_conn, completer.claim(worker_conn, POLICY, 2))
    assert [(o.job.id, o.kind) for o in completer.take_outcomes()] == [(bad, OutcomeKind.RETRIED)]
    assert get(conn, bad).error_msg == "RuntimeError: asked to fail"
    assert get(conn, ok).state is pgq.JobState.RUNNING
    assert heartbeat.holding() == 1
    completer.flush(worker_conn)
    assert get(conn, ok).state is pgq.JobState.SUCCEEDED
    assert heartbeat.holding() == 0


def test_a_lost_lease_writes_nothing_and_is_reported_lost(
    conn: Conn, worker_conn: Conn, heartbeat: Heartbeat
) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t", {"n": 1}), pgq.NewJob("t", {"n": 2})])
    completer = Completer(S, WORKER, heartbeat=heartbeat)
    kept, taken = completer.claim(worker_conn, POLICY, 2)
    _run_all(completer, worker_conn, [kept, taken])
    pgq.reset_job(conn, taken.id, force=True)  # an operator takes it back meanwhile
    before = raw_row(conn, taken.id)
    urgent = pgq.enqueue(conn, "t", {"n": 3}, priority=5)  # what the next claim takes

    assert [j.id for j in completer.claim(worker_conn, POLICY, 1)] == [urgent]
    assert raw_row(conn, taken.id) == before
    assert get(conn, kept.id).state is pgq.JobState.SUCCEEDED
    outcomes = {o.job.id: (o.kind, o.error) for o in completer.take_outcomes()}
    assert outcomes == {
        kept.id: (OutcomeKind.SUCCEEDED, None),
        taken.id: (OutcomeKind.LOST, "lease lost"),
    }
    assert heartbeat.holding() == 1  # the job the last claim took again, nothing else


def test_successes_buffered_across_a_reconnect_are_written_when_it_is_back(
    conn: Conn, dsn: str, worker_conn: Conn, heartbeat: Heartbeat
) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t", {"n": n}) for n in range(2)])
    completer = Completer(S, WORKER, heartbeat=heartbeat)
    jobs = completer.claim(worker_conn, POLICY, 2)
    _run_all(completer, worker_conn, jobs)
    _cut(dsn)
    with pytest.raises(DatabaseError):
        completer.claim(worker_conn, POLICY, 2)
    assert completer.buffered == 2 and completer.take_outcomes() == []

    with db.connect(dsn) as fresh:
        completer.recover(fresh)
    assert _states(conn, [j.id for j in jobs]) == [pgq.JobState.SUCCEEDED] * 2
    assert [o.kind for o in completer.take_outcomes()] == [OutcomeKind.SUCCEEDED] * 2
    assert completer.buffered == 0 and heartbeat.holding() == 0


def test_successes_whose_lease_went_during_the_outage_are_dropped_to_run_again(
    conn: Conn, dsn: str, worker_conn: Conn, heartbeat: Heartbeat
) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t", {"n": n}) for n in range(2)])
    completer = Completer(S, WORKER, heartbeat=heartbeat)
    jobs = completer.claim(worker_conn, POLICY, 2)
    _run_all(completer, worker_conn, jobs)
    _cut(dsn)
    for job in jobs:  # the outage outlasted dead_after: the rescuer took them back
        age_heartbeat(conn, job.id, 120)
    assert len(db.rescue(conn, S, dead_after=30)) == 2
    before = [raw_row(conn, j.id) for j in jobs]

    with db.connect(dsn) as fresh:
        completer.recover(fresh)
    assert [raw_row(conn, j.id) for j in jobs] == before
    assert _states(conn, [j.id for j in jobs]) == [pgq.JobState.PENDING] * 2
    assert [o.kind for o in completer.take_outcomes()] == [OutcomeKind.LOST] * 2
    assert heartbeat.holding() == 0


def test_successes_that_cannot_be_written_are_forgotten_and_their_jobs_released_to_run_again(
    conn: Conn, dsn: str, worker_conn: Conn, heartbeat: Heartbeat
) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t", {"n": n}) for n in range(2)])
    completer = Completer(S, WORKER, heartbeat=heartbeat)
    jobs = completer.claim(worker_conn, POLICY, 2)
    _run_all(completer, worker_conn, jobs)
    _cut(dsn)
    completer.recover(worker_conn)  # still the broken connection: nothing can be written
    assert completer.buffered == 0 and completer.take_outcomes() == []
    # handed to the heartbeat, which holds them until its release lands: a child's beats keep
    # every job it owns alive (schema/0025), so a job merely dropped would stay running
    assert heartbeat.holding() == 2
    assert _states(conn, [j.id for j in jobs]) == [pgq.JobState.RUNNING] * 2
    assert heartbeat.release_unstarted() == 2  # what its thread does at its next wake-up
    assert heartbeat.holding() == 0
    for job in jobs:
        rec = get(conn, job.id)
        assert (rec.state, rec.current_retry_count, rec.attempts) == (pgq.JobState.PENDING, 0, [])


def test_jobs_not_started_go_back_without_an_attempt(
    conn: Conn, worker_conn: Conn, heartbeat: Heartbeat
) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t", {"n": n}) for n in range(3)])
    completer = Completer(S, WORKER, heartbeat=heartbeat)
    _, *rest = completer.claim(worker_conn, POLICY, 3)
    completer.release(worker_conn, rest)
    assert heartbeat.holding() == 1
    for job in rest:
        rec = get(conn, job.id)
        assert (rec.state, rec.current_retry_count, rec.attempts) == (pgq.JobState.PENDING, 0, [])


@pytest.fixture
def deferred_check(conn: Conn) -> Iterator[None]:
    conn.execute(
        "CREATE TABLE public.seat (n int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
        "; INSERT INTO public.seat VALUES (1)"
    )
    yield


@pytest.mark.usefixtures("deferred_check")
def test_a_commit_that_fails_is_the_jobs_failure_and_undoes_its_writes(
    conn: Conn, worker_conn: Conn
) -> None:
    registry = pgq.Registry()

    @registry.handler("book", max_retry_count=0)
    def book(payload: dict[str, int], conn: Conn) -> None:
        conn.execute("INSERT INTO public.seat VALUES (2), (%s)", (payload["seat"],))

    job_id = pgq.enqueue(conn, "book", {"seat": 1})  # taken: fails only at COMMIT
    completer = Completer(S, WORKER)
    (job,) = completer.claim(worker_conn, registry.claim_policy(["book"]), 1)
    ran = runs.run_in_transaction(Executor(registry, WORKER), job, S, nullcontext(worker_conn))
    completer.settle(worker_conn, ran)
    assert [o.kind for o in completer.take_outcomes()] == [OutcomeKind.FAILED]
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert rec.error_msg is not None and "UniqueViolation" in rec.error_msg
    assert conn.execute("SELECT n FROM public.seat").fetchall() == [(1,)]
