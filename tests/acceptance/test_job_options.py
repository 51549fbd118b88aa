"""The job options of docs/job-options.md through the real CLI, under two supervisors at once:
snoozes in the one-at-a-time loop and in the in-flight loop (sync handlers in its threads,
async ones on its event loop), a debounced job behind a running one, priority aging."""

from __future__ import annotations

import itertools
import threading
import time

import psycopg
import pytest

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.processes import FAST, Supervisor, count
from tests.support.waiting import wait_for

APP = "pgq_semantics_app:registry"


def _history(db: Conn, state: str) -> list[tuple[str, int, list[str], float]]:
    rows = db.execute(
        "SELECT type, current_retry_count,"
        " ARRAY(SELECT a ->> 'kind' FROM jsonb_array_elements(attempts) a),"
        " (result ->> 'ran_at')::float8 FROM pgq.job WHERE state = %s ORDER BY type",
        (state,),
    ).fetchall()
    out = []
    for type_, retries, kinds, ran_at in rows:
        assert isinstance(retries, int) and isinstance(kinds, list)
        out.append((str(type_), retries, [str(k) for k in kinds], float(str(ran_at or 0))))
    return out


@pytest.mark.parametrize("concurrency", ["1", "8"], ids=["sync-loop", "inflight-loop"])
def test_snoozed_jobs_come_back_after_their_delay_without_using_an_attempt(
    dsn: str, db: Conn, sups: list[Supervisor], concurrency: str
) -> None:
    for _ in range(2):
        sups.append(Supervisor(dsn, APP, "--procs", "1", "--concurrency", concurrency, *FAST))
    for sup in sups:
        sup.wait_ready(1)
    until = time.time() + 1.5
    jobs = [pgq.NewJob(t, {"until": until}) for t in ("wait_sync", "wait_async") for _ in range(3)]
    pgq.enqueue_many(db, [*jobs, pgq.NewJob("never_ready", {})])

    def settled() -> bool:
        row = db.execute("SELECT count(*) FROM pgq.job WHERE state IN ('pending', 'running')")
        found = row.fetchone()
        return found is not None and found[0] == 0

    wait_for("every job settled", settled, timeout=60)
    done = _history(db, "succeeded")
    assert len(done) == 6
    for type_, retries, kinds, ran_at in done:
        # max_retry_count=0: had a snooze used an attempt, the job would have failed
        assert retries == 0, type_
        assert kinds and set(kinds) == {"snoozed"}, (type_, kinds)
        assert ran_at >= until, type_
    [(type_, retries, kinds, _)] = _history(db, "failed")
    assert (type_, retries, kinds) == ("never_ready", 0, ["snoozed", "snoozed", "permanent"])
    error = db.execute("SELECT error_msg FROM pgq.job WHERE state = 'failed'").fetchone()
    assert error is not None and "max_snoozes=2" in str(error[0])
    for sup in sups:
        assert sup.stop() == 0, sup.log()[-2000:]


def test_a_debounced_job_waits_behind_the_running_one_and_runs_the_last_payload(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    for _ in range(2):
        sups.append(Supervisor(dsn, APP, "--procs", "2", *FAST))
    for sup in sups:
        sup.wait_ready(2)
    first = pgq.enqueue(db, "reindex", {"version": 1}, unique_key="shop", replace=True)

    def running() -> bool:
        row = db.execute("SELECT state::text FROM pgq.job WHERE id = %s", (first,)).fetchone()
        return row is not None and row[0] == "running"

    wait_for("the first job running", running, timeout=30)
    later = [
        pgq.enqueue(db, "reindex", {"version": v, "seconds": 0.1}, unique_key="shop", replace=True)
        for v in (2, 3, 4)
    ]
    assert len(set(later)) == 1 and later[0] != first  # one job waits, with the last payload

    def results() -> list[dict[str, float]] | None:
        rows = db.execute(
            "SELECT result FROM pgq.job WHERE state = 'succeeded' ORDER BY started_at"
        ).fetchall()
        return [r[0] for r in rows] if len(rows) == 2 else None  # type: ignore[misc]

    done = wait_for("both jobs succeeded", results, timeout=60)
    assert [r["version"] for r in done] == [1, 4]
    assert done[1]["start"] >= done[0]["end"], "the waiting job ran while the first still ran"
    assert db.execute("SELECT count(*) FROM pgq.job").fetchone() == (2,)
    for sup in sups:
        assert sup.stop() == 0, sup.log()[-2000:]


def test_an_aged_low_priority_job_runs_through_a_steady_high_priority_stream(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    """A producer keeps priority-3 jobs waiting (faster than one child runs them); the
    priority-0 job of a type with aging rises and runs, the one of a type without starves."""
    sup = Supervisor(dsn, APP, "--procs", "1", *FAST)
    sups.append(sup)
    sup.wait_ready(1)
    stop = threading.Event()

    def produce() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                pgq.enqueue_many(conn, [pgq.NewJob("busy", priority=3) for _ in range(10)])
                stop.wait(0.1)  # 100 jobs/s: more than one child runs at 20 ms each

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for("a backlog", lambda: count(dsn, "type = 'busy' AND state = 'pending'") > 20)
        low = pgq.enqueue(db, "aged", priority=0)
        starved = pgq.enqueue(db, "unaged", priority=0)
        wait_for(
            "the aged job succeeded",
            lambda: pgq.get_job(db, low).state is pgq.JobState.SUCCEEDED,
            timeout=60,
        )
        assert count(dsn, "type = 'busy' AND state = 'pending'") > 0, "the stream ran dry"
        assert pgq.get_job(db, starved).state is pgq.JobState.PENDING
        assert pgq.get_job(db, low).priority >= 3  # level with the stream: older, so first
    finally:
        stop.set()
        producer.join(timeout=30)
    assert sup.stop() == 0, sup.log()[-2000:]


def test_the_jobs_of_an_ordered_key_run_one_at_a_time_across_supervisors(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    for _ in range(2):
        sups.append(Supervisor(dsn, APP, "--procs", "2", "--concurrency", "4", *FAST))
    for sup in sups:
        sup.wait_ready(2)
    jobs = [pgq.NewJob("in_order", {"n": n}, ordered_key=f"acct-{n % 3}") for n in range(24)]
    jobs += [pgq.NewJob("in_order", {"n": 100 + n}) for n in range(12)]  # free: in parallel
    pgq.enqueue_many(db, jobs)
    wait_for("all succeeded", lambda: count(dsn, "state = 'succeeded'") == 36, timeout=60)
    for k in range(3):
        rows = db.execute(
            "SELECT (payload ->> 'n')::int, (result ->> 'start')::float8,"
            " (result ->> 'end')::float8 FROM pgq.job WHERE ordered_key = %s"
            " ORDER BY (result ->> 'start')::float8",
            (f"acct-{k}",),
        ).fetchall()
        assert [r[0] for r in rows] == list(range(k, 24, 3)), "out of enqueue order"
        spans = [(r[0], float(str(r[1])), float(str(r[2]))) for r in rows]
        for before, after in itertools.pairwise(spans):
            assert after[1] >= before[2], f"acct-{k}: {after[0]} started before {before[0]} ended"
    for sup in sups:
        assert sup.stop() == 0, sup.log()[-2000:]
