"""The producer API: enqueue in the caller's transaction (enqueue, enqueue_many,
enqueue_bundle, each with its `_async` twin); the look-ups and administration are manage.py's.

Every function takes the caller's connection and never commits it, so a job is enqueued
exactly when the caller's own writes commit. `schema=None` means `$PGQ_SCHEMA` or "pgq".
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal, TypedDict, Unpack

from pgq_supervisor import db
from pgq_supervisor.db.plans import Plan, atomic, run, run_async
from pgq_supervisor.errors import InvalidInput
from pgq_supervisor.frameworks import AsyncConnLike, ConnLike, as_psycopg, as_psycopg_async
from pgq_supervisor.jobs import (
    Bundle,
    DependencyFailure,
    IdLike,
    JobId,
    JsonValue,
    NewJob,
)
from pgq_supervisor.manage import _schema


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


# Each call below is written once, as a plan (db/plans.py: its validation, its statements and
# what their results mean), which a thin sync shell and a thin async shell run.


def _enqueue_many(jobs: Sequence[NewJob], schema: str | None) -> Plan[list[JobId]]:
    return (yield from db.enqueue_many.plan(_schema(schema), jobs))


def enqueue_many(
    conn: ConnLike, jobs: Sequence[NewJob], *, schema: str | None = None
) -> list[JobId]:
    """Insert many jobs in one statement (one notification per job type, not per row).

    Returns ids in input order; a job whose unique_key is taken gets the holder's id.
    A job's `depends_on` may name jobs enqueued before this call (even in the same
    transaction), not jobs of this batch: their ids are made here.
    """
    return run(as_psycopg(conn), _enqueue_many(jobs, schema))


async def enqueue_many_async(
    conn: AsyncConnLike, jobs: Sequence[NewJob], *, schema: str | None = None
) -> list[JobId]:
    """`enqueue_many` for a psycopg.AsyncConnection."""
    return await run_async(await as_psycopg_async(conn), _enqueue_many(jobs, schema))


def _enqueue_bundle(
    type_: str,
    jobs: Sequence[NewJob],
    on_complete: str | None,
    origin: str | None,
    schema: str | None,
) -> Plan[Bundle]:
    if not jobs:
        raise InvalidInput("a bundle needs at least one job")
    if any(j.unique_key is not None for j in jobs):
        raise InvalidInput("bundle jobs cannot have a unique_key (the bundle would miscount)")
    db.check_bundle(type_, origin, on_complete)
    return (yield from atomic(_insert_bundle(_schema(schema), type_, jobs, on_complete, origin)))


def _insert_bundle(
    s: str, type_: str, jobs: Sequence[NewJob], on_complete: str | None, origin: str | None
) -> Plan[Bundle]:
    bundle = yield from db.insert_bundle.plan(s, type_, len(jobs), origin, on_complete)
    yield from db.enqueue_many.plan(s, jobs, bundle_id=bundle.id)
    return bundle


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
    plan = _enqueue_bundle(type, jobs, on_complete, origin, schema)
    return run(as_psycopg(conn), plan)


async def enqueue_bundle_async(
    conn: AsyncConnLike,
    type: str,
    jobs: Sequence[NewJob],
    *,
    on_complete: str | None = None,
    origin: str | None = None,
    schema: str | None = None,
) -> Bundle:
    """`enqueue_bundle` for a psycopg.AsyncConnection."""
    plan = _enqueue_bundle(type, jobs, on_complete, origin, schema)
    return await run_async(await as_psycopg_async(conn), plan)
