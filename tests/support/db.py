"""Helpers shared by the integration tests: row counts, claims, listeners, thread fan-out."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import LiteralString, TypeVar

import psycopg
from psycopg import sql

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, Job, JobId, JobRecord, JobState
from tests.support.waiting import DEADLINE

SCHEMA = "pgq"
T = TypeVar("T")


def count_rows(
    conn: Conn, table: LiteralString = "job", *, schema: str = SCHEMA, where: LiteralString = ""
) -> int:
    """Rows of `schema.table`, optionally filtered by a constant SQL condition."""
    query = sql.SQL("SELECT count(*) FROM {}.{}").format(
        sql.Identifier(schema), sql.Identifier(table)
    )
    if where:
        query = query + sql.SQL(" WHERE ") + sql.SQL(where)
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def claim(
    conn: Conn,
    types: Sequence[str],
    *,
    worker_id: str = "worker-1",
    limit: int = 1,
    max_retry_count: int = 3,
    schema: str = SCHEMA,
) -> list[Job]:
    return db.claim(
        conn,
        schema,
        worker_id=worker_id,
        types=list(types),
        max_retry_counts=[max_retry_count] * len(types),
        limit=limit,
    )


def claim_one(
    conn: Conn, type_: str, *, worker_id: str = "worker-1", max_retry_count: int = 3
) -> Job:
    jobs = claim(conn, [type_], worker_id=worker_id, max_retry_count=max_retry_count)
    assert len(jobs) == 1, f"expected one {type_!r} job to claim, got {len(jobs)}"
    return jobs[0]


def get(conn: Conn, job_id: JobId, *, schema: str = SCHEMA) -> JobRecord:
    return db.get_job(conn, schema, job_id)


def finished(conn: Conn, type_: str, state: JobState, error: str = "boom") -> JobId:
    """A job of `type_` taken through a claim to `state` (failed or succeeded)."""
    job_id = pgq.enqueue(conn, type_, {"n": 1}, max_retry_count=0)
    job = claim_one(conn, type_)
    assert job.id == job_id, "the claim took another job; give this one its own type"
    if state is JobState.FAILED:
        db.end_attempt(conn, "pgq", [job.id], error=error, kind=AttemptKind.ERROR, lease=job.lease)
    else:
        db.succeed(conn, "pgq", job.lease, [(job.id, None)])
    assert get(conn, job_id).state is state
    return job_id


def raw_row(conn: Conn, job_id: JobId) -> tuple[object, ...]:
    """Every column of the job row, lease and updated_at included: proof that nothing wrote."""
    row = conn.execute("SELECT * FROM pgq.job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} is gone"
    return tuple(row)


def age_heartbeat(conn: Conn, job_id: JobId, seconds: float) -> None:
    """Move a running job's heartbeat back by `seconds` on the database clock: its claim's
    stamp, and its owner's last beat if it has beaten (schema/0025), so every job of that
    owner looks as quiet."""
    conn.execute(
        "UPDATE pgq.job SET worker_alive_at = now() - make_interval(secs => %s) WHERE id = %s",
        (seconds, job_id),
    )
    conn.execute(
        "UPDATE pgq.worker w SET alive_at = now() - make_interval(secs => %s)"
        " FROM pgq.job j WHERE j.id = %s AND w.id = j.worker_id",
        (seconds, job_id),
    )


def make_due(conn: Conn, job_id: JobId) -> None:
    """A delayed (retrying) job becomes eligible now, without waiting for its backoff."""
    conn.execute("UPDATE pgq.job SET start_at = now() WHERE id = %s", (job_id,))


SENTINEL_CHANNEL = "pgq_test_sentinel"


class Listener:
    """A LISTEN connection that collects notifications up to a sentinel it sends itself.

    Notifications reach a listener in commit order, so once our own sentinel arrives every
    notification committed before it has arrived too: no timing guesses.
    """

    def __init__(self, conn: Conn, channels: Sequence[str]) -> None:
        self.conn = conn
        self.channels = list(channels)
        for channel in [*channels, SENTINEL_CHANNEL]:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    def collect(self) -> dict[str, list[str]]:
        """Payloads received per channel since the last collect(), in commit order."""
        sentinel = str(uuid.uuid4())
        self.conn.execute("SELECT pg_notify(%s, %s)", (SENTINEL_CHANNEL, sentinel))
        got: dict[str, list[str]] = {channel: [] for channel in self.channels}
        for notify in self.conn.notifies(timeout=DEADLINE):
            if notify.channel == SENTINEL_CHANNEL and notify.payload == sentinel:
                return got
            got.setdefault(notify.channel, []).append(notify.payload)
        raise AssertionError(f"our own notification did not come back within {DEADLINE} s")


@contextmanager
def listening(dsn: str, *channels: str) -> Iterator[Listener]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield Listener(conn, channels)


def in_threads(n: int, target: Callable[[int], T]) -> list[T]:
    """Run target(0..n-1) on n threads at once; re-raise the first failure."""
    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(target, i) for i in range(n)]
        return [f.result(timeout=DEADLINE) for f in futures]


def deadlocks(conn: Conn) -> int:
    """The deadlocks PostgreSQL has detected in this connection's database, as of now.

    Each backend counts its own in memory and flushes them to the shared statistics at most
    once a second, when idle: call `flush_stats` on the connections that may have detected
    one first (a backend that exits flushes them as it goes). The snapshot is cleared so that
    this reads the shared value afresh.
    """
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def flush_stats(conn: Conn) -> None:
    """Make `conn`'s backend flush its pending statistics (PostgreSQL 15+): it does so when it
    goes idle after this statement, before the server answers."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.rollback()
    conn.execute("SELECT pg_stat_force_next_flush()")
    if not conn.autocommit:
        conn.commit()
