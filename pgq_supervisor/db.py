"""The only module that executes SQL. Statements come from sql/queries.sql by name.

Functions here never commit: the caller owns the transaction (or uses an autocommit
connection). psycopg errors are wrapped once, here, into `DatabaseError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, LiteralString, TypedDict

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from pgq_supervisor import sql as queries
from pgq_supervisor.errors import DatabaseError, DatabaseUnavailable, InvalidInput, JobNotFound
from pgq_supervisor.jobs import (
    AttemptKind,
    Bundle,
    BundleId,
    EndedAttempt,
    Job,
    JobId,
    JobRecord,
    JobState,
    JsonValue,
    LeaseToken,
    NewJob,
    TypeStats,
    check_type_name,
)

Conn = psycopg.Connection[TupleRow]
AsyncConn = psycopg.AsyncConnection[TupleRow]

DEFAULT_SCHEMA = "pgq"


def default_schema() -> str:
    return os.environ.get("PGQ_SCHEMA") or DEFAULT_SCHEMA


@contextlib.contextmanager
def wrapped() -> Iterator[None]:
    """Turn psycopg's errors into ours, once, at the database boundary."""
    try:
        yield
    except pg_errors.UniqueViolation as exc:
        raise InvalidInput(f"unique_key conflict: {exc.diag.message_detail or exc}") from exc
    except pg_errors.CheckViolation as exc:
        raise InvalidInput(f"rejected by the database: {exc.diag.message_primary}") from exc
    except psycopg.Error as exc:
        raise DatabaseError(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}") from exc


def _q(name: LiteralString, schema: str) -> bytes:
    return queries.query_bytes(name, schema)


# A \u0000 escape not itself escaped (an even run of backslashes before it): jsonb rejects it.
_JSON_NUL_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def dump_json(value: object, what: str = "payload") -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not JSON-serializable: {exc}") from exc
    if _JSON_NUL_RE.search(text):
        # Caught here, not by the server: in a batch one such value would fail the statement
        # for every job in it.
        raise InvalidInput(f"{what} contains a NUL character (\\u0000), which jsonb cannot store")
    return text


# ---- enqueue --------------------------------------------------------------------------------


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


