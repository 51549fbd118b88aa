"""The producer API: enqueue in the caller's transaction, look jobs up, administer them.

Every function takes the caller's connection and never commits it, so a job is enqueued
exactly when the caller's own writes commit. `schema=None` means `$PGQ_SCHEMA` or "pgq".
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal, TypedDict, Unpack

from pgq_supervisor import db, ids
from pgq_supervisor import schema as migrations
from pgq_supervisor.errors import InvalidInput, InvalidTransition
from pgq_supervisor.frameworks import AsyncConnLike, ConnLike, as_psycopg, as_psycopg_async
from pgq_supervisor.inputs import check_key
from pgq_supervisor.jobs import (
    TERMINAL_STATES,
    Bundle,
    DependencyFailure,
    IdLike,
    JobId,
    JobRecord,
    JobState,
    JsonValue,
    NewJob,
    TypeStats,
    check_duration,
    check_type_name,
)


class EnqueueOptions(TypedDict, total=False):
    priority: int
    start_at: datetime | None
    max_retry_count: int | None
    unique_key: str | None
    origin: str | None
    timeout: float | None
    depends_on: Sequence[IdLike]
    on_dependency_failure: DependencyFailure
    concurrency_key: str | None
    unique_for: float | timedelta | None
    unique_states: Sequence[str] | None
    replace: bool
    replace_running: Literal["wait", "drop"]
    ordered_key: str | None
    tenant: str | None


class JobOptions(TypedDict, total=False):
    """The job options of docs/job-options.md, passed through to NewJob as given."""

    unique_for: float | timedelta | None
    unique_states: Sequence[str] | None
    replace: bool
    replace_running: Literal["wait", "drop"]
    ordered_key: str | None
    tenant: str | None


def _schema(schema: str | None) -> str:
    return schema or db.default_schema()


def _new_job(
    type_: str,
    payload: JsonValue,
    priority: int,
    start_at: datetime | None,
    max_retry_count: int | None,
    unique_key: str | None,
    origin: str | None,
    timeout: float | None,
    depends_on: Sequence[IdLike],
    on_dependency_failure: DependencyFailure,
    concurrency_key: str | None,
    **options: Unpack[JobOptions],
) -> NewJob:
    return NewJob(
        type=type_,
        payload={} if payload is None else payload,
        priority=priority,
        start_at=start_at,
        max_retry_count=max_retry_count,
        unique_key=unique_key,
        origin=origin,
        timeout=timeout,
        depends_on=depends_on,
        on_dependency_failure=on_dependency_failure,
        concurrency_key=concurrency_key,
        **options,
    )


def enqueue(
    conn: ConnLike,
    type: str,
    payload: JsonValue = None,
    *,
    priority: int = 0,
    start_at: datetime | None = None,
    max_retry_count: int | None = None,
    unique_key: str | None = None,
    origin: str | None = None,
    timeout: float | None = None,
    depends_on: Sequence[IdLike] = (),
    on_dependency_failure: DependencyFailure = "cancel",
    concurrency_key: str | None = None,
    unique_for: float | timedelta | None = None,
    unique_states: Sequence[str] | None = None,
    replace: bool = False,
    replace_running: Literal["wait", "drop"] = "wait",
    ordered_key: str | None = None,
    tenant: str | None = None,
    schema: str | None = None,
) -> JobId:
    """Insert one job in the caller's transaction and return its id.

    With `unique_key` set and an unfinished job already holding that key, nothing is
    inserted and the existing job's id is returned. With `unique_for` (seconds or a
    timedelta) too, a job of the key that finished within that time of its enqueue, in one of
    `unique_states` (default: pending, running, succeeded), holds it as well (a dedup window;
    see docs/job-options.md). With `replace=True` instead (debounce), the pending job holding
    the key takes this one's payload, start_at and priority; a running holder is left alone and
    this job waits behind it (`replace_running="wait"`) or is dropped (`"drop"`).
    `ordered_key`: the jobs of one key run one at a time, in enqueue order (a failed one
    blocks the key until reset or deleted).
    `tenant`: the claims of the type go round-robin across its tenants (docs/job-options.md).
    Raises InvalidInput for a bad type name, a payload that is not JSON, or bad options;
    nothing is written then.

    With `depends_on`, the job is claimed only once every one of those jobs has succeeded;
    if one fails or is cancelled, this job is cancelled ("dependency <id> failed"), or runs
    anyway with `on_dependency_failure="run"`. The ids must exist (committed, or enqueued
    earlier in this transaction): an unknown one raises InvalidInput naming it.

    `concurrency_key`: with a handler declaring `key_concurrency=N`, at most N jobs of the
    type with this key run at once, in claim order (other handlers ignore it).
    """
    job = _new_job(
        type, payload, priority, start_at, max_retry_count, unique_key, origin, timeout,
        depends_on, on_dependency_failure, concurrency_key,
        unique_for=unique_for, unique_states=unique_states, replace=replace,
        replace_running=replace_running, ordered_key=ordered_key, tenant=tenant,
    )  # fmt: skip
    c = as_psycopg(conn)
    return db.enqueue(c, _schema(schema), job)


async def enqueue_async(
    conn: AsyncConnLike,
    type: str,
    payload: JsonValue = None,
    *,
    priority: int = 0,
    start_at: datetime | None = None,
    max_retry_count: int | None = None,
    unique_key: str | None = None,
    origin: str | None = None,
    timeout: float | None = None,
    depends_on: Sequence[IdLike] = (),
    on_dependency_failure: DependencyFailure = "cancel",
    concurrency_key: str | None = None,
    unique_for: float | timedelta | None = None,
    unique_states: Sequence[str] | None = None,
    replace: bool = False,
    replace_running: Literal["wait", "drop"] = "wait",
    ordered_key: str | None = None,
    tenant: str | None = None,
    schema: str | None = None,
) -> JobId:
    """`enqueue` for a psycopg.AsyncConnection."""
    job = _new_job(
        type, payload, priority, start_at, max_retry_count, unique_key, origin, timeout,
        depends_on, on_dependency_failure, concurrency_key,
        unique_for=unique_for, unique_states=unique_states, replace=replace,
        replace_running=replace_running, ordered_key=ordered_key, tenant=tenant,
    )  # fmt: skip
    return await db.enqueue_async(await as_psycopg_async(conn), _schema(schema), job)


def enqueue_many(
    conn: ConnLike, jobs: Sequence[NewJob], *, schema: str | None = None
) -> list[JobId]:
    """Insert many jobs in one statement (one notification per job type, not per row).

    Returns ids in input order; a job whose unique_key is taken gets the holder's id.
    A job's `depends_on` may name jobs enqueued before this call (even in the same
    transaction), not jobs of this batch: their ids are made here.
    """
    c = as_psycopg(conn)
    return db.enqueue_many(c, _schema(schema), jobs)


def enqueue_bundle(
    conn: ConnLike,
    type: str,
    jobs: Sequence[NewJob],
    *,
    on_complete: str | None = None,
    origin: str | None = None,
    schema: str | None = None,
) -> Bundle:
    """Insert a bundle and all its jobs atomically (a savepoint inside the caller's transaction).

    When the last of its jobs reaches a terminal state, the completing transaction notifies
    `pgq_bundle_stopped` and, if `on_complete` names a job type, enqueues that job once with
    payload {"bundle_id": ...}.
    """
    if not jobs:
        raise InvalidInput("a bundle needs at least one job")
    if any(j.unique_key is not None for j in jobs):
        raise InvalidInput("bundle jobs cannot have a unique_key (the bundle would miscount)")
    db.check_bundle(type, origin, on_complete)
    c = as_psycopg(conn)
    s = _schema(schema)
    with db.atomic(c):
        bundle = db.insert_bundle(c, s, type, len(jobs), origin, on_complete)
        db.enqueue_many(c, s, jobs, bundle_id=bundle.id)
    return bundle


def get_job(conn: ConnLike, id: IdLike, *, schema: str | None = None) -> JobRecord:
    """The job's record. `id` is a UUID or its string form (InvalidInput otherwise, as for
    every call that takes an id); JobNotFound if no job has it."""
    job_id = ids.job_id(id, "id")
    c = as_psycopg(conn)
    return db.get_job(c, _schema(schema), job_id)


def get_bundle(conn: ConnLike, id: IdLike, *, schema: str | None = None) -> Bundle:
    """The bundle with its counters; JobNotFound if no bundle has that id."""
    bundle_id = ids.bundle_id(id, "id")
    c = as_psycopg(conn)
    return db.get_bundle(c, _schema(schema), bundle_id)


def cancel_job(conn: ConnLike, id: IdLike, *, schema: str | None = None) -> JobState:
    """Cancel a pending or running job; returns the state it was in. A running job ends
    `cancelled` when this commits (its worker's writes are fenced out, it is never retried)
    and the supervisor whose child runs it stops that child. InvalidTransition if the job has
    finished, JobNotFound if unknown."""
    job_id = ids.job_id(id, "id")
    c = as_psycopg(conn)
    result = db.cancel(c, _schema(schema), job_id)
    if not result.cancelled:
        raise InvalidTransition(
            f"job {job_id} is {result.state.value}; only pending or running jobs can be cancelled"
        )
    return result.state


def reset_job(
    conn: ConnLike, id: IdLike, *, force: bool = False, schema: str | None = None
) -> None:
    """Put a finished job back to pending with a fresh retry budget (history is kept).

    A running job is refused unless `force`: its worker is then fenced out and its writes
    are dropped, so the job cannot run twice to completion.
    """
    job_id = ids.job_id(id, "id")
    c = as_psycopg(conn)
    blocked_by = db.reset(c, _schema(schema), job_id, force)
    if blocked_by is not None:
        hint = (
            " (use force=True to take it from its worker)" if blocked_by is JobState.RUNNING else ""
        )
        raise InvalidTransition(f"job {job_id} is {blocked_by.value}; cannot reset it{hint}")


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
    _check_type(type)
    c = as_psycopg(conn)
    return db.pause(c, _schema(schema), type, paused_by=by, reason=reason) is not None


def resume(conn: ConnLike, type: str, *, schema: str | None = None) -> bool:
    """Resume a paused job type; its workers are woken when this commits. Returns False if
    the type was not paused (nothing changes). InvalidInput for an invalid type name."""
    _check_type(type)
    c = as_psycopg(conn)
    return db.resume(c, _schema(schema), type)


def set_tenant_weight(
    conn: ConnLike, type: str, tenant: str, weight: int, *, schema: str | None = None
) -> None:
    """Fair claims (docs/job-options.md): `tenant` gets `weight` (1 to 1000, default 1) turns'
    worth of the type's claims per round. Takes effect for the claims after this commits."""
    _check_type(type)
    check_key(tenant, "tenant")
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1000:
        raise InvalidInput(f"weight must be an integer from 1 to 1000, got {weight!r}")
    db.set_tenant_weight(as_psycopg(conn), _schema(schema), type, tenant, weight)


def _check_type(type_: str) -> None:
    try:
        check_type_name(type_)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def retry_failed(conn: ConnLike, *, type: str | None = None, schema: str | None = None) -> int:
    """Reset every failed job (of one type, or all). Returns how many."""
    c = as_psycopg(conn)
    return db.retry_failed(c, _schema(schema), type)


def delete_finished(
    conn: ConnLike,
    older_than: timedelta | float,
    *,
    states: Sequence[JobState] = tuple(TERMINAL_STATES),
    schema: str | None = None,
) -> int:
    """Delete jobs that finished more than `older_than` ago; bundle counters stay true."""
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
    try:
        check_duration(seconds)
    except ValueError as exc:
        raise InvalidInput(f"older_than {exc}") from None
    bad = [s for s in states if s not in TERMINAL_STATES]
    if bad:
        raise InvalidInput(f"only finished jobs can be purged, not {bad[0].value}")
    c = as_psycopg(conn)
    return db.delete_finished(c, _schema(schema), seconds, states)


def queue_stats(conn: ConnLike, *, schema: str | None = None) -> list[TypeStats]:
    c = as_psycopg(conn)
    return db.queue_stats(c, _schema(schema))


def queue_depth(conn: ConnLike, type: str | None = None, *, schema: str | None = None) -> int:
    """Jobs a claim could take now (of one type, or all): what an autoscaler should size for.
    The schema's depth() (schema/0014): due, not waiting on dependencies, not of a paused
    type, within a rate's free starts and a global limit's free slots."""
    c = as_psycopg(conn)
    return db.depth(c, _schema(schema), type)


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
