"""Dedup windows (schema/0018): `unique_for` makes a finished job created within the window
hold its unique_key too. The producers of one key serialise on a transaction-scoped advisory
lock taken by `unique_holders`, and insert the keys found free in the same `atomic` block.

`enqueue`, `enqueue_async` and `enqueue_many` here wrap enqueueing.py's (the db package
exports these): a job without a window goes straight through, a windowed one is looked up
first."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from pgq_supervisor.db import debounce, enqueueing, rows
from pgq_supervisor.db.connection import (
    AsyncConn,
    Conn,
    atomic,
    atomic_async,
    cursor,
    cursor_async,
    statement,
    wrapped,
)
from pgq_supervisor.db.option_params import OrderedLinkParams, UniqueHoldersParams
from pgq_supervisor.errors import InvalidInput
from pgq_supervisor.inputs import check_key
from pgq_supervisor.jobs import MAX_DURATION, BundleId, JobId, JobState, NewJob

# Unfinished jobs always hold their key (job_unique, schema/0027): only finished states are a
# choice.
_FINISHED = ("succeeded", "failed", "cancelled")
_DEFAULT_STATES = ("pending", "running", "succeeded")


def check(job: NewJob) -> None:
    """InvalidInput unless the job's window options are coherent (only called when it has one)."""
    if job.unique_key is None:
        raise InvalidInput("unique_for and unique_states need a unique_key")
    if job.unique_for is None:
        raise InvalidInput("unique_states needs unique_for (the window they count in)")
    window = seconds(job)
    if not 0 < window <= MAX_DURATION:
        raise InvalidInput(f"unique_for must be > 0 seconds and at most 100 years, got {window!r}")
    given = job.unique_states
    if given is None:
        return
    if isinstance(given, str) or not all(isinstance(s, str) for s in given):
        raise InvalidInput(f"unique_states must be a sequence of job states, got {given!r}")
    unknown = [s for s in given if s not in {st.value for st in JobState}]
    if unknown:
        raise InvalidInput(f"unique_states: {unknown[0]!r} is not a job state")
    if not {"pending", "running"} <= set(given):
        raise InvalidInput(
            "unique_states must include 'pending' and 'running': an unfinished job always"
            " holds its unique_key"
        )


def seconds(job: NewJob) -> float:
    window = job.unique_for
    if isinstance(window, timedelta):
        return window.total_seconds()
    if isinstance(window, bool) or not isinstance(window, int | float):
        raise InvalidInput(f"unique_for must be seconds or a timedelta, got {window!r}")
    return float(window)


def _params(jobs: Sequence[NewJob]) -> UniqueHoldersParams:
    return {
        "keys": [j.unique_key for j in jobs],
        "windows": [seconds(j) for j in jobs],
        "states": [
            ",".join(s for s in (j.unique_states or _DEFAULT_STATES) if s in _FINISHED)
            for j in jobs
        ],
    }


def holders(conn: Conn, schema: str, jobs: Sequence[NewJob]) -> dict[str, JobId]:
    """The job holding each key of `jobs` (all with unique_for), by key; a key found free is
    locked until the caller's transaction ends: insert it in that transaction."""
    with wrapped(), cursor(conn, rows.UNIQUE_HOLDER) as cur:
        found = cur.execute(statement("unique_holders", schema), _params(jobs)).fetchall()
    return {h.unique_key: h.id for h in found}


async def holders_async(conn: AsyncConn, schema: str, jobs: Sequence[NewJob]) -> dict[str, JobId]:
    """`holders` on an async connection."""
    with wrapped():
        async with cursor_async(conn, rows.UNIQUE_HOLDER) as cur:
            await cur.execute(statement("unique_holders", schema), _params(jobs))
            found = await cur.fetchall()
    return {h.unique_key: h.id for h in found}


def _windowed(job: NewJob) -> bool:
    return job.unique_for is not None or job.unique_states is not None


def enqueue(conn: Conn, schema: str, job: NewJob) -> JobId:
    """enqueueing.enqueue, or with a window: the key's holder's id, else the job inserted
    (debounce.py's with replace=True)."""
    if job.replace:
        return debounce.enqueue(conn, schema, job)
    if job.ordered_key is not None:
        check_ordered(job)
        enqueueing.check_job(job)  # before the savepoint
        with atomic(conn):
            job_id = enqueueing.enqueue(conn, schema, job)
            _link(conn, schema, [job_id], [job.ordered_key])
            return job_id
    if not _windowed(job):
        return enqueueing.enqueue(conn, schema, job)
    check(job)
    enqueueing.check_job(job)
    with atomic(conn):
        held = holders(conn, schema, [job])
        if held:
            return next(iter(held.values()))
        return enqueueing.enqueue(conn, schema, job)


