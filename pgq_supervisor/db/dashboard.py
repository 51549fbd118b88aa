"""What the dashboard (pgq_supervisor.web) reads beyond the admin statements: a page of jobs by
keyset, a job's dependencies and dependents, bundles, throughput and run times, the types to
filter by; and what only it writes: a job's delete, a schedule's pause, resume and run now."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import LiteralString

from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.rows import scalar_row, tuple_row

from pgq_supervisor.db import web_rows as rows
from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.params import IdParams, NoParams, TypeParams, id_floor, new_id
from pgq_supervisor.db.rows import JOB_RECORD
from pgq_supervisor.errors import DatabaseError, JobNotFound
from pgq_supervisor.jobs import Bundle, BundleId, JobId, JobRecord, JobState


class SearchTimedOut(DatabaseError):
    """A bounded search (jobs_page's time_limit) ran out of time; nothing was changed."""


# how long after the transaction that completed a bundle began its completion job may be
# enqueued (the trigger runs when the last member stops, within that transaction)
COMPLETION_WINDOW = timedelta(minutes=1)


def jobs_page(
    conn: Conn,
    schema: str,
    *,
    state: JobState | None = None,
    type_: str | None = None,
    unique_key: str | None = None,
    payload: str | None = None,
    bundle_id: BundleId | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before: tuple[datetime, JobId] | None = None,
    limit: int = 50,
    time_limit: float | None = None,
) -> list[rows.JobListed]:
    """Up to `limit` jobs, newest first (created_at, then id), after the keyset `before`
    (the last row of the previous page); every filter None for none. `payload`: JSON text of
    an object the payload must contain (jsonb @>). `time_limit`: seconds the statement may
    take, else SearchTimedOut (it runs in a transaction of its own, or a savepoint)."""
    params: rows.JobsPageParams = {
        "state": None if state is None else state.value,
        "type": type_,
        "unique_key": unique_key,
        "payload": payload,
        "bundle_id": bundle_id,
        "since": since,
        "until": until,
        "before_at": None if before is None else before[0],
        "before_id": None if before is None else before[1],
        "limit": limit,
    }
    if time_limit is None:
        with wrapped(), cursor(conn, rows.JOB_LISTED) as cur:
            return cur.execute(statement("jobs_page", schema), params).fetchall()
    limit_params: rows.TimeLimitParams = {"ms": str(max(1, round(time_limit * 1000)))}
    with wrapped(), conn.transaction(), cursor(conn, rows.JOB_LISTED) as cur:
        conn.execute(statement("statement_time_limit", schema), limit_params)
        try:
            return cur.execute(statement("jobs_page", schema), params).fetchall()
        except pg_errors.QueryCanceled as exc:
            raise SearchTimedOut(f"the search took over {time_limit:g} s") from exc


def job_page_record(conn: Conn, schema: str, job_id: JobId, inline: int) -> JobRecord:
    """get_job, its payload and result None when stored in more than `inline` bytes (read
    their start with job_body_head); JobNotFound if no job has the id."""
    params: rows.JobPageParams = {"id": job_id, "inline": inline}
    with wrapped(), cursor(conn, JOB_RECORD) as cur:
        job = cur.execute(statement("job_page_record", schema), params).fetchone()
    if job is None:
        raise JobNotFound(f"no job with id {job_id}")
    return job


@dataclass(frozen=True, slots=True)
class BodyHead:
    """The start of a job's payload and result as JSON text, and the whole's size in bytes
    (result None: the job has none), as of its updated_at."""

    payload: str
    payload_bytes: int
    result: str | None
    result_bytes: int | None
    updated_at: datetime


def job_body_head(conn: Conn, schema: str, job_id: JobId, chars: int) -> BodyHead | None:
    """The first `chars` characters of the job's payload and result; None if it is gone."""
    params: rows.BodyHeadParams = {"id": job_id, "chars": chars}
    with wrapped(), cursor(conn, tuple_row) as cur:
        row = cur.execute(statement("job_body_head", schema), params).fetchone()
    if row is None:
        return None
    payload, payload_bytes, result, result_bytes, updated_at = row
    assert isinstance(updated_at, datetime)
    return BodyHead(
        str(payload),
        int(payload_bytes),
        None if result is None else str(result),
        None if result_bytes is None else int(result_bytes),
        updated_at,
    )


def job_body(conn: Conn, schema: str, job_id: JobId, part: str) -> str | None:
    """The job's payload or result (`part`) whole, as JSON text; None if the job is gone or
    has no result. JobNotFound if no job has the id."""
    params: rows.BodyParams = {"id": job_id, "part": part}
    with wrapped(), cursor(conn, tuple_row) as cur:
        row = cur.execute(statement("job_body", schema), params).fetchone()
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    return None if row[0] is None else str(row[0])


def job_dependencies(conn: Conn, schema: str, job_id: JobId) -> list[rows.JobLink]:
    params: IdParams = {"id": job_id}
    with wrapped(), cursor(conn, rows.JOB_LINK) as cur:
        return cur.execute(statement("job_dependencies", schema), params).fetchall()


def job_dependents(conn: Conn, schema: str, job_id: JobId, limit: int) -> list[rows.JobLink]:
    params: rows.IdLimitParams = {"id": job_id, "limit": limit}
    with wrapped(), cursor(conn, rows.JOB_LINK) as cur:
        return cur.execute(statement("job_dependents", schema), params).fetchall()


def bundles_page(conn: Conn, schema: str, limit: int) -> list[rows.BundleListed]:
    params: rows.BundlesPageParams = {
        "limit": limit, "window": COMPLETION_WINDOW.total_seconds(),
    }  # fmt: skip
    with wrapped(), cursor(conn, rows.BUNDLE_LISTED) as cur:
        return cur.execute(statement("bundles_page", schema), params).fetchall()


def bundle_completion(conn: Conn, schema: str, bundle: Bundle) -> rows.JobLink | None:
    """The job `bundle.on_complete` enqueued for it once it completed (None: not yet, or
    none declared). No query while a member has not stopped: the job cannot exist yet (the
    dashboard's live page asks every 2 s)."""
    if bundle.on_complete is None or not bundle.is_complete:
        return None
    params: rows.BundleCompletionParams = {
        "id": bundle.id, "type": bundle.on_complete, "since": id_floor(bundle.created_at),
        "done_from": id_floor(bundle.updated_at),
        "done_until": id_floor(bundle.updated_at + COMPLETION_WINDOW),
    }  # fmt: skip
    with wrapped(), cursor(conn, rows.JOB_LINK) as cur:
        return cur.execute(statement("bundle_completion", schema), params).fetchone()


def throughput(conn: Conn, schema: str, minutes: int) -> list[rows.ThroughputMinute]:
    """Succeeded and failed jobs per minute over the last `minutes` (the current one too);
    minutes without any are missing."""
    params: rows.MinutesParams = {"minutes": minutes}
    with wrapped(), cursor(conn, rows.THROUGHPUT_MINUTE) as cur:
        return cur.execute(statement("throughput", schema), params).fetchall()


def type_throughput(
    conn: Conn, schema: str, type_: str, window: float, bucket: float
) -> list[rows.ThroughputMinute]:
    """One type's succeeded and failed jobs per `bucket` seconds (aligned on whole buckets)
    over the last `window` seconds; empty buckets are missing."""
    params: rows.TypeWindowParams = {"type": type_, "window": window, "bucket": bucket}
    with wrapped(), cursor(conn, rows.THROUGHPUT_MINUTE) as cur:
        return cur.execute(statement("type_throughput", schema), params).fetchall()


def type_durations(conn: Conn, schema: str, type_: str, window: float) -> rows.Durations:
    """Run time percentiles of one type's jobs finished in the last `window` seconds."""
    params: rows.TypeWindowOnlyParams = {"type": type_, "window": window}
    with wrapped(), cursor(conn, rows.DURATIONS) as cur:
        found = cur.execute(statement("type_durations", schema), params).fetchone()
    assert found is not None  # an aggregate always returns its row
    return found


def type_active(conn: Conn, schema: str, type_: str) -> rows.TypeActive:
    """One type's unfinished jobs now, and its concurrency limits."""
    params: TypeParams = {"type": type_}
    with wrapped(), cursor(conn, rows.TYPE_ACTIVE) as cur:
        found = cur.execute(statement("type_active", schema), params).fetchone()
    assert found is not None  # one row of subqueries, always
    return found


def type_names(conn: Conn, schema: str) -> list[str]:
    """Types worth listing in a filter (queries.sql says which), sorted."""
    params: NoParams = {}
    with wrapped(), cursor(conn, scalar_row) as cur:
        return [str(t) for t in cur.execute(statement("type_names", schema), params)]


def running_on(conn: Conn, schema: str, workers: Sequence[str]) -> list[rows.RunningJob]:
    """The running jobs held by `workers` (worker ids), the earliest claimed first."""
    params: rows.WorkersParams = {"workers": list(workers)}
    with wrapped(), cursor(conn, rows.RUNNING_JOB) as cur:
        return cur.execute(statement("running_on", schema), params).fetchall()


def delete_job(conn: Conn, schema: str, job_id: JobId) -> bool:
    """Delete one finished job; False when it is unknown or not finished (nothing changes)."""
    params: IdParams = {"id": job_id}
    with wrapped(), cursor(conn, scalar_row) as cur:
        return cur.execute(statement("delete_job", schema), params).fetchone() is not None


def pause_schedule(conn: Conn, schema: str, name: str, paused_by: str) -> bool:
    """Stop schedule `name` enqueueing its ticks; False when unknown or paused already."""
    params: rows.SchedulePauseParams = {"name": name, "paused_by": paused_by}
    with wrapped(), cursor(conn, scalar_row) as cur:
        return cur.execute(statement("schedule_pause", schema), params).fetchone() is not None


def resume_schedule(conn: Conn, schema: str, name: str) -> bool:
    """Resume schedule `name` from its next tick (the missed ones are skipped); False when
    unknown or not paused."""
    params: rows.ScheduleNameParams = {"name": name}
    with wrapped(), cursor(conn, scalar_row) as cur:
        return cur.execute(statement("schedule_resume", schema), params).fetchone() is not None


def run_schedule_now(conn: Conn, schema: str, name: str) -> JobId | None:
    """Enqueue schedule `name`'s job, due now, apart from its ticks; None when unknown."""
    params: rows.ScheduleRunParams = {"name": name, "id": new_id()}
    with wrapped(), cursor(conn, scalar_row) as cur:
        found: uuid.UUID | None = cur.execute(
            statement("schedule_run_now", schema), params
        ).fetchone()
    return None if found is None else JobId(found)


DASHBOARD_INDEXES = ("job_created_idx", "job_type_created_idx")
PAYLOAD_INDEX = "job_payload_idx"
# each opt-in index (schema/0010 says why) and what it indexes: the Jobs page's unfiltered
# list, time ranges and common states; its type filter; its payload search (payload @> ...:
# jsonb_path_ops is smaller than the default GIN class and serves @> only, all the search
# asks; it costs every insert a GIN entry per payload value, docs/dashboard.md)
_INDEXED: dict[str, LiteralString] = {
    "job_created_idx": "(created_at, id)",
    "job_type_created_idx": "(type, created_at, id)",
    PAYLOAD_INDEX: "USING gin (payload jsonb_path_ops)",
}


def create_dashboard_indexes(conn: Conn, schema: str, *, payload: bool = False) -> None:
    """The Jobs page's opt-in indexes (schema/0010); kept if they exist; with `payload`, the
    payload search's GIN index too, each built CONCURRENTLY (no lock on the queue's writes while
    it builds). Where the job table is partitioned (schema/0029, `partition`), a partitioned
    index cannot be: each is made on the table alone (no build), then built CONCURRENTLY on each
    partition and attached; a partition made later gets its own part when it is made. `conn`
    must be in autocommit mode (CONCURRENTLY cannot run in a transaction)."""
    names = [*DASHBOARD_INDEXES, *([PAYLOAD_INDEX] if payload else [])]
    with wrapped():
        with cursor(conn, scalar_row) as cur:
            parted = cur.execute(statement("job_partitioned", schema)).fetchone() is True
        for name in names:
            what = sql.SQL(_INDEXED[name])
            if not parted:  # the one table: built CONCURRENTLY on it
                conn.execute(
                    sql.SQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON {}.job {}").format(
                        sql.Identifier(name), sql.Identifier(schema), what
                    )
                )
                continue
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON ONLY {}.job {}").format(
                    sql.Identifier(name), sql.Identifier(schema), what
                )
            )
            params: rows.DashboardIndexParams = {"schema": schema, "index": name}
            with cursor(conn, scalar_row) as cur:
                missing: list[str] = cur.execute(
                    statement("dashboard_index_missing", schema), params
                ).fetchall()
            for partition in missing:
                part = f"{partition}_{name.removeprefix('job_')}"  # as schema/0029 names them
                conn.execute(
                    sql.SQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} {}").format(
                        sql.Identifier(part), sql.Identifier(schema, partition), what
                    )
                )
                conn.execute(
                    sql.SQL("ALTER INDEX {} ATTACH PARTITION {}").format(
                        sql.Identifier(schema, name), sql.Identifier(schema, part)
                    )
                )
