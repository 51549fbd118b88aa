"""Delayed jobs start when they come due, whoever wrote them (schema/0026, issue 40 item 2):
a retry's backoff and a snooze written by a child, and a job enqueued with a start_at, under
the real CLI with a poll interval of an hour, so that nothing but the pgq_job_due
notification can wake its idle child in time."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.processes import Supervisor
from tests.support.waiting import wait_for

APP = "pgq_semantics_app:registry"
NO_POLL = ("--poll-interval", "3600", "--heartbeat-interval", "0.5", "--dead-after", "2")


def _finished(db: Conn) -> bool:
    row = db.execute("SELECT count(*) FROM pgq.job WHERE state IN ('pending', 'running')")
    found = row.fetchone()
    return found is not None and found[0] == 0


def _ran_at(db: Conn, job_id: pgq.JobId) -> tuple[str, float, int]:
    row = db.execute(
        "SELECT state, (result ->> 'ran_at')::float8, jsonb_array_length(attempts)"
        " FROM pgq.job WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return str(row[0]), float(str(row[1] or 0)), int(str(row[2]))


def test_retries_snoozes_and_delayed_enqueues_start_without_a_poll(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sups.append(sup := Supervisor(dsn, APP, "--procs", "1", *NO_POLL))
    sup.wait_ready(1)
    # the child has looked once, found nothing and idles: only a wake-up brings it back
    flaky = pgq.enqueue(db, "flaky")
    wait_for("the first attempt failed", lambda: _ran_at(db, flaky)[2] == 1, timeout=30)
    until = time.time() + 1.0
    snoozing = pgq.enqueue(db, "wait_sync", {"until": until, "every": 0.3})
    start_at = datetime.now(UTC) + timedelta(seconds=0.5)
    later = pgq.enqueue(db, "later", start_at=start_at)

    wait_for("every delayed job ran", lambda: _finished(db), timeout=30)

    assert _ran_at(db, flaky)[0] == "succeeded"  # its retry, 0.3 s after the failure
    state, ran_at, _ = _ran_at(db, snoozing)
    assert state == "succeeded" and ran_at >= until
    state, ran_at, _ = _ran_at(db, later)
    assert state == "succeeded" and ran_at >= start_at.timestamp()
    assert sup.stop() == 0, sup.log()[-2000:]
