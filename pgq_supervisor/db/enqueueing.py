"""Enqueue: validation, one job, many jobs (INSERT or COPY), bundles; each written once as a
plan (db/plans.py) that windows.py's `enqueue` and `enqueue_many` run sync or async.

Jobs with dependencies are inserted waiting and then linked (`link_dependencies`, schema/0005)
in one `atomic` block, so an unknown dependency id leaves nothing written and the caller's
transaction usable.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

import psycopg
from psycopg.rows import scalar_row

from pgq_supervisor import ids
from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import statement, wrapped
from pgq_supervisor.db.params import (
    BundleParams,
    EnqueueManyParams,
    EnqueueRow,
    LinkDependenciesParams,
    UniqueKeysParams,
    new_id,
    time_ordered,
)
from pgq_supervisor.db.plans import Plan, Twin, atomic, copy, execute, fetch, fetch_one
from pgq_supervisor.errors import DatabaseError, InvalidInput
from pgq_supervisor.inputs import MAX_ORIGIN, check_new_job, check_text
from pgq_supervisor.jobs import Bundle, BundleId, JobId, NewJob, check_type_name
from pgq_supervisor.jsontext import dump_payload, max_payload_bytes
from pgq_supervisor.tracing import current_traceparent


def _dependencies(job: NewJob) -> list[uuid.UUID] | None:
    """The job's dependency ids, each once, in the order given (None: it has none)."""
    out: list[uuid.UUID] = []
    for dep in ids.job_ids(job.depends_on, "depends_on"):
        if dep not in out:
            out.append(dep)
    return out or None


# The SQLSTATE link_dependencies raises for an id that names no job.
_UNKNOWN_DEPENDENCY = "PGQ01"


@contextmanager
def _unknown_dependency() -> Iterator[None]:
    try:
        yield
    except psycopg.Error as exc:
        if exc.sqlstate != _UNKNOWN_DEPENDENCY:
            raise
        raise InvalidInput(f"depends_on: {exc.diag.message_primary or exc}") from exc


def _link_params(
    job_ids: Sequence[uuid.UUID], deps: Sequence[list[uuid.UUID] | None]
) -> LinkDependenciesParams:
    params: LinkDependenciesParams = {"jobs": [], "deps": []}
    for job_id, its in zip(job_ids, deps, strict=True):
        for dep in its or ():
            params["jobs"].append(job_id)
            params["deps"].append(dep)
    return params


def _payload_of(i: int, n: int) -> str:
    """What an error names for the payload of a batch's job `i` (of `n`)."""
    return "payload" if n == 1 else f"payload of jobs[{i}]"


def check_job(job: NewJob, what: str = "payload", cap: int | None = None) -> None:
    """Everything enqueue_params checks, for the paths that open a savepoint or look up a
    key before they insert: InvalidInput before any statement touches the transaction."""
    check_new_job(job)
    dump_payload(job.payload, what, cap)


def check_jobs(jobs: Sequence[NewJob]) -> None:
    """check_job for each job of a batch, its index in the error."""
    cap = max_payload_bytes()
    for i, job in enumerate(jobs):
        check_job(job, _payload_of(i, len(jobs)), cap)


def enqueue_params(job: NewJob) -> EnqueueRow:
    check_new_job(job)
    return {
        "id": new_id(),
        "type": job.type,
        "payload": dump_payload(job.payload),
        "priority": job.priority,
        "start_at": job.start_at,
        "max_retry_count": job.max_retry_count,
        "unique_key": job.unique_key,
        "origin": job.origin,
        "timeout": job.timeout,
        "depends_on": (deps := _dependencies(job)),
        "on_dependency_failure": None if deps is None else job.on_dependency_failure,
        "concurrency_key": job.concurrency_key,
        "tenant": job.tenant,
        "trace_context": current_traceparent(),
    }


def enqueue(schema: str, job: NewJob) -> Plan[JobId]:
    params = enqueue_params(job)
    deps = params["depends_on"]
    if deps is None:
        return (yield from _enqueue_one(schema, job, params))
    return (yield from atomic(_enqueue_linked(schema, job, params, deps)))


def _enqueue_linked(
    schema: str, job: NewJob, params: EnqueueRow, deps: list[uuid.UUID]
) -> Plan[JobId]:
    with _unknown_dependency():
        job_id = yield from _enqueue_one(schema, job, params)
        if job_id == params["id"]:  # else its unique_key is held: that job's links stand
            link = _link_params([job_id], [deps])
            yield from execute(statement("link_dependencies", schema), link)
        return job_id


def _enqueue_one(schema: str, job: NewJob, params: EnqueueRow) -> Plan[JobId]:
    with wrapped():
        inserted: uuid.UUID | None = yield from fetch_one(
            statement("enqueue", schema), params, scalar_row
        )
        if inserted is not None:
            return JobId(inserted)
        # no row: the job's unique_key is held (a job without one is always inserted)
        return (yield from _existing_for_keys(schema, [job.unique_key]))[0]


