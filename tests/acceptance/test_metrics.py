"""/metrics, /healthz and /readyz of a real supervisor, scraped during and after a run, with
the values checked against the database."""

from __future__ import annotations

import re
from datetime import timedelta

import pgq_supervisor as pgq
from pgq_supervisor import db as pgq_db
from tests.acceptance.conftest import Conn
from tests.acceptance.scrape import Samples, free_port, get, metric, scrape
from tests.support.processes import APP, FAST, Supervisor, count
from tests.support.waiting import wait_for


def idle_children(sup: Supervisor) -> int:
    titles = [title for _, title in sup.descendants()]
    return sum(1 for title in titles if re.match(r"pgq-worker\[\d+\] idle", title))


def scalar(conn: Conn, query: str, *params: object) -> float:
    row = conn.execute(query.encode(), params).fetchone()
    assert row is not None and row[0] is not None
    return float(str(row[0]))


def test_metrics_match_the_database_during_and_after_a_run(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    # not served by this supervisor (--types): stays ready, so its age keeps growing
    pgq.enqueue_many(db, [pgq.NewJob("noop") for _ in range(4)])
    db.execute("UPDATE pgq.job SET start_at = now() - interval '30 seconds'")
    in_an_hour = pgq_db.db_now(db, "pgq") + timedelta(hours=1)
    pgq.enqueue_many(db, [pgq.NewJob("record", start_at=in_an_hour) for _ in range(7)])
    port = free_port()
    types = "record,poison,sleep"
    sup = Supervisor(dsn, APP, "--procs", "2", "--types", types, "--metrics-port", str(port), *FAST)
    sups.append(sup)

    def ready() -> bool:
        assert sup.proc.poll() is None, f"supervisor exited early:\n{sup.log()}"
        try:
            return get(port, "/readyz") == (200, "ready\n")
        except OSError:
            return False  # not listening yet

    wait_for("/readyz 200", ready, timeout=30)
    # wake latency is measured from a wake-up to the claim it causes: start from idle children
    wait_for("two idle children", lambda: idle_children(sup) == 2, timeout=30)
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/nowhere")[0] == 404

    # During the run. Both children busy with a slow job each, so what is enqueued next
    # waits: the gauges must show exactly what the database holds.
    pgq.enqueue_many(db, [pgq.NewJob("sleep", {"seconds": 5.0}) for _ in range(2)])
    wait_for("both slow jobs running", lambda: count(dsn, "state = 'running'") == 2, timeout=15)
    pgq.enqueue_many(db, [pgq.NewJob("record", {"n": i}) for i in range(300)])
    bad = pgq.enqueue_many(db, [pgq.NewJob("record", {"n": "not a number"}) for _ in range(5)])

    def gauges_during() -> Samples | None:
        s = scrape(port)
        ok = (
            metric(s, "pgq_jobs_running", type="sleep") == 2
            and metric(s, "pgq_jobs_ready", type="record") == 305
            and metric(s, "pgq_jobs_delayed", type="record") == 7
            and metric(s, "pgq_jobs_ready", type="noop") == 4
            and metric(s, "pgq_queue_depth") == 305 + 4
            # noop: no live supervisor serves it (issue 36); record, served, is not named
            and metric(s, "pgq_unserved_jobs", type="noop") == 4
            and not metric(s, "pgq_unserved_jobs", type="record")
            and metric(s, "pgq_children") == 2
        )
        return s if ok else None

    s = wait_for("queue gauges while both children are busy", gauges_during, timeout=3.5)
    assert count(dsn, "type = 'sleep' AND state = 'running'") == 2
    assert count(dsn, "type = 'record' AND state = 'pending' AND start_at <= now()") == 305
    assert count(dsn, "type = 'record' AND state = 'pending' AND start_at > now()") == 7
    assert count(dsn, "type = 'noop' AND state = 'pending' AND start_at <= now()") == 4
    oldest = metric(s, "pgq_oldest_ready_age_seconds", type="noop")
    db_oldest = scalar(
        db, "SELECT extract(epoch FROM now() - min(start_at)) FROM pgq.job WHERE type = 'noop'"
    )
    assert oldest is not None and 30 <= oldest <= db_oldest

    # After the run: the counters equal what the database says happened.
    wait_for(
        "the batch finished",
        lambda: count(dsn, "state IN ('succeeded', 'failed')") == 307,
        timeout=30,
    )
    succeeded = count(dsn, "type = 'record' AND state = 'succeeded'")
    failed = count(dsn, "type = 'record' AND state = 'failed'")
    assert (succeeded, failed) == (300, 5)
    assert {r[0] for r in db.execute("SELECT id FROM pgq.job WHERE state = 'failed'")} == set(bad)

    def counters_after() -> Samples | None:
        s = scrape(port)
        ok = (
            metric(s, "pgq_jobs_total", type="record", outcome="succeeded") == succeeded
            and metric(s, "pgq_jobs_total", type="record", outcome="failed") == failed
            and metric(s, "pgq_jobs_total", type="sleep", outcome="succeeded") == 2
            and metric(s, "pgq_jobs_ready", type="record") == 0
            and metric(s, "pgq_jobs_running", type="sleep") == 0
        )
        return s if ok else None

    s = wait_for("counters equal to the database", counters_after, timeout=15)
    assert metric(s, "pgq_jobs_total", type="record", outcome="retried") is None
    assert metric(s, "pgq_job_duration_seconds_count", type="record") == succeeded + failed
    sleep_seconds = metric(s, "pgq_job_duration_seconds_sum", type="sleep")
    assert sleep_seconds is not None and 10.0 <= sleep_seconds < 12.0
    assert (metric(s, "pgq_wake_latency_seconds_count") or 0) > 0
    assert metric(s, "pgq_worker_deaths_total", type="poison") is None
    assert metric(s, "pgq_child_restarts_total") == 0
    assert metric(s, "pgq_jobs_delayed", type="record") == 7

    # Worker deaths: every attempt of a poison job kills its child, which is respawned.
    poison = pgq.enqueue(db, "poison", {})
    wait_for("poison failed", lambda: count(dsn, "type = 'poison' AND state = 'failed'") == 1)
    attempts = scalar(db, "SELECT jsonb_array_length(attempts) FROM pgq.job WHERE id = %s", poison)
    assert attempts == 3  # max_retry_count=2

    def deaths_counted() -> Samples | None:
        s = scrape(port)
        ok = (
            metric(s, "pgq_worker_deaths_total", type="poison") == attempts
            and metric(s, "pgq_children") == 2
        )
        return s if ok else None

    s = wait_for("deaths counted, children respawned", deaths_counted, timeout=15)
    assert metric(s, "pgq_child_restarts_total") == attempts
    assert metric(s, "pgq_job_timeouts_total", type="poison") is None
    assert metric(s, "pgq_jobs_total", type="record", outcome="succeeded") == succeeded
    assert metric(s, "pgq_jobs_rescued_total") == 0
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/readyz") == (200, "ready\n")
    assert sup.stop() == 0
