"""Bundle counters: every terminal transition counts once; completion fires once per completion."""

from __future__ import annotations

import threading

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, BundleId, JobId
from tests.support.db import (
    age_heartbeat,
    claim,
    claim_one,
    count_rows,
    get,
    in_threads,
    listening,
)

S = "pgq"
BUNDLE_STOPPED = "pgq_bundle_stopped"


def _counter(conn: Conn, bundle_id: BundleId) -> tuple[int, int]:
    """(num_jobs, num_jobs_stopped), after checking both against the bundle's actual jobs."""
    bundle = pgq.get_bundle(conn, bundle_id)
    row = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'cancelled'))"
        " FROM pgq.job WHERE bundle_id = %s",
        (bundle_id,),
    ).fetchone()
    assert row is not None
    assert (bundle.num_jobs, bundle.num_jobs_stopped) == (row[0], row[1]), "counter drifted"
    assert 0 <= bundle.num_jobs_stopped <= bundle.num_jobs
    return bundle.num_jobs, bundle.num_jobs_stopped


def _callbacks(conn: Conn, bundle_id: BundleId, type_: str = "after") -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgq.job WHERE type = %s AND payload = jsonb_build_object("
        "'bundle_id', %s::text)",
        (type_, str(bundle_id)),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _bundle(conn: Conn, types: list[str], on_complete: str | None = "after") -> pgq.Bundle:
    return pgq.enqueue_bundle(
        conn,
        "import",
        [pgq.NewJob(t, {"i": i}) for i, t in enumerate(types)],
        on_complete=on_complete,
    )


def test_enqueue_bundle_is_atomic_with_the_callers_transaction(conn: Conn) -> None:
    with conn.transaction(force_rollback=True):
        _bundle(conn, ["a", "b"])
    assert (count_rows(conn), count_rows(conn, "job_bundle")) == (0, 0)

    with pytest.raises(pgq.InvalidInput, match="invalid job type"):
        pgq.enqueue_bundle(conn, "import", [pgq.NewJob("a"), pgq.NewJob("")])
    assert (count_rows(conn), count_rows(conn, "job_bundle")) == (0, 0)

    bundle = _bundle(conn, ["a", "b", "c"])
    assert _counter(conn, bundle.id) == (3, 0)
    assert (bundle.type, bundle.on_complete, bundle.is_complete) == ("import", "after", False)


def test_each_terminal_transition_counts_once(conn: Conn, dsn: str) -> None:
    bundle = _bundle(conn, ["ok", "retry", "fail", "cancel"])
    with listening(dsn, BUNDLE_STOPPED) as listener:
        ok = claim_one(conn, "ok")
        assert db.succeed(conn, S, ok.lease, [(ok.id, None)]) == {ok.id}
        assert _counter(conn, bundle.id) == (4, 1)
        # a late duplicate completion is fenced and does not count again
        assert db.succeed(conn, S, ok.lease, [(ok.id, None)]) == set()
        assert _counter(conn, bundle.id) == (4, 1)

        retry = claim_one(conn, "retry")
        db.end_attempt(
            conn, S, [retry.id], error="again", kind=AttemptKind.ERROR, lease=retry.lease
        )
        assert get(conn, retry.id).state is pgq.JobState.PENDING
        assert _counter(conn, bundle.id) == (4, 1)  # a retry is not terminal

        fail = claim_one(conn, "fail", max_retry_count=0)
        db.end_attempt(conn, S, [fail.id], error="no", kind=AttemptKind.ERROR, lease=fail.lease)
        assert _counter(conn, bundle.id) == (4, 2)

        (cancel,) = (r[0] for r in conn.execute("SELECT id FROM pgq.job WHERE type = 'cancel'"))
        pgq.cancel_job(conn, cancel)
        assert _counter(conn, bundle.id) == (4, 3)
        assert listener.collect()[BUNDLE_STOPPED] == []
        assert _callbacks(conn, bundle.id) == 0

        retry = claim_one(conn, "retry")
        assert db.succeed(conn, S, retry.lease, [(retry.id, None)]) == {retry.id}
        assert _counter(conn, bundle.id) == (4, 4)
        assert listener.collect()[BUNDLE_STOPPED] == [str(bundle.id)]
    assert pgq.get_bundle(conn, bundle.id).is_complete
    assert _callbacks(conn, bundle.id) == 1
    (callback,) = conn.execute("SELECT origin, state FROM pgq.job WHERE type = 'after'")
    assert callback == ("bundle:import", "pending")


def test_rescue_to_failed_and_force_reset_keep_the_counter_true(conn: Conn) -> None:
    bundle = _bundle(conn, ["dies", "taken_back"], on_complete=None)
    dies = claim_one(conn, "dies", max_retry_count=0)
    age_heartbeat(conn, dies.id, 600)
    assert [e.new_state for e in db.rescue(conn, S, dead_after=30)] == [pgq.JobState.FAILED]
    assert _counter(conn, bundle.id) == (2, 1)

    taken = claim_one(conn, "taken_back")
    pgq.reset_job(conn, taken.id, force=True)  # running -> pending: neither side is terminal
    assert _counter(conn, bundle.id) == (2, 1)
    taken = claim_one(conn, "taken_back")
    db.succeed(conn, S, taken.lease, [(taken.id, None)])
    assert _counter(conn, bundle.id) == (2, 2)


def test_reset_decrements_and_a_new_completion_fires_again(conn: Conn, dsn: str) -> None:
    bundle = _bundle(conn, ["a", "b"])
    for job in claim(conn, ["a", "b"], limit=2):
        db.succeed(conn, S, job.lease, [(job.id, None)])
    assert _counter(conn, bundle.id) == (2, 2)
    assert _callbacks(conn, bundle.id) == 1
    (a_id,) = (JobId(r[0]) for r in conn.execute("SELECT id FROM pgq.job WHERE type = 'a'"))

    with listening(dsn, BUNDLE_STOPPED) as listener:
        pgq.reset_job(conn, a_id)
        assert _counter(conn, bundle.id) == (2, 1)
        assert not pgq.get_bundle(conn, bundle.id).is_complete
        assert listener.collect()[BUNDLE_STOPPED] == []

        pgq.cancel_job(conn, a_id)
        assert _counter(conn, bundle.id) == (2, 2)
        assert listener.collect()[BUNDLE_STOPPED] == [str(bundle.id)]
    # one callback per transition to complete
    assert _callbacks(conn, bundle.id) == 2


def test_deleting_bundled_jobs_keeps_the_counter_true(conn: Conn, dsn: str) -> None:
    bundle = _bundle(conn, ["a", "b", "c"])
    job = claim_one(conn, "a")
    db.succeed(conn, S, job.lease, [(job.id, None)])
    assert _counter(conn, bundle.id) == (3, 1)

    # a purge of finished jobs takes the terminal job out of both sides of the counter
    conn.execute(
        "UPDATE pgq.job SET stopped_at = now() - interval '2 days' WHERE id = %s", [job.id]
    )
    assert pgq.delete_finished(conn, older_than=86_400) == 1
    assert _counter(conn, bundle.id) == (2, 0)

    job = claim_one(conn, "b")
    db.succeed(conn, S, job.lease, [(job.id, None)])
    assert _counter(conn, bundle.id) == (2, 1)
    with listening(dsn, BUNDLE_STOPPED) as listener:
        # deleting the last unfinished job leaves a bundle whose every job has stopped
        conn.execute("DELETE FROM pgq.job WHERE type = 'c'")
        assert _counter(conn, bundle.id) == (1, 1)
        assert listener.collect()[BUNDLE_STOPPED] == [str(bundle.id)]
    assert _callbacks(conn, bundle.id) == 1

    # deleting a job of a bundle that is already complete does not complete it again
    conn.execute("DELETE FROM pgq.job WHERE type = 'b'")
    assert _counter(conn, bundle.id) == (0, 0)
    assert _callbacks(conn, bundle.id) == 1


def test_deleting_the_bundle_deletes_its_jobs(conn: Conn) -> None:
    bundle = _bundle(conn, ["a", "b"])
    job = claim_one(conn, "a")
    db.succeed(conn, S, job.lease, [(job.id, None)])
    conn.execute("DELETE FROM pgq.job_bundle WHERE id = %s", [bundle.id])
    assert count_rows(conn) == 0


def test_concurrent_completions_all_count_and_complete_once(conn: Conn, dsn: str) -> None:
    bundle = _bundle(conn, ["part"] * 50)
    all_claimed = threading.Barrier(8)

    def worker(n: int) -> int:
        with psycopg.connect(dsn, autocommit=True) as own:
            mine: list[list[pgq.Job]] = []
            while jobs := claim(own, ["part"], worker_id=f"w{n}", limit=1 + n % 3):
                mine.append(jobs)
            # every thread completes its jobs at the same moment, racing on the bundle row
            all_claimed.wait(timeout=30)
            done = 0
            for jobs in mine:
                held = db.succeed(own, S, jobs[0].lease, [(j.id, None) for j in jobs])
                assert held == {j.id for j in jobs}
                done += len(held)
        return done

    with listening(dsn, BUNDLE_STOPPED) as listener:
        assert sum(in_threads(8, worker)) == 50
        assert listener.collect()[BUNDLE_STOPPED] == [str(bundle.id)]
    assert _counter(conn, bundle.id) == (50, 50)
    assert _callbacks(conn, bundle.id) == 1
