"""Enqueue: validation, one job (sync and async), many jobs (INSERT or COPY), bundles."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from datetime import datetime

from psycopg.rows import scalar_row

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import AsyncConn, Conn, statement, wrapped
from pgq_supervisor.db.params import (
    BundleParams,
    EnqueueManyParams,
    EnqueueRow,
    UniqueKeysParams,
    dump_json,
    new_id,
)
from pgq_supervisor.errors import DatabaseError, InvalidInput
from pgq_supervisor.jobs import Bundle, BundleId, JobId, NewJob, check_type_name

_INT4_MIN, _INT4_MAX = -(2**31), 2**31 - 1  # the integer columns' range


def _validate(job: NewJob) -> None:
    try:
        check_type_name(job.type)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    if not _INT4_MIN <= job.priority <= _INT4_MAX:
        raise InvalidInput(f"priority must fit in 32 bits, got {job.priority}")
    if job.max_retry_count is not None and not 0 <= job.max_retry_count <= _INT4_MAX:
        raise InvalidInput(
            f"max_retry_count must be >= 0 and fit in 32 bits, got {job.max_retry_count}"
        )
    if job.timeout is not None and not job.timeout > 0:
        raise InvalidInput(f"timeout must be > 0 seconds, got {job.timeout}")
    if job.start_at is not None and job.start_at.tzinfo is None:
        raise InvalidInput("start_at must be timezone-aware")


def enqueue_params(job: NewJob) -> EnqueueRow:
    _validate(job)
    return {
        "id": new_id(),
        "type": job.type,
        "payload": dump_json(job.payload),
        "priority": job.priority,
        "start_at": job.start_at,
        "max_retry_count": job.max_retry_count,
        "unique_key": job.unique_key,
        "origin": job.origin,
        "timeout": job.timeout,
    }


def enqueue(conn: Conn, schema: str, job: NewJob) -> JobId:
    params = enqueue_params(job)
    with wrapped():
        if job.unique_key is None:
            conn.execute(statement("enqueue", schema), params)
            return JobId(params["id"])
        with conn.cursor(row_factory=scalar_row) as cur:
            inserted: uuid.UUID | None = cur.execute(
                statement("enqueue_unique", schema), params
            ).fetchone()
        if inserted is not None:
            return JobId(inserted)
        return _existing_for_keys(conn, schema, [job.unique_key])[0]


async def enqueue_async(conn: AsyncConn, schema: str, job: NewJob) -> JobId:
    params = enqueue_params(job)
    with wrapped():
        if job.unique_key is None:
            await conn.execute(statement("enqueue", schema), params)
            return JobId(params["id"])
        async with conn.cursor(row_factory=scalar_row) as cur:
            await cur.execute(statement("enqueue_unique", schema), params)
            inserted: uuid.UUID | None = await cur.fetchone()
        if inserted is not None:
            return JobId(inserted)
        keys: UniqueKeysParams = {"keys": [job.unique_key]}
        async with conn.cursor(row_factory=rows.UNIQUE_HOLDER) as holders:
            await holders.execute(statement("unfinished_by_unique_keys", schema), keys)
            found = await holders.fetchall()
        return _resolve_existing(keys["keys"], found)[0]


def _existing_for_keys(conn: Conn, schema: str, keys: list[str | None]) -> list[JobId]:
    params: UniqueKeysParams = {"keys": keys}
    with conn.cursor(row_factory=rows.UNIQUE_HOLDER) as cur:
        found = cur.execute(statement("unfinished_by_unique_keys", schema), params).fetchall()
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
    for job in jobs:
        _validate(job)
        types.append(job.type)
        payloads.append(dump_json(job.payload))
        priorities.append(job.priority)
        start_ats.append(job.start_at)
        max_retries.append(job.max_retry_count)
        keys.append(job.unique_key)
        origins.append(job.origin)
        timeouts.append(job.timeout)
    seen: set[str] = set()
    for key in keys:
        if key is not None:
            if key in seen:
                raise InvalidInput(f"unique_key {key!r} appears twice in one batch")
            seen.add(key)
    return {
        "bundle_id": bundle_id,
        "ids": _ascending_uuid4s(len(types)),
        "types": types,
        "payloads": payloads,
        "priorities": priorities,
        "start_ats": start_ats,
        "max_retry_counts": max_retries,
        "unique_keys": keys,
        "origins": origins,
        "timeouts": timeouts,
    }


_UUID4_MASK = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_BITS = (0x4000 << 64) | (0x8000 << 48)


def _ascending_uuid4s(n: int) -> list[uuid.UUID]:
    """n random version-4 UUIDs in ascending order. Rows of one statement can share
    created_at and the claim breaks that tie by id, so ascending ids keep a batch FIFO.
    (Sorting ints in C is much cheaper than sorting UUID objects.)"""
    raw = os.urandom(16 * n)
    ints = sorted(
        (int.from_bytes(raw[i : i + 16], "big") & _UUID4_MASK) | _UUID4_BITS
        for i in range(0, 16 * n, 16)
    )
    return [uuid.UUID(int=i) for i in ints]


def enqueue_many(
    conn: Conn, schema: str, jobs: Sequence[NewJob], bundle_id: BundleId | None = None
) -> list[JobId]:
    if not jobs:
        return []
    params = enqueue_many_params(jobs, bundle_id)
    out = [JobId(i) for i in params["ids"]]
    if not any(j.unique_key is not None or j.start_at is not None for j in jobs):
        _enqueue_copy(conn, schema, params)
        return out
    with wrapped(), conn.cursor(row_factory=scalar_row) as cur:
        inserted: set[uuid.UUID] = set(
            cur.execute(statement("enqueue_many", schema), params).fetchall()
        )
        # jobs not inserted: their unique_key is held by an unfinished job, whose id they get
        missing = [i for i, job_id in enumerate(out) if job_id not in inserted]
        if missing:
            keys = [jobs[i].unique_key for i in missing]
            for i, existing in zip(missing, _existing_for_keys(conn, schema, keys), strict=True):
                out[i] = existing
    return out


def _enqueue_copy(conn: Conn, schema: str, params: EnqueueManyParams) -> None:
    """COPY the batch: nothing can conflict (no unique_key) and every job starts now."""
    bundle = params["bundle_id"]
    columns = zip(
        params["ids"],
        params["types"],
        params["payloads"],
        params["priorities"],
        params["max_retry_counts"],
        params["origins"],
        params["timeouts"],
        strict=True,
    )
    with wrapped(), conn.cursor() as cur, cur.copy(statement("enqueue_copy", schema)) as copy:
        for job_id, type_, payload, priority, max_retry, origin, timeout in columns:
            copy.write_row((job_id, bundle, type_, payload, priority, max_retry, origin, timeout))


def insert_bundle(
    conn: Conn, schema: str, type_: str, num_jobs: int, origin: str | None, on_complete: str | None
) -> Bundle:
    try:
        check_type_name(type_)
        if on_complete is not None:
            check_type_name(on_complete)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    params: BundleParams = {
        "id": new_id(),
        "type": type_,
        "origin": origin,
        "num_jobs": num_jobs,
        "on_complete": on_complete,
    }
    with wrapped(), conn.cursor(row_factory=rows.BUNDLE) as cur:
        bundle = cur.execute(statement("insert_bundle", schema), params).fetchone()
    assert bundle is not None
    return bundle