def _existing_for_keys(schema: str, keys: list[str | None]) -> Plan[list[JobId]]:
    params: UniqueKeysParams = {"keys": keys}
    query = statement("unfinished_by_unique_keys", schema)
    found = yield from fetch(query, params, rows.UNIQUE_HOLDER)
    return _resolve_existing(keys, found)


def _resolve_existing(keys: list[str | None], holders: list[rows.UniqueHolder]) -> list[JobId]:
    found = {h.unique_key: h.id for h in holders}
    out = []
    for key in keys:
        if key is None or key not in found:
            # The holder of the key finished between our insert and this look-up.
            raise DatabaseError(f"unique_key {key!r} conflicted but its job is gone; retry")
        out.append(found[key])
    return out


def enqueue_many_params(jobs: Sequence[NewJob], bundle_id: BundleId | None) -> EnqueueManyParams:
    types: list[str] = []
    payloads: list[str] = []
    priorities: list[int] = []
    start_ats: list[datetime | None] = []
    max_retries: list[int | None] = []
    keys: list[str | None] = []
    origins: list[str | None] = []
    timeouts: list[float | None] = []
    depends_ons: list[str | None] = []
    on_failures: list[str | None] = []
    concurrency_keys: list[str | None] = []
    tenants: list[str | None] = []
    cap = max_payload_bytes()
    for i, job in enumerate(jobs):
        check_new_job(job)
        types.append(job.type)
        payloads.append(dump_payload(job.payload, _payload_of(i, len(jobs)), cap))
        priorities.append(job.priority)
        start_ats.append(job.start_at)
        max_retries.append(job.max_retry_count)
        keys.append(job.unique_key)
        origins.append(job.origin)
        timeouts.append(job.timeout)
        deps = _dependencies(job)
        depends_ons.append(None if deps is None else "{" + ",".join(map(str, deps)) + "}")
        on_failures.append(None if deps is None else job.on_dependency_failure)
        concurrency_keys.append(job.concurrency_key)
        tenants.append(job.tenant)
    seen: set[str] = set()
    for key in keys:
        if key is not None:
            if key in seen:
                raise InvalidInput(f"unique_key {key!r} appears twice in one batch")
            seen.add(key)
    return {
        "bundle_id": bundle_id,
        "ids": _ascending_ids(len(types)),
        "types": types,
        "payloads": payloads,
        "priorities": priorities,
        "start_ats": start_ats,
        "max_retry_counts": max_retries,
        "unique_keys": keys,
        "origins": origins,
        "timeouts": timeouts,
        "depends_ons": depends_ons,
        "on_dependency_failures": on_failures,
        "concurrency_keys": concurrency_keys,
        "tenants": tenants,
        "trace_context": current_traceparent(),
    }


_UUID4_MASK = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_BITS = (0x4000 << 64) | (0x8000 << 48)


def _ascending_ids(n: int) -> list[uuid.UUID]:
    """n time-ordered ids (params.time_ordered: one millisecond, random tails) in ascending
    order. Rows of one statement can share created_at and the claim breaks that tie by id, so
    ascending ids keep a batch FIFO. (Sorting ints in C is much cheaper than sorting UUIDs.)"""
    raw = os.urandom(16 * n)
    at = time.time_ns()
    ints = sorted(
        time_ordered((int.from_bytes(raw[i : i + 16], "big") & _UUID4_MASK) | _UUID4_BITS, at)
        for i in range(0, 16 * n, 16)
    )
    return [uuid.UUID(int=i) for i in ints]


_SEQUENCE_BITS = 32  # the low bits a batch counts in: up to 4 billion jobs per batch


def _sequential_ids_start() -> int:
    """The first of up to 2**32 consecutive time-ordered ids (as ints: this millisecond, 42
    random bits per batch, the low 32 count up): ascending, as `_ascending_ids`, without a
    random draw and a sort per id."""
    random = (int.from_bytes(os.urandom(16), "big") & _UUID4_MASK) | _UUID4_BITS
    return time_ordered(random, time.time_ns()) & ~((1 << _SEQUENCE_BITS) - 1)


def enqueue_many(
    schema: str, jobs: Sequence[NewJob], bundle_id: BundleId | None = None
) -> Plan[list[JobId]]:
    if not jobs:
        return []
    if all(_copyable(job) for job in jobs):
        return (yield from _enqueue_copy(schema, jobs, bundle_id))
    params = enqueue_many_params(jobs, bundle_id)
    if any(d is not None for d in params["depends_ons"]):
        return (yield from atomic(_insert_many_linked(schema, jobs, params)))
    if any(k is not None for k in params["unique_keys"]):
        # the insert and the look-up of the holders of taken keys, in one transaction: on an
        # autocommit connection a failed look-up must not leave the inserted rows behind
        return (yield from atomic(_insert_many(schema, jobs, params)))
    return (yield from _insert_many(schema, jobs, params))


def _insert_many_linked(
    schema: str, jobs: Sequence[NewJob], params: EnqueueManyParams
) -> Plan[list[JobId]]:
    # Jobs of the batch cannot depend on each other (their ids are made here), so every
    # edge points to a job that existed before: no cycle can form.
    with _unknown_dependency():
        out = yield from _insert_many(schema, jobs, params)
        inserted = [(i, job_id) for i, job_id in enumerate(out) if job_id == params["ids"][i]]
        deps = [_dependencies(jobs[i]) for i, _ in inserted]
        link = _link_params([job_id for _, job_id in inserted], deps)
        if link["jobs"]:
            yield from execute(statement("link_dependencies", schema), link)
        return out


