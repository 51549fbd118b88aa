"""The worker's side: claim, heartbeat, complete, fail, release; and the rescue of dead ones.

Every write about a claimed job is fenced by its lease: it lands only while the job is still
running under that lease.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from psycopg.rows import scalar_row, tuple_row

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import AsyncConn, Conn, cursor, cursor_async, statement, wrapped
from pgq_supervisor.db.option_params import AgePrioritiesParams, SnoozeParams
from pgq_supervisor.db.params import (
    ClaimParams,
    EndAttemptParams,
    HeartbeatParams,
    ReleaseParams,
    RescueParams,
    SucceedAndClaimParams,
    SucceedParams,
    SupervisorIdParams,
    TypesParams,
    dump_json,
    new_id,
)
from pgq_supervisor.jobs import (
    AttemptKind,
    EndedAttempt,
    Job,
    JobId,
    JsonValue,
    LeaseToken,
)


def _claim_params(
    worker_id: str, types: Sequence[str], max_retry_counts: Sequence[int], limit: int
) -> ClaimParams:
    return {
        "worker_id": worker_id,
        "types": list(types),
        "max_retry_counts": list(max_retry_counts),
        "limit": limit,
        "lease": LeaseToken(new_id()),
    }


def claim(
    conn: Conn,
    schema: str,
    *,
    worker_id: str,
    types: Sequence[str],
    max_retry_counts: Sequence[int],
    limit: int,
) -> list[Job]:
    """Up to `limit` jobs of `types`, now running under one fresh lease, in the order to run
    them (highest priority, then oldest). `max_retry_counts[i]` is the default of `types[i]`."""
    params = _claim_params(worker_id, types, max_retry_counts, limit)
    with wrapped(), cursor(conn, rows.JOB) as cur:
        return cur.execute(statement("claim", schema), params).fetchall()


def heartbeat(conn: Conn, schema: str, ids: Sequence[JobId], lease: LeaseToken) -> set[JobId]:
    """`beat` of the jobs held under one lease; returns the ids still held."""
    return beat(conn, schema, {lease: ids}).get(lease, set())


def beat(
    conn: Conn, schema: str, held: Mapping[LeaseToken, Sequence[JobId]]
) -> dict[LeaseToken, set[JobId]]:
    """One heartbeat of a child (schema/0025): its row in `worker` is made fresh (the owner is
    read from the jobs held), which keeps every job it holds alive; no job row is written
    (unless a supervisor of a version before 25 is registered). Returns, by lease, the ids
    still running under it; the others lost their lease or ended. Waits for no row lock."""
    pairs = [(i, lease) for lease, ids in held.items() for i in ids]
    if not pairs:
        return {}
    params: HeartbeatParams = {"ids": [p[0] for p in pairs], "leases": [p[1] for p in pairs]}
    kept: dict[LeaseToken, set[JobId]] = {}
    with wrapped(), cursor(conn, tuple_row) as cur:
        for job_id, lease in cur.execute(statement("heartbeat", schema), params).fetchall():
            kept.setdefault(lease, set()).add(job_id)
    return kept


def worker_gone(conn: Conn, schema: str, worker_id: str) -> None:
    """Delete a child's `worker` row: it beats no more (its heartbeat stopped)."""
    params: SupervisorIdParams = {"id": worker_id}
    with wrapped():
        conn.execute(statement("worker_gone", schema), params)


def _succeed_params(
    lease: LeaseToken,
    results: Sequence[tuple[JobId, str | None]],
    ephemeral: Collection[JobId] = (),
) -> SucceedParams:
    # in id order, the order the update then takes the rows in: the order everything else
    # locks jobs in (link_dependencies, the bundle trigger's jobs-then-bundles), so none of
    # them can deadlock with it
    results = sorted(results, key=lambda r: r[0])
    return {
        "ids": [r[0] for r in results],
        "results": [r[1] for r in results],
        "done_lease": lease,
        "ephemeral": sorted(ephemeral),
    }


def succeed(
    conn: Conn,
    schema: str,
    lease: LeaseToken,
    results: Sequence[tuple[JobId, str | None]],
    ephemeral: Collection[JobId] = (),
) -> set[JobId]:
    """Mark jobs succeeded with their (JSON-text) results; returns the ids still held. Those
    in `ephemeral` are deleted instead, unless they have a bundle or dependents."""
    params = _succeed_params(lease, results, ephemeral)
    with wrapped(), cursor(conn, scalar_row) as cur:
        return set(cur.execute(statement("succeed", schema), params).fetchall())


async def succeed_async(
    conn: AsyncConn,
    schema: str,
    lease: LeaseToken,
    results: Sequence[tuple[JobId, str | None]],
    ephemeral: Collection[JobId] = (),
) -> set[JobId]:
    """`succeed` on an async connection: an async handler's transaction commits with it."""
    params = _succeed_params(lease, results, ephemeral)
    with wrapped():
        async with cursor_async(conn, scalar_row) as cur:
            await cur.execute(statement("succeed", schema), params)
            return set(await cur.fetchall())


