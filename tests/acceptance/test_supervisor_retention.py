"""Retention inside a running supervisor: finished jobs past their window disappear, recent
ones and unfinished ones stay, and /metrics counts what was pruned."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import pgq_supervisor as pgq
from tests.acceptance.apps.pgq_test_app import EFFECTS_DDL
from tests.acceptance.conftest import Conn
from tests.acceptance.scrape import free_port, get, metric, scrape
from tests.support.processes import APP, FAST, Supervisor, count
from tests.support.waiting import wait_for

# with the ids they were made with (time-ordered, schema/0012): older than the database, in the
# partition the migration made of the table as it was, which the pruner deletes row by row
# (schema/0029: the newer partitions leave whole)
FINISHED = """
INSERT INTO pgq.job (id, type, payload, state, max_retry_count, started_at, stopped_at, error_msg)
SELECT encode(overlay(uuid_send(gen_random_uuid())
                      PLACING substring(uuid_send(pgq.id_floor(now() - %(age)s::interval))
                                        FROM 1 FOR 6)
                      FROM 1 FOR 6), 'hex')::uuid,
       'old', '{}', %(state)s::pgq.job_state, 0,
       CASE WHEN %(state)s::text = 'cancelled' THEN NULL ELSE now() - %(age)s::interval END,
       now() - %(age)s::interval,
       CASE WHEN %(state)s::text = 'failed' THEN 'boom' END
FROM generate_series(1, %(n)s)
"""


@pytest.fixture
def db(dsn: str) -> Iterator[Conn]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
        yield conn


def finished(db: Conn, state: str, n: int, age: str) -> None:
    db.execute(FINISHED, {"state": state, "n": n, "age": age})


def test_the_supervisor_prunes_finished_jobs_past_their_window(dsn: str, db: Conn) -> None:
    finished(db, "succeeded", 50, "2 days")  # past retain_succeeded
    finished(db, "succeeded", 5, "1 hour")
    finished(db, "failed", 20, "40 days")  # past retain_failed
    finished(db, "cancelled", 10, "40 days")
    finished(db, "failed", 3, "2 days")  # within retain_failed
    pgq.enqueue(db, "noop", {})  # not served: stays pending
    assert count(dsn) == 89

    port = free_port()
    sup = Supervisor(
        dsn,
        APP,
        "--procs", "1",
        "--types", "record",
        "--retain-succeeded", "1d",
        "--retain-failed", "30d",
        "--metrics-port", str(port),
        *FAST,
    )  # fmt: skip
    try:
        wait_for("old jobs pruned", lambda: count(dsn) == 89 - 80, timeout=30)
        assert count(dsn, "state = 'succeeded' AND stopped_at > now() - interval '1 day'") == 5
        assert count(dsn, "state = 'failed'") == 3
        assert count(dsn, "state = 'pending' AND type = 'noop'") == 1

        def pruned(state: str) -> float | None:
            return metric(scrape(port), "pgq_jobs_pruned_total", state=state)

        # failed and cancelled jobs share retain_failed, and its counter
        wait_for("pruned counters", lambda: (pruned("succeeded"), pruned("failed")) == (50, 30))

        # a job finished now is kept: the next round is a minute away, and it is too young
        job_id = pgq.enqueue(db, "record", {"n": 1})
        wait_for("record job done", lambda: pgq.get_job(db, job_id).state.is_terminal)
        assert pgq.get_job(db, job_id).state is pgq.JobState.SUCCEEDED
        assert get(port, "/readyz") == (200, "ready\n")
        assert sup.stop() == 0
    finally:
        sup.close()
