"""Dedup windows (schema/0018): `unique_for` makes a finished job created within the window
hold its unique_key too. The producers of one key serialise on a transaction-scoped advisory
lock taken by `unique_holders`, and insert the keys found free in the same `atomic` block.

`enqueue` and `enqueue_many` here wrap enqueueing.py's (the db package exports these, each a
plans.Twin: `enqueue(conn, ...)` sync, `await enqueue.run_async(aconn, ...)` async): a job
without a window goes straight through, a windowed one is looked up first."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from pgq_supervisor.db import debounce, enqueueing, rows
from pgq_supervisor.db.connection import statement, wrapped
from pgq_supervisor.db.option_params import OrderedLinkParams, UniqueHoldersParams
from pgq_supervisor.db.plans import Plan, Twin, atomic, execute, fetch
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


def holders(schema: str, jobs: Sequence[NewJob]) -> Plan[dict[str, JobId]]:
    """The job holding each key of `jobs` (all with unique_for), by key; a key found free is
    locked until the caller's transaction ends: insert it in that transaction."""
    with wrapped():
        query = statement("unique_holders", schema)
        found = yield from fetch(query, _params(jobs), rows.UNIQUE_HOLDER)
    return {h.unique_key: h.id for h in found}


def _windowed(job: NewJob) -> bool:
    return job.unique_for is not None or job.unique_states is not None


@Twin
def enqueue(schema: str, job: NewJob) -> Plan[JobId]:
    """enqueueing.enqueue, or with a window: the key's holder's id, else the job inserted
    (debounce.py's with replace=True)."""
    if job.replace:
        return (yield from debounce.enqueue(schema, job))
    if job.ordered_key is not None:
        check_ordered(job)
        enqueueing.check_job(job)  # before the savepoint
        return (yield from atomic(_enqueue_ordered(schema, job, job.ordered_key)))
    if not _windowed(job):
        return (yield from enqueueing.enqueue(schema, job))
    check(job)
    enqueueing.check_job(job)
    return (yield from atomic(_enqueue_windowed(schema, job)))


enqueue_async = enqueue.run_async


def _enqueue_ordered(schema: str, job: NewJob, key: str) -> Plan[JobId]:
    job_id = yield from enqueueing.enqueue(schema, job)
    yield from _link(schema, [job_id], [key])
    return job_id


def _enqueue_windowed(schema: str, job: NewJob) -> Plan[JobId]:
    held = yield from holders(schema, [job])
    if held:
        return next(iter(held.values()))
    return (yield from enqueueing.enqueue(schema, job))


@Twin
def enqueue_many(
    schema: str, jobs: Sequence[NewJob], bundle_id: BundleId | None = None
) -> Plan[list[JobId]]:
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
        return (yield from enqueueing.enqueue_many(schema, jobs, bundle_id))
    ordered = [j for j in flagged if j.ordered_key is not None]
    if ordered:
        return (yield from _enqueue_many_ordered(schema, jobs, bundle_id, ordered))
    windowed = flagged
    if any(j.replace for j in windowed):
        # each replacement is a look-up and a write under the key's lock: one job at a time
        raise InvalidInput("replace=True is for enqueue and enqueue_async, not enqueue_many")
    for job in windowed:
        check(job)
    enqueueing.check_jobs(jobs)  # before the savepoint and the look-up
    return (yield from atomic(_enqueue_many_windowed(schema, jobs, bundle_id, windowed)))


def _enqueue_many_windowed(
    schema: str, jobs: Sequence[NewJob], bundle_id: BundleId | None, windowed: list[NewJob]
) -> Plan[list[JobId]]:
    held = yield from holders(schema, windowed)
    free = [j for j in jobs if not _windowed(j) or j.unique_key not in held]
    inserted = iter((yield from enqueueing.enqueue_many(schema, free, bundle_id)) if free else [])
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


def _link(schema: str, ids: list[JobId], keys: list[str]) -> Plan[None]:
    params: OrderedLinkParams = {"ids": ids, "keys": keys}
    with wrapped():
        yield from execute(statement("ordered_link", schema), params)


def _enqueue_many_ordered(
    schema: str,
    jobs: Sequence[NewJob],
    bundle_id: BundleId | None,
    ordered: Sequence[NewJob],
) -> Plan[list[JobId]]:
    """The batch inserted (ids ascending: its enqueue order), then its ordered jobs linked in
    that order, in one transaction."""
    for job in ordered:
        check_ordered(job)
    if any(_windowed(j) or j.replace for j in jobs):
        raise InvalidInput("a batch with ordered_key jobs cannot have unique_for or replace jobs")
    # bad input found inside (enqueue_many): rolled back to the savepoint
    return (yield from atomic(_insert_and_link(schema, jobs, bundle_id)))


def _insert_and_link(
    schema: str, jobs: Sequence[NewJob], bundle_id: BundleId | None
) -> Plan[list[JobId]]:
    ids = yield from enqueueing.enqueue_many(schema, jobs, bundle_id)
    pairs = [(i, j.ordered_key) for i, j in zip(ids, jobs, strict=True) if j.ordered_key]
    yield from _link(schema, [i for i, _ in pairs], [k for _, k in pairs])
    return ids