def succeed_and_claim(
    conn: Conn,
    schema: str,
    lease: LeaseToken,
    results: Sequence[tuple[JobId, str | None]],
    *,
    worker_id: str,
    types: Sequence[str],
    max_retry_counts: Sequence[int],
    limit: int,
    ephemeral: Collection[JobId] = (),
) -> tuple[set[JobId], list[Job]]:
    """`succeed` for one lease's jobs and `claim` of the next batch, in one statement.

    Bundled jobs too: the bundle trigger counts them at the end of the statement, locking
    their bundles in id order after every job row the statement took (schema/0024).
    """
    params: SucceedAndClaimParams = {
        **_succeed_params(lease, results, ephemeral),
        **_claim_params(worker_id, types, max_retry_counts, limit),
    }
    with wrapped(), cursor(conn, rows.DoneAndClaimedRow(params["lease"])) as cur:
        row = cur.execute(statement("succeed_and_claim", schema), params).fetchone()
    assert row is not None  # an aggregate without GROUP BY: always one row
    done_ids, jobs = row
    return set(done_ids), jobs


def end_attempt(
    conn: Conn,
    schema: str,
    ids: Sequence[JobId],
    *,
    error: str,
    kind: AttemptKind,
    lease: LeaseToken | None = None,
    worker_id: str | None = None,
    error_data: JsonValue = None,
    allow_retry: bool = True,
    delay: float = 0.0,
) -> list[EndedAttempt]:
    params: EndAttemptParams = {
        "ids": list(ids),
        "lease": lease,
        "worker_id": worker_id,
        # an empty message would leave the row unreadable; keep a placeholder. A NUL (text
        # cannot hold one) would make the write fail and the attempt go unrecorded.
        "error": error.replace("\x00", "\\x00").strip() or "(no error message)",
        "error_data": None if error_data is None else dump_json(error_data, "error_data"),
        "kind": kind.value,
        "allow_retry": allow_retry,
        "delay": max(0.0, delay),
    }
    with wrapped(), cursor(conn, rows.ENDED_ATTEMPT) as cur:
        return cur.execute(statement("end_attempt", schema), params).fetchall()


def snooze(
    conn: Conn,
    schema: str,
    job_id: JobId,
    *,
    lease: LeaseToken,
    delay: float,
    max_snoozes: int,
    error: str,
) -> list[EndedAttempt]:
    """Snooze the job held under `lease`: pending again in `delay` seconds, no attempt counted;
    if it has snoozed `max_snoozes` times already, failed with `error` instead. No row: the
    lease was lost and nothing was written."""
    params: SnoozeParams = {
        "id": job_id,
        "lease": lease,
        "delay": max(0.0, delay),
        "max_snoozes": max_snoozes,
        "error": error,
    }
    with wrapped(), cursor(conn, rows.ENDED_ATTEMPT) as cur:
        return cur.execute(statement("snooze", schema), params).fetchall()


def release(
    conn: Conn,
    schema: str,
    *,
    ids: Sequence[JobId] | None = None,
    lease: LeaseToken | None = None,
    worker_id: str | None = None,
) -> list[JobId]:
    if ids is None and lease is None and worker_id is None:
        raise ValueError("release needs ids, a lease or a worker id")
    params: ReleaseParams = {
        "ids": None if ids is None else list(ids),
        "lease": lease,
        "worker_id": worker_id,
    }
    with wrapped(), cursor(conn, scalar_row) as cur:
        return cur.execute(statement("release", schema), params).fetchall()


def rescue(conn: Conn, schema: str, *, dead_after: float, limit: int = 1000) -> list[EndedAttempt]:
    params: RescueParams = {
        "dead_after": dead_after,
        "limit": limit,
        "error": f"worker died: no heartbeat for {dead_after:g} s",
    }
    with wrapped(), cursor(conn, rows.ENDED_ATTEMPT) as cur:
        return cur.execute(statement("rescue", schema), params).fetchall()


def next_due(conn: Conn, schema: str, types: Sequence[str]) -> float | None:
    """Seconds until the earliest delayed job of `types` becomes eligible (None: there is none)."""
    params: TypesParams = {"types": list(types)}
    with wrapped(), cursor(conn, scalar_row) as cur:
        seconds: float | None = cur.execute(statement("next_due", schema), params).fetchone()
    return None if seconds is None else float(seconds)


def age_priorities(
    conn: Conn, schema: str, type_: str, *, every: float, max_priority: int, limit: int
) -> int:
    """Raise by one the priority of up to `limit` pending `type_` jobs that waited `every`
    seconds since enqueued or last raised, below `max_priority`; returns how many."""
    params: AgePrioritiesParams = {
        "type": type_,
        "every": every,
        "max_priority": max_priority,
        "limit": limit,
    }
    with wrapped(), cursor(conn, scalar_row) as cur:
        return len(cur.execute(statement("age_priorities", schema), params).fetchall())
