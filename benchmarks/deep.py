"""Deep tables (issue 15): the drain behind millions of finished jobs, and what a million
delayed jobs add to a poll.

Rows are made in SQL (one INSERT … SELECT generate_series each), not through the API: filling
5,000,000 rows through enqueue_many would take minutes and measure nothing of interest.

- drain: `pending` no-op jobs drained by `--procs 2` (the timed drain of drain.py: start gate,
  every job done once) on a fresh table, then the same behind `finished` succeeded jobs of
  another type, created before them. The ratio is the figure.
- delayed: the supervisor's earliest-due question (db.next_due, asked on every poll) and a
  child's claim of ready jobs (pgq.claim_pick, rolled back), each timed `samples` times, on a
  table without and then with `delayed` jobs due over the next day (created an hour before the
  ready ones, as a day's worth of "remind me tomorrow" jobs would be). The figure is what the
  delayed jobs add to the median, in ms.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import psycopg
from psycopg.rows import TupleRow

from benchmarks.apps import NOOP
from benchmarks.drain import FINISHED, Drained, run_drain
from benchmarks.enqueue import reset
from benchmarks.report import Json
from benchmarks.server import SCHEMA, settle
from pgq_supervisor import db

READY = 1000  # ready jobs in the table while the delayed probe times its queries


def fill_pending(conn: psycopg.Connection[TupleRow], n: int) -> None:
    conn.execute(
        "INSERT INTO pgq.job (type, payload) SELECT %s, '{}' FROM generate_series(1, %s)",
        (NOOP, n),
    )


def fill_finished(conn: psycopg.Connection[TupleRow], n: int) -> None:
    """`n` succeeded jobs finished over the day before the last hour, of a type nobody
    serves, with the ids they had when they were made (time-ordered: they sit in the partitions
    of their day; made before the database's migration, they are all in its first one)."""
    conn.execute(
        """
        INSERT INTO pgq.job (id, type, payload, state, max_retry_count, start_at, started_at,
                             stopped_at, worker_id, created_at, result)
        SELECT encode(overlay(uuid_send(gen_random_uuid())
                              PLACING substring(uuid_send(pgq.id_floor(t)) FROM 1 FOR 6)
                              FROM 1 FOR 6), 'hex')::uuid,
               %s, '{}', 'succeeded', 3, t, t, t + interval '5 ms', 'bench-old', t, NULL
        FROM (SELECT now() - interval '25 hours' + g * (interval '1 day' / %s) AS t
              FROM generate_series(1, %s) g) s
        """,
        (FINISHED, n, n),
    )


def fill_delayed(conn: psycopg.Connection[TupleRow], n: int) -> None:
    """`n` no-op jobs due over the next day, enqueued an hour ago."""
    conn.execute(
        """
        INSERT INTO pgq.job (type, payload, start_at, created_at)
        SELECT %s, '{}', now() + interval '1 minute' + g * (interval '1 day' / %s),
               now() - interval '1 hour'
        FROM generate_series(1, %s) g
        """,
        (NOOP, n, n),
    )


def drain_behind(dsn: str, pending: int, finished: int, procs: int = 2) -> Drained:
    """A timed drain of `pending` jobs with `finished` finished jobs in the table before them."""

    def prefill() -> None:
        reset(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            if finished:
                fill_finished(conn, finished)
            fill_pending(conn, pending)
        settle(dsn, ["pgq.job"])

    return run_drain(dsn, procs, pending, prefill=prefill)


@dataclass(frozen=True, slots=True)
class PollTimes:
    next_due_ms: float  # median
    claim_ms: float  # median

    def to_json(self) -> dict[str, Json]:
        return {"next_due_ms": round(self.next_due_ms, 4), "claim_ms": round(self.claim_ms, 4)}


def time_polls(dsn: str, samples: int) -> PollTimes:
    """Medians of the earliest-due query and of a claim of 10 ready jobs (rolled back)."""
    with psycopg.connect(dsn) as conn:
        due: list[float] = []
        claim: list[float] = []
        for _ in range(samples):
            start = time.perf_counter()
            db.next_due(conn, SCHEMA, [NOOP])
            conn.commit()
            due.append(time.perf_counter() - start)
            start = time.perf_counter()
            row = conn.execute("SELECT cardinality(pgq.claim_pick(ARRAY[%s], 10))", (NOOP,))
            got = row.fetchone()
            conn.rollback()
            claim.append(time.perf_counter() - start)
            if got is None or got[0] != 10:
                raise RuntimeError(f"a claim found {got} ready jobs, expected 10")
    return PollTimes(statistics.median(due) * 1000, statistics.median(claim) * 1000)


@dataclass(frozen=True, slots=True)
class DelayedRun:
    without: PollTimes
    with_delayed: PollTimes
    delayed: int

    @property
    def next_due_added_ms(self) -> float:
        return self.with_delayed.next_due_ms - self.without.next_due_ms

    @property
    def claim_added_ms(self) -> float:
        return self.with_delayed.claim_ms - self.without.claim_ms

    def details(self) -> dict[str, Json]:
        return {
            "delayed": self.delayed,
            "without": self.without.to_json(),
            "with": self.with_delayed.to_json(),
        }


def run_delayed(dsn: str, delayed: int, samples: int) -> DelayedRun:
    reset(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        fill_pending(conn, READY)
    settle(dsn, ["pgq.job"])
    without = time_polls(dsn, samples)
    with psycopg.connect(dsn, autocommit=True) as conn:
        fill_delayed(conn, delayed)
    settle(dsn, ["pgq.job"])
    with_delayed = time_polls(dsn, samples)
    return DelayedRun(without, with_delayed, delayed)
