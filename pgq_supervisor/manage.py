"""Look jobs up and administer them: get_job, get_bundle, cancel_job, reset_job, pause,
resume, set_tenant_weight, retry_failed, delete_finished, queue_stats, queue_depth, migrate,
each with its `_async` twin for a psycopg.AsyncConnection (or a SQLAlchemy AsyncSession).

Every function takes the caller's connection and never commits it. `schema=None` means
`$PGQ_SCHEMA` or "pgq". Each call is written once, as a plan (db/plans.py: its validation,
its statements and what their results mean) that a thin sync shell and a thin async shell
run: see docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from pgq_supervisor import db, ids
from pgq_supervisor import schema as migrations
from pgq_supervisor.db.plans import Plan, run, run_async
from pgq_supervisor.errors import InvalidInput, InvalidTransition
from pgq_supervisor.frameworks import AsyncConnLike, ConnLike, as_psycopg, as_psycopg_async
from pgq_supervisor.inputs import check_key
from pgq_supervisor.jobs import (
    TERMINAL_STATES,
    Bundle,
    IdLike,
    JobRecord,
    JobState,
    TypeStats,
    check_duration,
    check_type_name,
)


def _schema(schema: str | None) -> str:
    return schema or db.default_schema()


def _check_type(type_: str) -> None:
    try:
        check_type_name(type_)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _get_job(id: IdLike, schema: str | None) -> Plan[JobRecord]:
    return (yield from db.get_job.plan(_schema(schema), ids.job_id(id, "id")))


def get_job(conn: ConnLike, id: IdLike, *, schema: str | None = None) -> JobRecord:
    """The job's record. `id` is a UUID or its string form (InvalidInput otherwise, as for
    every call that takes an id); JobNotFound if no job has it."""
    return run(as_psycopg(conn), _get_job(id, schema))


async def get_job_async(conn: AsyncConnLike, id: IdLike, *, schema: str | None = None) -> JobRecord:
    """`get_job` for a psycopg.AsyncConnection."""
    return await run_async(await as_psycopg_async(conn), _get_job(id, schema))


def _get_bundle(id: IdLike, schema: str | None) -> Plan[Bundle]:
    return (yield from db.get_bundle.plan(_schema(schema), ids.bundle_id(id, "id")))


def get_bundle(conn: ConnLike, id: IdLike, *, schema: str | None = None) -> Bundle:
    """The bundle with its counters; JobNotFound if no bundle has that id."""
    return run(as_psycopg(conn), _get_bundle(id, schema))


async def get_bundle_async(conn: AsyncConnLike, id: IdLike, *, schema: str | None = None) -> Bundle:
    """`get_bundle` for a psycopg.AsyncConnection."""
    return await run_async(await as_psycopg_async(conn), _get_bundle(id, schema))


def _cancel_job(id: IdLike, schema: str | None) -> Plan[JobState]:
    job_id = ids.job_id(id, "id")
    result = yield from db.cancel.plan(_schema(schema), job_id)
    if not result.cancelled:
        raise InvalidTransition(
            f"job {job_id} is {result.state.value}; only pending or running jobs can be cancelled"
        )
    return result.state


def cancel_job(conn: ConnLike, id: IdLike, *, schema: str | None = None) -> JobState:
    """Cancel a pending or running job; returns the state it was in. A running job ends
    `cancelled` when this commits (its worker's writes are fenced out, it is never retried)
    and the supervisor whose child runs it stops that child. InvalidTransition if the job has
    finished, JobNotFound if unknown."""
    return run(as_psycopg(conn), _cancel_job(id, schema))


async def cancel_job_async(
    conn: AsyncConnLike, id: IdLike, *, schema: str | None = None
) -> JobState:
    """`cancel_job` for a psycopg.AsyncConnection."""
    return await run_async(await as_psycopg_async(conn), _cancel_job(id, schema))


def _reset_job(id: IdLike, force: bool, schema: str | None) -> Plan[None]:
    job_id = ids.job_id(id, "id")
    blocked_by = yield from db.reset.plan(_schema(schema), job_id, force)
    if blocked_by is not None:
        hint = (
            " (use force=True to take it from its worker)" if blocked_by is JobState.RUNNING else ""
        )
        raise InvalidTransition(f"job {job_id} is {blocked_by.value}; cannot reset it{hint}")


def reset_job(
    conn: ConnLike, id: IdLike, *, force: bool = False, schema: str | None = None
) -> None:
    """Put a finished job back to pending with a fresh retry budget (history is kept).

    A running job is refused unless `force`: its worker is then fenced out and its writes
    are dropped, so the job cannot run twice to completion.
    """
    run(as_psycopg(conn), _reset_job(id, force, schema))


async def reset_job_async(
    conn: AsyncConnLike, id: IdLike, *, force: bool = False, schema: str | None = None
) -> None:
    """`reset_job` for a psycopg.AsyncConnection."""
    await run_async(await as_psycopg_async(conn), _reset_job(id, force, schema))


def _pause(type_: str, reason: str | None, by: str | None, schema: str | None) -> Plan[bool]:
    _check_type(type_)
    paused_at = yield from db.pause.plan(_schema(schema), type_, paused_by=by, reason=reason)
    return paused_at is not None


def pause(
    conn: ConnLike,
    type: str,
    *,
    reason: str | None = None,
    by: str | None = None,
    schema: str | None = None,
) -> bool:
    """Pause a job type: no supervisor claims its jobs until `resume` (running ones finish;
    the rest wait in pending, costing no attempt). Takes effect when this commits. Returns
    False if the type was paused already (nothing changes then: its reason and time stay).
    InvalidInput for an invalid type name."""
    return run(as_psycopg(conn), _pause(type, reason, by, schema))


async def pause_async(
    conn: AsyncConnLike,
    type: str,
    *,
    reason: str | None = None,
    by: str | None = None,
    schema: str | None = None,
) -> bool:
    """`pause` for a psycopg.AsyncConnection."""
    return await run_async(await as_psycopg_async(conn), _pause(type, reason, by, schema))


def _resume(type_: str, schema: str | None) -> Plan[bool]:
    _check_type(type_)
    return (yield from db.resume.plan(_schema(schema), type_))


def resume(conn: ConnLike, type: str, *, schema: str | None = None) -> bool:
    """Resume a paused job type; its workers are woken when this commits. Returns False if
    the type was not paused (nothing changes). InvalidInput for an invalid type name."""
    return run(as_psycopg(conn), _resume(type, schema))


async def resume_async(conn: AsyncConnLike, type: str, *, schema: str | None = None) -> bool:
    """`resume` for a psycopg.AsyncConnection."""
    return await run_async(await as_psycopg_async(conn), _resume(type, schema))


def _set_tenant_weight(type_: str, tenant: str, weight: int, schema: str | None) -> Plan[None]:
    _check_type(type_)
    check_key(tenant, "tenant")
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1000:
        raise InvalidInput(f"weight must be an integer from 1 to 1000, got {weight!r}")
    yield from db.set_tenant_weight.plan(_schema(schema), type_, tenant, weight)


def set_tenant_weight(
    conn: ConnLike, type: str, tenant: str, weight: int, *, schema: str | None = None
) -> None:
    """Fair claims (docs/job-options.md): `tenant` gets `weight` (1 to 1000, default 1) turns'
    worth of the type's claims per round. Takes effect for the claims after this commits."""
    run(as_psycopg(conn), _set_tenant_weight(type, tenant, weight, schema))


async def set_tenant_weight_async(
    conn: AsyncConnLike, type: str, tenant: str, weight: int, *, schema: str | None = None
) -> None:
    """`set_tenant_weight` for a psycopg.AsyncConnection."""
    plan = _set_tenant_weight(type, tenant, weight, schema)
    await run_async(await as_psycopg_async(conn), plan)


def retry_failed(conn: ConnLike, *, type: str | None = None, schema: str | None = None) -> int:
    """Reset every failed job (of one type, or all). Returns how many."""
    return db.retry_failed(as_psycopg(conn), _schema(schema), type)


async def retry_failed_async(
    conn: AsyncConnLike, *, type: str | None = None, schema: str | None = None
) -> int:
    """`retry_failed` for a psycopg.AsyncConnection."""
    aconn = await as_psycopg_async(conn)
    return await db.retry_failed.run_async(aconn, _schema(schema), type)


def _delete_finished(
    older_than: timedelta | float, states: Sequence[JobState], schema: str | None
) -> Plan[int]:
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
    try:
        check_duration(seconds)
    except ValueError as exc:
        raise InvalidInput(f"older_than {exc}") from None
    bad = [s for s in states if s not in TERMINAL_STATES]
    if bad:
        raise InvalidInput(f"only finished jobs can be purged, not {bad[0].value}")
    return (yield from db.delete_finished.plan(_schema(schema), seconds, states))


_FINISHED = tuple(TERMINAL_STATES)


def delete_finished(
    conn: ConnLike,
    older_than: timedelta | float,
    *,
    states: Sequence[JobState] = _FINISHED,
    schema: str | None = None,
) -> int:
    """Delete jobs that finished more than `older_than` ago; bundle counters stay true."""
    return run(as_psycopg(conn), _delete_finished(older_than, states, schema))


async def delete_finished_async(
    conn: AsyncConnLike,
    older_than: timedelta | float,
    *,
    states: Sequence[JobState] = _FINISHED,
    schema: str | None = None,
) -> int:
    """`delete_finished` for a psycopg.AsyncConnection."""
    plan = _delete_finished(older_than, states, schema)
    return await run_async(await as_psycopg_async(conn), plan)


def queue_stats(conn: ConnLike, *, schema: str | None = None) -> list[TypeStats]:
    """Counts per type and state."""
    return db.queue_stats(as_psycopg(conn), _schema(schema))


async def queue_stats_async(conn: AsyncConnLike, *, schema: str | None = None) -> list[TypeStats]:
    """`queue_stats` for a psycopg.AsyncConnection."""
    return await db.queue_stats.run_async(await as_psycopg_async(conn), _schema(schema))


def queue_depth(conn: ConnLike, type: str | None = None, *, schema: str | None = None) -> int:
    """Jobs a claim could take now (of one type, or all): what an autoscaler should size for.
    The schema's depth() (schema/0014): due, not waiting on dependencies, not of a paused
    type, within a rate's free starts and a global limit's free slots."""
    return db.depth(as_psycopg(conn), _schema(schema), type)


async def queue_depth_async(
    conn: AsyncConnLike, type: str | None = None, *, schema: str | None = None
) -> int:
    """`queue_depth` for a psycopg.AsyncConnection."""
    return await db.depth.run_async(await as_psycopg_async(conn), _schema(schema), type)


def migrate(
    conn: ConnLike,
    *,
    schema: str | None = None,
    lock_timeout: float = migrations.DEFAULT_LOCK_TIMEOUT,
) -> list[int]:
    """Apply pending migrations; returns the versions applied. Safe to run concurrently.
    schema.migrate says more (the lock, `lock_timeout`, MigrationLocked, a role without DDL)."""
    c = as_psycopg(conn)
    return migrations.migrate(c, _schema(schema), lock_timeout=lock_timeout)


async def migrate_async(
    conn: AsyncConnLike,
    *,
    schema: str | None = None,
    lock_timeout: float = migrations.DEFAULT_LOCK_TIMEOUT,
) -> list[int]:
    """`migrate` for a psycopg.AsyncConnection."""
    aconn = await as_psycopg_async(conn)
    return await migrations.migrate.run_async(aconn, _schema(schema), lock_timeout=lock_timeout)
