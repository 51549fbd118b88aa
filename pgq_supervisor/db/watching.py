"""Waiting on jobs and their progress: the state of many jobs at once, their records, and the
fenced progress write (sync, and async for the waiters of an asyncio program)."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.rows import scalar_row, tuple_row

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import AsyncConn, Conn, cursor, cursor_async, statement, wrapped
from pgq_supervisor.db.params import IdsParams, SetProgressParams, UnservedParams
from pgq_supervisor.jobs import JobId, JobRecord, JobState, LeaseToken


def job_states(conn: Conn, schema: str, ids: Sequence[JobId]) -> dict[JobId, JobState]:
    """The state of each of `ids` that exists (an unknown id has no entry)."""
    params: IdsParams = {"ids": list(ids)}
    with wrapped(), cursor(conn, rows.JOB_STATE) as cur:
        return {r.id: r.state for r in cur.execute(statement("job_states", schema), params)}


async def job_states_async(
    conn: AsyncConn, schema: str, ids: Sequence[JobId]
) -> dict[JobId, JobState]:
    params: IdsParams = {"ids": list(ids)}
    with wrapped():
        async with cursor_async(conn, rows.JOB_STATE) as cur:
            await cur.execute(statement("job_states", schema), params)
            return {r.id: r.state for r in await cur.fetchall()}


def get_jobs(conn: Conn, schema: str, ids: Sequence[JobId]) -> dict[JobId, JobRecord]:
    """The records of those of `ids` that exist."""
    params: IdsParams = {"ids": list(ids)}
    with wrapped(), cursor(conn, rows.JOB_RECORD) as cur:
        return {r.id: r for r in cur.execute(statement("get_jobs", schema), params)}


async def get_jobs_async(
    conn: AsyncConn, schema: str, ids: Sequence[JobId]
) -> dict[JobId, JobRecord]:
    params: IdsParams = {"ids": list(ids)}
    with wrapped():
        async with cursor_async(conn, rows.JOB_RECORD) as cur:
            await cur.execute(statement("get_jobs", schema), params)
            return {r.id: r for r in await cur.fetchall()}


def unserved_types(
    conn: Conn, schema: str, ids: Sequence[JobId], seen_within: float
) -> tuple[list[str], list[str]]:
    """(the types of those of `ids` still pending that no supervisor seen within `seen_within`
    seconds serves, the types those supervisors serve), each sorted."""
    params: UnservedParams = {"ids": list(ids), "seen_within": seen_within}
    with wrapped(), cursor(conn, tuple_row) as cur:
        row = cur.execute(statement("unserved_types", schema), params).fetchone()
    return _two_lists(row)


async def unserved_types_async(
    conn: AsyncConn, schema: str, ids: Sequence[JobId], seen_within: float
) -> tuple[list[str], list[str]]:
    """`unserved_types` on an async connection."""
    params: UnservedParams = {"ids": list(ids), "seen_within": seen_within}
    with wrapped():
        async with cursor_async(conn, tuple_row) as cur:
            await cur.execute(statement("unserved_types", schema), params)
            row = await cur.fetchone()
    return _two_lists(row)


def _two_lists(row: tuple[object, ...] | None) -> tuple[list[str], list[str]]:
    if row is None:  # one row always: two ARRAY(...) of no FROM
        return [], []
    unserved, served = row
    return _strs(unserved), _strs(served)


def _strs(value: object) -> list[str]:
    return [str(t) for t in value] if isinstance(value, list) else []


def set_progress(
    conn: Conn, schema: str, values: Sequence[tuple[JobId, LeaseToken, str]]
) -> set[JobId]:
    """Write each (job, lease, progress as JSON text) whose job still runs under that lease;
    returns the jobs written (the others are another worker's now, or finished)."""
    if not values:
        return set()
    params: SetProgressParams = {
        "ids": [v[0] for v in values],
        "leases": [v[1] for v in values],
        "progress": [v[2] for v in values],
    }
    with wrapped(), cursor(conn, scalar_row) as cur:
        written: list[JobId] = cur.execute(statement("set_progress", schema), params).fetchall()
    return set(written)