def enqueue_params(job: NewJob) -> dict[str, Any]:
    _validate(job)
    return {
        "id": uuid.uuid4(),
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
            conn.execute(_q("enqueue", schema), params)
            return JobId(params["id"])
        row = conn.execute(_q("enqueue_unique", schema), params).fetchone()
        if row is not None:
            return JobId(row[0])
        return _existing_for_keys(conn, schema, [job.unique_key])[0]


async def enqueue_async(conn: AsyncConn, schema: str, job: NewJob) -> JobId:
    params = enqueue_params(job)
    with wrapped():
        if job.unique_key is None:
            await conn.execute(_q("enqueue", schema), params)
            return JobId(params["id"])
        cur = await conn.execute(_q("enqueue_unique", schema), params)
        row = await cur.fetchone()
        if row is not None:
            return JobId(row[0])
        cur = await conn.execute(
            _q("unfinished_by_unique_keys", schema), {"keys": [job.unique_key]}
        )
        found = {k: JobId(i) for k, i in await cur.fetchall()}
        return _resolve_existing([job.unique_key], found)[0]


def _existing_for_keys(conn: Conn, schema: str, keys: list[str | None]) -> list[JobId]:
    rows = conn.execute(_q("unfinished_by_unique_keys", schema), {"keys": keys}).fetchall()
    return _resolve_existing(keys, {k: JobId(i) for k, i in rows})


def _resolve_existing(keys: list[str | None], found: dict[str, JobId]) -> list[JobId]:
    out = []
    for key in keys:
        if key is None or key not in found:
            # The holder of the key finished between our insert and this look-up.
            raise DatabaseError(f"unique_key {key!r} conflicted but its job is gone; retry")
        out.append(found[key])
    return out


def enqueue_many_params(jobs: Sequence[NewJob], bundle_id: BundleId | None) -> dict[str, Any]:
    types, payloads, priorities, start_ats = [], [], [], []
    max_retries, keys, origins, timeouts = [], [], [], []
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
    ids = _ascending_uuid4s(len(types))
    seen: set[str] = set()
    for key in keys:
        if key is not None:
            if key in seen:
                raise InvalidInput(f"unique_key {key!r} appears twice in one batch")
            seen.add(key)
    return {
        "bundle_id": bundle_id,
        "ids": ids,
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


def _ids_in_order(
    params: dict[str, Any], inserted: set[uuid.UUID]
) -> tuple[list[JobId], list[int]]:
    """Input-order ids; indexes of jobs not inserted (their unique_key was taken)."""
    ids: list[uuid.UUID] = params["ids"]
    missing = [i for i, job_id in enumerate(ids) if job_id not in inserted]
    return [JobId(i) for i in ids], missing


def enqueue_many(
    conn: Conn, schema: str, jobs: Sequence[NewJob], bundle_id: BundleId | None = None
) -> list[JobId]:
    if not jobs:
        return []
    params = enqueue_many_params(jobs, bundle_id)
    if not any(j.unique_key is not None or j.start_at is not None for j in jobs):
        return _enqueue_copy(conn, schema, params)
    with wrapped():
        rows = conn.execute(_q("enqueue_many", schema), params).fetchall()
        out, missing = _ids_in_order(params, {r[0] for r in rows})
        if missing:
            keys = [jobs[i].unique_key for i in missing]
            for i, existing in zip(missing, _existing_for_keys(conn, schema, keys), strict=True):
                out[i] = existing
    return out


def _enqueue_copy(conn: Conn, schema: str, params: dict[str, Any]) -> list[JobId]:
    """COPY the batch: nothing can conflict (no unique_key) and every job starts now."""
    bundle = params["bundle_id"]
    rows = zip(
        params["ids"],
        params["types"],
        params["payloads"],
        params["priorities"],
        params["max_retry_counts"],
        params["origins"],
        params["timeouts"],
        strict=True,
    )
    with wrapped(), conn.cursor() as cur, cur.copy(_q("enqueue_copy", schema)) as copy:
        for job_id, type_, payload, priority, max_retry, origin, timeout in rows:
            copy.write_row((job_id, bundle, type_, payload, priority, max_retry, origin, timeout))
    return [JobId(i) for i in params["ids"]]


def insert_bundle(
    conn: Conn, schema: str, type_: str, num_jobs: int, origin: str | None, on_complete: str | None
) -> Bundle:
    try:
        check_type_name(type_)
        if on_complete is not None:
            check_type_name(on_complete)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    params = {
        "id": uuid.uuid4(),
        "type": type_,
        "origin": origin,
        "num_jobs": num_jobs,
        "on_complete": on_complete,
    }
    with wrapped():
        row = conn.execute(_q("insert_bundle", schema), params).fetchone()
    assert row is not None
    return _bundle(row)


# ---- worker side ----------------------------------------------------------------------------


def claim(
    conn: Conn,
    schema: str,
    *,
    worker_id: str,
    types: Sequence[str],
    max_retry_counts: Sequence[int],
    limit: int,
) -> list[Job]:
    params = _claim_params(worker_id, types, max_retry_counts, limit)
    with wrapped():
        rows = conn.execute(_q("claim", schema), params).fetchall()
    return _claimed(rows)


class ClaimArgs(TypedDict):
    worker_id: str
    types: Sequence[str]
    max_retry_counts: Sequence[int]
    limit: int


def _claim_params(
    worker_id: str, types: Sequence[str], max_retry_counts: Sequence[int], limit: int
) -> dict[str, object]:
    return {
        "types": list(types),
        "max_retry_counts": list(max_retry_counts),
        "limit": limit,
        "worker_id": worker_id,
        "lease": uuid.uuid4(),
    }


def _claimed(rows: Sequence[Sequence[Any]]) -> list[Job]:
    jobs = [
        Job(
            id=JobId(r[0]),
            type=r[1],
            payload=r[2],
            priority=r[3],
            attempt=r[4],
            max_retry_count=r[5],
            timeout=r[6],
            bundle_id=BundleId(r[7]) if r[7] is not None else None,
            lease=LeaseToken(r[8]),
        )
        for r in rows
    ]
    # RETURNING has no order; run the batch in claim order.
    jobs.sort(key=lambda j: -j.priority)
    return jobs


def heartbeat(conn: Conn, schema: str, ids: Sequence[JobId], lease: LeaseToken) -> set[JobId]:
    """Refresh `worker_alive_at`; returns the ids still held (the others lost their lease)."""
    with wrapped():
        rows = conn.execute(_q("heartbeat", schema), {"ids": list(ids), "lease": lease}).fetchall()
    return {JobId(r[0]) for r in rows}


def lock_bundles(
    conn: Conn,
    schema: str,
    bundle_ids: Sequence[BundleId],
    job_ids: Sequence[JobId] = (),
    lease: LeaseToken | None = None,
) -> None:
    """Lock the batch's job rows (those still under `lease`), then the bundles, in id order."""
    params = {"ids": sorted(set(bundle_ids)), "job_ids": sorted(job_ids), "lease": lease}
    with wrapped():
        conn.execute(_q("lock_bundles", schema), params).fetchall()


def succeed(
    conn: Conn, schema: str, lease: LeaseToken, results: Sequence[tuple[JobId, str | None]]
) -> set[JobId]:
    """Mark jobs succeeded with their (JSON-text) results; returns the ids still held."""
    params = {
        "ids": [r[0] for r in results],
        "results": [r[1] for r in results],
        "done_lease": lease,
    }
    with wrapped():
        rows = conn.execute(_q("succeed", schema), params).fetchall()
    return {JobId(r[0]) for r in rows}


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
) -> tuple[set[JobId], list[Job]]:
    """`succeed` for one lease's jobs and `claim` of the next batch, in one statement.

    The jobs must have no bundle (their counters need the bundle rows locked in order first).
    """
    params = {
        "ids": [r[0] for r in results],
        "results": [r[1] for r in results],
        "done_lease": lease,
        **_claim_params(worker_id, types, max_retry_counts, limit),
    }
    with wrapped():
        rows = conn.execute(_q("succeed_and_claim", schema), params).fetchall()
    done = {JobId(r[1]) for r in rows if not r[0]}
    return done, _claimed([r[1:] for r in rows if r[0]])


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
    params = {
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
    with wrapped():
        rows = conn.execute(_q("end_attempt", schema), params).fetchall()
    return [_ended(r) for r in rows]


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
    params = {"ids": None if ids is None else list(ids), "lease": lease, "worker_id": worker_id}
    with wrapped():
        rows = conn.execute(_q("release", schema), params).fetchall()
    return [JobId(r[0]) for r in rows]


def rescue(conn: Conn, schema: str, *, dead_after: float, limit: int = 1000) -> list[EndedAttempt]:
    params = {
        "dead_after": dead_after,
        "limit": limit,
        "error": f"worker died: no heartbeat for {dead_after:g} s",
    }
    with wrapped():
        rows = conn.execute(_q("rescue", schema), params).fetchall()
    return [_ended(r) for r in rows]


def next_due(conn: Conn, schema: str, types: Sequence[str]) -> float | None:
    with wrapped():
        row = conn.execute(_q("next_due", schema), {"types": list(types)}).fetchone()
    return None if row is None or row[0] is None else float(row[0])


# ---- administration -------------------------------------------------------------------------


def _job_state(conn: Conn, schema: str, job_id: JobId) -> JobState:
    row = conn.execute(_q("job_state", schema), {"id": job_id}).fetchone()
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    return JobState(row[0])


def cancel(conn: Conn, schema: str, job_id: JobId) -> JobState | None:
    """Cancel a pending job. Returns None when done, else the state that prevented it."""
    with wrapped():
        if conn.execute(_q("cancel", schema), {"id": job_id}).fetchone() is not None:
            return None
        return _job_state(conn, schema, job_id)


def reset(conn: Conn, schema: str, job_id: JobId, force: bool) -> JobState | None:
    """Reset a job to pending. Returns None when done, else the state that prevented it."""
    with wrapped():
        if conn.execute(_q("reset", schema), {"id": job_id, "force": force}).fetchone():
            return None
        return _job_state(conn, schema, job_id)


def retry_failed(conn: Conn, schema: str, type_: str | None) -> int:
    with wrapped():
        row = conn.execute(_q("retry_failed", schema), {"type": type_}).fetchone()
    return 0 if row is None else int(row[0])


def get_job(conn: Conn, schema: str, job_id: JobId) -> JobRecord:
    with wrapped():
        row = conn.execute(_q("get_job", schema), {"id": job_id}).fetchone()
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    return _job(row)


def get_bundle(conn: Conn, schema: str, bundle_id: BundleId) -> Bundle:
    with wrapped():
        row = conn.execute(_q("get_bundle", schema), {"id": bundle_id}).fetchone()
    if row is None:
        raise JobNotFound(f"no bundle with id {bundle_id}")
    return _bundle(row)


def list_jobs(
    conn: Conn, schema: str, state: JobState, type_: str | None, limit: int
) -> list[JobRecord]:
    params = {"state": state.value, "type": type_, "limit": limit}
    with wrapped():
        rows = conn.execute(_q("list_jobs", schema), params).fetchall()
    return [_job(r) for r in rows]


def delete_finished(
    conn: Conn,
    schema: str,
    older_than: float,
    states: Sequence[JobState],
    batch: int = 5000,
    max_rows: int | None = None,
) -> int:
    """Delete finished jobs in batches, each in its own transaction when autocommit is on.

    Stops after about `max_rows` (whole batches) when given, so a caller with a loop to keep
    can bound how long one call takes; a result >= max_rows means more may be left.
    """
    total = 0
    params = {"states": [s.value for s in states], "older_than": older_than, "limit": batch}
    with wrapped():
        while True:
            n = conn.execute(_q("delete_finished", schema), params).rowcount
            total += max(n, 0)
            if n < batch or (max_rows is not None and total >= max_rows):
                break
        conn.execute(_q("delete_empty_bundles", schema), {"older_than": older_than})
    return total


def queue_stats(conn: Conn, schema: str, *, active_only: bool = False) -> list[TypeStats]:
    """Counts per type and state; `active_only` reads just pending and running jobs (cheap)."""
    with wrapped():
        rows = conn.execute(_q("active_stats" if active_only else "queue_stats", schema)).fetchall()
    return [TypeStats(r[0], JobState(r[1]), r[2], r[3], r[4]) for r in rows]


def depth(conn: Conn, schema: str, type_: str | None = None) -> int:
    with wrapped():
        row = conn.execute(_q("depth", schema), {"type": type_}).fetchone()
    return 0 if row is None else int(row[0])


def db_now(conn: Conn, schema: str) -> datetime:
    with wrapped():
        row = conn.execute(_q("now", schema)).fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


# ---- rows -----------------------------------------------------------------------------------


def _job(r: tuple[Any, ...]) -> JobRecord:
    return JobRecord(
        id=JobId(r[0]),
        bundle_id=BundleId(r[1]) if r[1] is not None else None,
        type=r[2],
        payload=r[3],
        priority=r[4],
        origin=r[5],
        state=JobState(r[6]),
        max_retry_count=r[7],
        current_retry_count=r[8],
        start_at=r[9],
        started_at=r[10],
        stopped_at=r[11],
        worker_alive_at=r[12],
        worker_id=r[13],
        timeout=r[14],
        unique_key=r[15],
        result=r[16],
        error_msg=r[17],
        error_data=r[18],
        attempts=r[19],
        created_at=r[20],
        updated_at=r[21],
    )


def _bundle(r: tuple[Any, ...]) -> Bundle:
    return Bundle(
        id=BundleId(r[0]),
        type=r[1],
        origin=r[2],
        num_jobs=r[3],
        num_jobs_stopped=r[4],
        on_complete=r[5],
        created_at=r[6],
        updated_at=r[7],
    )


def _ended(r: tuple[Any, ...]) -> EndedAttempt:
    return EndedAttempt(
        job_id=JobId(r[0]), job_type=r[1], new_state=JobState(r[2]), retry_count=r[3]
    )


# ---- connecting -----------------------------------------------------------------------------


def describe_connect_error(exc: psycopg.OperationalError) -> str:
    """One line that tells wrong host, wrong password and missing database apart."""
    text = str(exc).strip()
    low = text.lower()
    if "password authentication failed" in low or "no password supplied" in low:
        kind = "authentication failed (wrong user or password)"
    elif "does not exist" in low and "database" in low:
        kind = "database does not exist"
    elif "role" in low and "does not exist" in low:
        kind = "user does not exist"
    elif any(s in low for s in ("could not translate host", "name or service not known")):
        kind = "unknown host"
    elif any(s in low for s in ("connection refused", "no such file or directory", "timeout")):
        kind = "server not reachable"
    else:
        kind = "cannot connect"
    detail = next((ln for ln in reversed(text.splitlines()) if ln.strip()), text)
    return f"{kind}: {detail.strip()}"


def is_permanent_connect_error(exc: psycopg.OperationalError) -> bool:
    """Wrong password, user or database: retrying will not help."""
    low = str(exc).lower()
    return "authentication failed" in low or "does not exist" in low or "no password" in low


def connect(
    dsn: str,
    *,
    autocommit: bool = True,
    application_name: str = "pgq_supervisor",
    synchronous_commit: bool = True,
) -> Conn:
    """A connection. `synchronous_commit=False` is for the queue's own bookkeeping only (claims,
    heartbeats, completions): a commit lost in a server crash then means the job runs again,
    never that it is lost. Behind PgBouncer in transaction mode a session SET would leak to
    other clients, so such deployments keep it on (setting `worker_synchronous_commit`)."""
    with wrapped():
        conn = psycopg.connect(dsn, autocommit=autocommit, application_name=application_name)
        if not synchronous_commit:
            conn.execute("SET synchronous_commit = off")
        return conn


def redact(dsn: str) -> str:
    """The DSN without its password, for logs and process titles."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    params.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in params.items())


def connect_at_startup(dsn: str, timeout: float) -> Conn:
    """Connect, retrying a database that is not reachable yet for up to `timeout` seconds.

    Wrong password, unknown user and missing database fail at once: waiting cannot fix them.
    Raises DatabaseUnavailable with one line that says which it was.
    """
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        try:
            return psycopg.connect(
                dsn, autocommit=True, application_name="pgq-supervisor", connect_timeout=5
            )
        except psycopg.OperationalError as exc:
            if is_permanent_connect_error(exc) or time.monotonic() + delay > deadline:
                raise DatabaseUnavailable(
                    f"cannot connect to {redact(dsn)}: {describe_connect_error(exc)}"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def summary_by_origin(
    conn: Conn, schema: str, origin: str
) -> list[tuple[str, JobState, int, float | None, int]]:
    """(type, state, count, mean seconds, failed attempts) for the jobs of one origin."""
    with wrapped():
        rows = conn.execute(_q("summary_by_origin", schema), {"origin": origin}).fetchall()
    return [(r[0], JobState(r[1]), r[2], r[3], r[4] or 0) for r in rows]


def durable_commit(conn: Conn) -> None:
    """Make the open transaction commit synchronously (the session may have it off)."""
    with wrapped():
        conn.execute(_q("durable_commit", "pgq"))
