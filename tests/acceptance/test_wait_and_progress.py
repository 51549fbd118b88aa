"""Under a real supervisor: a handler's progress shows in get_job while it runs (inside its own
transaction), a waiter follows it and gets the result, and `show` prints the job."""

from __future__ import annotations

import threading

import psycopg

import pgq_supervisor as pgq
from tests.acceptance.apps.pgq_test_app import GATES_DDL
from tests.acceptance.conftest import Conn
from tests.support.processes import APP, FAST, Supervisor, run_cli
from tests.support.waiting import wait_for


def test_progress_shows_while_the_job_runs_and_the_waiter_gets_the_result(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    db.execute(GATES_DDL)
    sup = Supervisor(dsn, APP, "--procs", "1", *FAST)
    sups.append(sup)
    sup.wait_ready(1)
    job_id = pgq.enqueue(db, "steps", {"n": 3})

    seen: list[pgq.JobRecord] = []
    outcome: list[pgq.JobRecord] = []

    def waiter() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            outcome.append(pgq.wait(conn, job_id, timeout=60, on_progress=seen.append))

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    for step in (1, 2, 3):
        expected: pgq.jobs.JsonValue = {"fraction": step / 3, "step": step}

        def reached(expected: pgq.jobs.JsonValue = expected) -> pgq.JobRecord | None:
            record = pgq.get_job(db, job_id)
            return record if record.progress == expected else None

        record = wait_for(f"progress of step {step}", reached)
        assert record.state is pgq.JobState.RUNNING
        db.execute("INSERT INTO gates (job_id, step) VALUES (%s, %s)", (job_id, step))

    thread.join(60)
    assert not thread.is_alive()
    (record,) = outcome
    assert record.state is pgq.JobState.SUCCEEDED and record.result == {"steps": 3}
    steps = [p["step"] for p in (r.progress for r in seen) if isinstance(p, dict)]
    assert all(isinstance(s, int) for s in steps)
    assert steps and steps == sorted(steps, key=str), steps

    shown = run_cli(["show", str(job_id)], dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    assert "succeeded" in shown.stdout and "100%" in shown.stdout
    assert sup.stop() == 0