def _insert_many(
    schema: str, jobs: Sequence[NewJob], params: EnqueueManyParams
) -> Plan[list[JobId]]:
    out = [JobId(i) for i in params["ids"]]
    with wrapped():
        found = yield from fetch(statement("enqueue_many", schema), params, scalar_row)
        inserted: set[uuid.UUID] = set(found)
        # jobs not inserted: their unique_key is held by an unfinished job, whose id they get
        missing = [i for i, job_id in enumerate(out) if job_id not in inserted]
        if missing:
            keys = [jobs[i].unique_key for i in missing]
            existing = yield from _existing_for_keys(schema, keys)
            for i, holder in zip(missing, existing, strict=True):
                out[i] = holder
    return out


def _copyable(job: NewJob) -> bool:
    """Nothing of the job can conflict (no unique_key) or wait (no start_at, no depends_on):
    it can be COPYed with the defaults of the other columns."""
    deps = job.depends_on
    return (
        job.unique_key is None
        and job.start_at is None
        and not deps
        and not isinstance(deps, (str, bytes))  # a bad depends_on takes the path that says so
    )


# COPY's text format: backslash escapes, \N for NULL (PostgreSQL's docs, "File Formats").
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NULL = "\\N"


def _copy_text(value: str | None) -> str:
    return _NULL if value is None else value.translate(_COPY_ESCAPES)


def _copy_int(value: int | None) -> str:
    return _NULL if value is None else str(int(value))  # int(): an IntEnum prints its name


def _copy_float(value: float | None) -> str:
    return _NULL if value is None else repr(float(value))


# Rows per write of the COPY: the server inserts one chunk while the next is formatted.
_COPY_CHUNK = 100


def _enqueue_copy(
    schema: str, jobs: Sequence[NewJob], bundle_id: BundleId | None
) -> Plan[list[JobId]]:
    """COPY the batch, in COPY's text format made here (psycopg's per-value adaptation,
    write_row, cost more than the server's whole insert), streamed in chunks so that the
    client's formatting overlaps the server's inserting. Everything that can refuse a job is
    checked before the COPY starts: bad input raises InvalidInput with nothing sent, and the
    caller's transaction stays usable. Ids go as 32 hex digits, which uuid_in accepts."""
    payloads = []
    cap = max_payload_bytes()
    for i, job in enumerate(jobs):
        check_new_job(job)
        payloads.append(dump_payload(job.payload, _payload_of(i, len(jobs)), cap))
    first_id = _sequential_ids_start()
    ids: list[JobId] = []  # made chunk by chunk, while the server inserts the chunk before
    bundle = _NULL if bundle_id is None else bundle_id.hex
    trace_context = _copy_text(current_traceparent())
    types: dict[str, str] = {}  # each type of the batch, escaped once

    def chunks() -> Iterator[str]:
        for start in range(0, len(jobs), _COPY_CHUNK):
            lines = []
            for i in range(start, min(start + _COPY_CHUNK, len(jobs))):
                job = jobs[i]
                type_ = types.get(job.type)
                if type_ is None:
                    type_ = types[job.type] = _copy_text(job.type)
                payload = payloads[i]  # ASCII JSON: no tab, newline or CR, maybe backslashes
                if "\\" in payload:
                    payload = payload.replace("\\", "\\\\")
                lines.append(
                    f"{first_id + i:032x}\t{bundle}\t{type_}\t{payload}\t{_copy_int(job.priority)}"
                    f"\t{_copy_int(job.max_retry_count)}\t{_copy_text(job.origin)}"
                    f"\t{_copy_float(job.timeout)}\t{trace_context}"
                    f"\t{_copy_text(job.concurrency_key)}\t{_copy_text(job.tenant)}\n"
                )
            yield "".join(lines)
            ids.extend(JobId(uuid.UUID(int=first_id + i)) for i in range(start, start + len(lines)))

    with wrapped():
        yield from copy(statement("enqueue_copy", schema), chunks())
    return ids


def check_bundle(type_: str, origin: str | None, on_complete: str | None) -> None:
    """InvalidInput naming what insert_bundle would refuse."""
    try:
        check_type_name(type_)
        if on_complete is not None:
            check_type_name(on_complete)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    if origin is not None:
        check_text(origin, "origin", max_chars=MAX_ORIGIN)


@Twin
def insert_bundle(
    schema: str, type_: str, num_jobs: int, origin: str | None, on_complete: str | None
) -> Plan[Bundle]:
    check_bundle(type_, origin, on_complete)
    params: BundleParams = {
        "id": new_id(),
        "type": type_,
        "origin": origin,
        "num_jobs": num_jobs,
        "on_complete": on_complete,
    }
    with wrapped():
        bundle = yield from fetch_one(statement("insert_bundle", schema), params, rows.BUNDLE)
    assert bundle is not None
    return bundle
