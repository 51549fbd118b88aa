"""What the dashboard (pgq_supervisor.web) reads beyond the admin statements: a page of jobs by
keyset, a job's dependencies and dependents, bundles, throughput; and the one job delete."""

from __future__ import annotations

from datetime import datetime

from psycopg.rows import scalar_row

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.params import (
    IdLimitParams,
    IdParams,
    JobsPageParams,
    LimitParams,
    MinutesParams,
)
from pgq_supervisor.jobs import JobId, JobState


def jobs_page(
    conn: Conn,
    schema: str,
    *,
    state: JobState | None = None,
    type_: str | None = None,
    unique_key: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before: tuple[datetime, JobId] | None = None,
    limit: int = 50,
) -> list[rows.JobListed]:
    """Up to `limit` jobs, newest first (created_at, then id), after the keyset `before`
    (the last row of the previous page); every filter None for none."""
    params: JobsPageParams = {
        "state": None if state is None else state.value,
        "type": type_,
        "unique_key": unique_key,
        "since": since,
        "until": until,
        "before_at": None if before is None else before[0],
        "before_id": None if before is None else before[1],
        "limit": limit,
    }
    with wrapped(), cursor(conn, rows.JOB_LISTED) as cur:
        return cur.execute(statement("jobs_page", schema), params).fetchall()


def job_dependencies(conn: Conn, schema: str, job_id: JobId) -> list[rows.JobLink]:
    params: IdParams = {"id": job_id}
    with wrapped(), cursor(conn, rows.JOB_LINK) as cur:
        return cur.execute(statement("job_dependencies", schema), params).fetchall()


def job_dependents(conn: Conn, schema: str, job_id: JobId, limit: int) -> list[rows.JobLink]:
    params: IdLimitParams = {"id": job_id, "limit": limit}
    with wrapped(), cursor(conn, rows.JOB_LINK) as cur:
        return cur.execute(statement("job_dependents", schema), params).fetchall()


def bundles_page(conn: Conn, schema: str, limit: int) -> list[rows.BundleListed]:
    params: LimitParams = {"limit": limit}
    with wrapped(), cursor(conn, rows.BUNDLE_LISTED) as cur:
        return cur.execute(statement("bundles_page", schema), params).fetchall()


def throughput(conn: Conn, schema: str, minutes: int) -> list[rows.ThroughputMinute]:
    """Succeeded and failed jobs per minute over the last `minutes` (the current one too);
    minutes without any are missing."""
    params: MinutesParams = {"minutes": minutes}
    with wrapped(), cursor(conn, rows.THROUGHPUT_MINUTE) as cur:
        return cur.execute(statement("throughput", schema), params).fetchall()


def delete_job(conn: Conn, schema: str, job_id: JobId) -> bool:
    """Delete one finished job; False when it is unknown or not finished (nothing changes)."""
    params: IdParams = {"id": job_id}
    with wrapped(), cursor(conn, scalar_row) as cur:
        return cur.execute(statement("delete_job", schema), params).fetchone() is not None


DASHBOARD_INDEXES = ("job_created_idx", "job_type_created_idx")


def create_dashboard_indexes(conn: Conn, schema: str) -> None:
    """The Jobs page's opt-in indexes (schema/0010), built CONCURRENTLY; kept if they exist.
    `conn` must be in autocommit mode (CONCURRENTLY cannot run in a transaction)."""
    with wrapped():
        conn.execute(statement("dashboard_index_created", schema))
        conn.execute(statement("dashboard_index_type_created", schema))
