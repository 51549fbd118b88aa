"""Enqueue throughput: ours one per transaction and in bulk, and bare psycopg baselines.

Every function starts from an empty job table and times only the enqueue loop (the job
descriptions are built beforehand, as a caller would have them).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

import pgq_supervisor as pgq
from benchmarks.apps import NOOP
from benchmarks.procs import BenchError
from benchmarks.server import SCHEMA
from pgq_supervisor.jobs import JsonValue

BULK_CHUNK = 1000


def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE pgq.job, pgq.job_bundle, pgq.job_dependency, pgq.workflow_step,"
            " pgq.workflow_signal"
        )


def check_count(dsn: str, expected: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pgq.job WHERE state = 'pending'").fetchone()
    found = 0 if row is None else int(row[0])
    if found != expected:
        raise BenchError(f"expected {expected} pending jobs after the enqueue, found {found}")


def single_pair(dsn: str, n: int, blocks: int = 4) -> tuple[float, float]:
    """jobs/s of (pgq.enqueue + commit, bare INSERT + commit), n jobs each on one connection.

    The two alternate in `blocks` blocks so that drift on a shared machine (fsync latency,
    neighbours) hits both alike: the target is their ratio. The bare loop is the floor under
    ours: a plain INSERT of the same job into the same table.
    """
    reset(dsn)
    took = {"ours": 0.0, "bare": 0.0}
    sizes = [n // blocks + (1 if i < n % blocks else 0) for i in range(blocks)]
    with psycopg.connect(dsn) as conn:
        for size in sizes:
            start = time.perf_counter()
            for _ in range(size):
                conn.execute("INSERT INTO pgq.job (type, payload) VALUES (%s, %s)", (NOOP, "{}"))
                conn.commit()
            took["bare"] += time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(size):
                pgq.enqueue(conn, NOOP, {}, schema=SCHEMA)
                conn.commit()
            took["ours"] += time.perf_counter() - start
    check_count(dsn, 2 * n)
    return n / took["ours"], n / took["bare"]


def bulk(dsn: str, n: int, payload: Callable[[int], JsonValue] | None = None) -> float:
    """pgq.enqueue_many, 1,000 jobs per call and per transaction; jobs/s. `payload(i)` is the
    i-th job's payload (default: an empty object)."""
    reset(dsn)
    make = payload or (lambda i: {})
    chunks = [
        [pgq.NewJob(type=NOOP, payload=make(j)) for j in range(i, min(i + BULK_CHUNK, n))]
        for i in range(0, n, BULK_CHUNK)
    ]
    with psycopg.connect(dsn) as conn:
        start = time.perf_counter()
        for chunk in chunks:
            pgq.enqueue_many(conn, chunk, schema=SCHEMA)
            conn.commit()
        took = time.perf_counter() - start
    check_count(dsn, n)
    return n / took


def bulk_bare(dsn: str, n: int) -> float:
    """The floor under `bulk`: INSERT … SELECT FROM unnest(arrays), 1,000 rows per statement."""
    reset(dsn)
    chunks = [min(BULK_CHUNK, n - i) for i in range(0, n, BULK_CHUNK)]
    with psycopg.connect(dsn) as conn:
        start = time.perf_counter()
        for size in chunks:
            conn.execute(
                "INSERT INTO pgq.job (type, payload) SELECT * FROM unnest(%s::text[], %s::jsonb[])",
                ([NOOP] * size, ["{}"] * size),
            )
            conn.commit()
        took = time.perf_counter() - start
    check_count(dsn, n)
    return n / took


def bulk_copy_bare(dsn: str, n: int) -> float:
    """The database's pace for `bulk`: a bare psycopg COPY of the same jobs (type and payload;
    the table's defaults do the rest, the id included), 1,000 rows per COPY and per
    transaction."""
    reset(dsn)
    chunks = [min(BULK_CHUNK, n - i) for i in range(0, n, BULK_CHUNK)]
    with psycopg.connect(dsn) as conn:
        start = time.perf_counter()
        for size in chunks:
            with conn.cursor() as cur, cur.copy("COPY pgq.job (type, payload) FROM STDIN") as copy:
                for _ in range(size):
                    copy.write_row((NOOP, "{}"))
            conn.commit()
        took = time.perf_counter() - start
    check_count(dsn, n)
    return n / took