async def enqueue_async(conn: AsyncConn, schema: str, job: NewJob) -> JobId:
    """`enqueue` on an async connection."""
    if job.replace:
        return await debounce.enqueue_async(conn, schema, job)
    if job.ordered_key is not None:
        check_ordered(job)
        enqueueing.check_job(job)
        async with atomic_async(conn):
            job_id = await enqueueing.enqueue_async(conn, schema, job)
            link: OrderedLinkParams = {"ids": [job_id], "keys": [job.ordered_key]}
            with wrapped():
                await conn.execute(statement("ordered_link", schema), link)
            return job_id
    if not _windowed(job):
        return await enqueueing.enqueue_async(conn, schema, job)
    check(job)
    enqueueing.check_job(job)
    async with atomic_async(conn):
        held = await holders_async(conn, schema, [job])
        if held:
            return next(iter(held.values()))
        return await enqueueing.enqueue_async(conn, schema, job)


def enqueue_many(
    conn: Conn, schema: str, jobs: Sequence[NewJob], bundle_id: BundleId | None = None
) -> list[JobId]:
    """enqueueing.enqueue_many; the windowed jobs of the batch whose key is held get the
    holder's id and are not inserted. Ids in input order."""
    # one pass over the batch for every option this module handles: the bulk path's only cost
    flagged = [
        j
        for j in jobs
        if j.unique_for is not None
        or j.unique_states is not None
        or j.replace
        or j.ordered_key is not None
    ]
    if not flagged:
        return enqueueing.enqueue_many(conn, schema, jobs, bundle_id)
    ordered = [j for j in flagged if j.ordered_key is not None]
    if ordered:
        return _enqueue_many_ordered(conn, schema, jobs, bundle_id, ordered)
    windowed = flagged
    if any(j.replace for j in windowed):
        # each replacement is a look-up and a write under the key's lock: one job at a time
        raise InvalidInput("replace=True is for enqueue and enqueue_async, not enqueue_many")
    if not windowed:
        return enqueueing.enqueue_many(conn, schema, jobs, bundle_id)
    for job in windowed:
        check(job)
    enqueueing.check_jobs(jobs)  # before the savepoint and the look-up
    with atomic(conn):
        held = holders(conn, schema, windowed)
        free = [j for j in jobs if not _windowed(j) or j.unique_key not in held]
        inserted = iter(enqueueing.enqueue_many(conn, schema, free, bundle_id) if free else [])
        out = []
        for job in jobs:
            key = job.unique_key
            out.append(held[key] if _windowed(job) and key in held else next(inserted))
        return out


def check_ordered(job: NewJob) -> None:
    """InvalidInput unless the job's ordered_key is a key and it has no option it contradicts."""
    check_key(job.ordered_key, "ordered_key")
    if job.depends_on or job.unique_key is not None:
        raise InvalidInput("ordered_key cannot be combined with depends_on or unique_key")


def _link(conn: Conn, schema: str, ids: list[JobId], keys: list[str]) -> None:
    params: OrderedLinkParams = {"ids": ids, "keys": keys}
    with wrapped():
        conn.execute(statement("ordered_link", schema), params)


def _enqueue_many_ordered(
    conn: Conn,
    schema: str,
    jobs: Sequence[NewJob],
    bundle_id: BundleId | None,
    ordered: Sequence[NewJob],
) -> list[JobId]:
    """The batch inserted (ids ascending: its enqueue order), then its ordered jobs linked in
    that order, in one transaction."""
    for job in ordered:
        check_ordered(job)
    if any(_windowed(j) or j.replace for j in jobs):
        raise InvalidInput("a batch with ordered_key jobs cannot have unique_for or replace jobs")
    with atomic(conn):  # bad input found inside (enqueue_many): rolled back to the savepoint
        ids = enqueueing.enqueue_many(conn, schema, jobs, bundle_id)
        pairs = [(i, j.ordered_key) for i, j in zip(ids, jobs, strict=True) if j.ordered_key]
        _link(conn, schema, [i for i, _ in pairs], [k for _, k in pairs])
        return ids
