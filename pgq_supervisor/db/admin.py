"""Administration and reading: cancel, reset, retry, look up, list, purge, count.

The calls the public API has in both kinds are plans (db/plans.py): `cancel(conn, ...)` runs
sync, `await cancel.run_async(aconn, ...)` async, from the one source."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg.rows import scalar_row, tuple_row

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.params import (
    DeleteFinishedParams,
    DepthParams,
    IdParams,
    IdsParams,
    ListJobsParams,
    OlderThanParams,
    OriginParams,
    PruneFinishedParams,
    ResetParams,
    TypeFilterParams,
)
from pgq_supervisor.db.plans import Plan, Twin, execute, fetch, fetch_one
from pgq_supervisor.errors import JobNotFound
from pgq_supervisor.jobs import Bundle, BundleId, JobId, JobRecord, JobState, TypeStats


def _job_state(schema: str, job_id: JobId) -> Plan[JobState]:
    params: IdParams = {"id": job_id}
    state: str | None = yield from fetch_one(statement("job_state", schema), params, scalar_row)
    if state is None:
        raise JobNotFound(f"no job with id {job_id}")
    return JobState(state)


@Twin
def cancel(schema: str, job_id: JobId) -> Plan[rows.CancelResult]:
    """Cancel a pending or running job (see the `cancel` statement). The result says the state
    it was in and whether it is cancelled now; JobNotFound for an unknown id."""
    params: IdParams = {"id": job_id}
    with wrapped():
        result = yield from fetch_one(statement("cancel", schema), params, rows.CANCEL_RESULT)
    if result is None:
        raise JobNotFound(f"no job with id {job_id}")
    return result


def cancelled_among(conn: Conn, schema: str, ids: Sequence[JobId]) -> set[JobId]:
    """Which of `ids` are cancelled (the supervisor's check behind pgq_job_cancel)."""
    params: IdsParams = {"ids": list(ids)}
    with wrapped(), cursor(conn, scalar_row) as cur:
        return set(cur.execute(statement("cancelled_among", schema), params).fetchall())


@Twin
def reset(schema: str, job_id: JobId, force: bool) -> Plan[JobState | None]:
    """Reset a job to pending. Returns None when done, else the state that prevented it."""
    params: ResetParams = {"id": job_id, "force": force}
    with wrapped():
        done = yield from fetch_one(statement("reset", schema), params, tuple_row)
        if done is not None:
            return None
        return (yield from _job_state(schema, job_id))


@Twin
def retry_failed(schema: str, type_: str | None) -> Plan[int]:
    params: TypeFilterParams = {"type": type_}
    with wrapped():
        count: int | None = yield from fetch_one(
            statement("retry_failed", schema), params, scalar_row
        )
    return 0 if count is None else int(count)


@Twin
def get_job(schema: str, job_id: JobId) -> Plan[JobRecord]:
    params: IdParams = {"id": job_id}
    with wrapped():
        job = yield from fetch_one(statement("get_job", schema), params, rows.JOB_RECORD)
    if job is None:
        raise JobNotFound(f"no job with id {job_id}")
    return job


@Twin
def get_bundle(schema: str, bundle_id: BundleId) -> Plan[Bundle]:
    params: IdParams = {"id": bundle_id}
    with wrapped():
        bundle = yield from fetch_one(statement("get_bundle", schema), params, rows.BUNDLE)
    if bundle is None:
        raise JobNotFound(f"no bundle with id {bundle_id}")
    return bundle


def list_jobs(
    conn: Conn, schema: str, state: JobState, type_: str | None, limit: int
) -> list[JobRecord]:
    params: ListJobsParams = {"state": state.value, "type": type_, "limit": limit}
    with wrapped(), cursor(conn, rows.JOB_RECORD) as cur:
        return cur.execute(statement("list_jobs", schema), params).fetchall()


@Twin
def delete_finished(
    schema: str,
    older_than: float,
    states: Sequence[JobState],
    batch: int = 5000,
    max_rows: int | None = None,
    *,
    zone: float | None = None,
) -> Plan[int]:
    """Delete finished jobs in batches, each in its own transaction when autocommit is on.

    Stops after about `max_rows` (whole batches) when given, so a caller with a loop to keep
    can bound how long one call takes; a result >= max_rows means more may be left. With
    `zone` (seconds), the jobs made in the last `zone` seconds are left to their partitions'
    drop (the `prune_finished` statement), but those of the default partition.
    """
    total = 0
    params: DeleteFinishedParams = {
        "states": [s.value for s in states],
        "older_than": older_than,
        "limit": batch,
    }
    query = statement("delete_finished", schema)
    if zone is not None:
        zoned: PruneFinishedParams = {**params, "zone": zone, "schema": schema}
        params, query = zoned, statement("prune_finished", schema)
    bundles: OlderThanParams = {"older_than": older_than}
    with wrapped():
        while True:
            n = yield from execute(query, params)
            total += max(n, 0)
            if n < batch or (max_rows is not None and total >= max_rows):
                break
        yield from execute(statement("delete_empty_bundles", schema), bundles)
    return total


@Twin
def queue_stats(schema: str, *, active_only: bool = False) -> Plan[list[TypeStats]]:
    """Counts per type and state; `active_only` reads just pending and running jobs (cheap)."""
    query = statement("active_stats" if active_only else "queue_stats", schema)
    with wrapped():
        return (yield from fetch(query, None, rows.TYPE_STATS))


@Twin
def depth(schema: str, type_: str | None = None) -> Plan[int]:
    """Jobs a claim could take now (of `type_`, or of every type): the schema's depth()."""
    params: DepthParams = {"types": None if type_ is None else [type_]}
    with wrapped():
        count: int | None = yield from fetch_one(statement("depth", schema), params, scalar_row)
    return 0 if count is None else int(count)


def db_now(conn: Conn, schema: str) -> datetime:
    with wrapped(), cursor(conn, scalar_row) as cur:
        now: datetime | None = cur.execute(statement("now", schema)).fetchone()
    assert now is not None
    return now


def summary_by_origin(
    conn: Conn, schema: str, origin: str
) -> list[tuple[str, JobState, int, float | None, int]]:
    """(type, state, count, mean seconds, failed attempts) for the jobs of one origin."""
    params: OriginParams = {"origin": origin}
    with wrapped(), cursor(conn, rows.ORIGIN_SUMMARY) as cur:
        summary: list[rows.OriginSummary] = cur.execute(
            statement("summary_by_origin", schema), params
        ).fetchall()
    return list(summary)
