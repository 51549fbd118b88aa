"""A partition is never dropped with a job in it that is still to run (schema/0029).

Each example fills the oldest partition of a fresh database with a generated mix of jobs
(still to run in each way a job can be: ready, delayed, with a tenant, running, waiting on a
dependency or on its ordered key, retrying; finished and past their window; finished and still
within it), runs a round of partition maintenance, and checks: the partition is dropped exactly
when no job in it is still to run; every job still to run, and every finished job still within
its window, is there afterwards, row for row, with its id; the jobs past their window are gone
only with the partition; the queue's invariants hold.
"""

from __future__ import annotations

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobId
from pgq_supervisor.supervisor.maintenance.partitions import Partitions
from tests.conftest import _Copies, _migrated_copy
from tests.property.invariants import violations
from tests.support.db import claim_one, raw_row
from tests.support.partitions import (
    STILL_TO_RUN,
    made_days_ago,
    partition,
    partitions,
    still_to_run,
)

FINISHED = ("succeeded", "failed", "cancelled", "failed_long_ago")
WEEK = 7 * 86400.0


def _finished(conn: Conn, kind: str) -> tuple[JobId, bool]:
    """A finished job of `kind`, and whether it is still within its window (kept a week)."""
    job_id = pgq.enqueue(conn, kind, {}, max_retry_count=0)
    if kind == "cancelled":
        db.cancel(conn, "pgq", job_id)
        return job_id, True
    job = claim_one(conn, kind, max_retry_count=0)
    if kind == "succeeded":
        db.succeed(conn, "pgq", job.lease, [(job_id, None)])
        return job_id, False
    db.end_attempt(conn, "pgq", [job_id], error="boom", kind=AttemptKind.ERROR, lease=job.lease)
    if kind == "failed_long_ago":
        conn.execute(
            "UPDATE pgq.job SET stopped_at = now() - interval '8 days' WHERE id = %s", (job_id,)
        )
        return job_id, False
    return job_id, True


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(kinds=st.lists(st.sampled_from(STILL_TO_RUN + FINISHED), min_size=1, max_size=6))
def test_a_partition_is_dropped_only_when_no_job_in_it_is_still_to_run(
    _copies: _Copies, kinds: list[str]
) -> None:
    with _migrated_copy(_copies) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        assert partition(conn)
        first = pgq.enqueue(conn, "blocker", {}, ordered_key="k")  # made now: elsewhere
        kept: list[JobId] = []
        past: list[JobId] = []
        with made_days_ago():
            for kind in kinds:
                if kind in STILL_TO_RUN:
                    held, done = still_to_run(conn, kind, first)
                    kept.append(held)
                    past.append(done)
                else:
                    job_id, within = _finished(conn, kind)
                    (kept if within else past).append(job_id)
        rows = {job_id: raw_row(conn, job_id) for job_id in kept}
        to_run = any(kind in STILL_TO_RUN for kind in kinds)

        result = Partitions("pgq", 3600.0, 0.001, WEEK).run_once(conn)

        assert ("job_legacy" in partitions(conn)) == to_run, result
        assert {job_id: raw_row(conn, job_id) for job_id in kept} == rows
        # past their window: gone with the partition, or all still there (never row by row)
        present = conn.execute("SELECT count(*) FROM pgq.job WHERE id = ANY(%s)", (past,))
        assert present.fetchone() == ((len(past) if to_run else 0),)
        assert violations(conn) == []
