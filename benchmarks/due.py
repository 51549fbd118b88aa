"""Due-time lateness (issue 40, item 2): how late a delayed job starts after it comes due.

    python -m benchmarks.due                       # 500 of each kind at 20/s each, both scenes
    python -m benchmarks.due --jobs 100 --only idle --dsn postgresql://...

Four kinds of delayed job, each due `DUE_DELAY` (0.5 s) after it is written: a retry (the
first attempt fails; the backoff is 0.5 s), a snooze (`pgq.Snooze(0.5)`), a workflow's
`ctx.sleep(0.5)`, and a job enqueued with a `start_at` 0.5 s ahead. `--jobs` of each, enqueued
at `--rate` per second each, interleaved, under the real supervisor CLI at its defaults
(`--procs 2`, `benchmarks.apps:due_registry`), in two scenes: on an otherwise idle queue, and
beside a drain (a feeder keeps `BACKLOG` no-op jobs pending throughout, so both children are
always busy). The figure of a job: `started_at - start_at` of the attempt that ran after its
delay, both by the database clock (the claim of a job that was due at `start_at`; the handler
starts within a millisecond of it). Only jobs that were delayed count (`start_at >
created_at`). The target (for retries, snoozes and sleeps): p99 <= 50 ms in both scenes. A job
enqueued with a start_at waits, beside a drain, for the backlog's jobs created before it: the
claim takes ready jobs in created_at order, so its figure there is the queue's order, not a
missed wake-up. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg

import pgq_supervisor as pgq
from benchmarks.apps import (
    DUE_APP,
    DUE_DELAY,
    DUE_LATER,
    DUE_RETRY,
    DUE_SLEEP,
    DUE_SNOOZE,
    NOOP,
)
from benchmarks.enqueue import reset
from benchmarks.probes import percentile
from benchmarks.procs import BenchError, Supervisor, running, wait_for
from benchmarks.server import SCHEMA, Scratch, find_server

KINDS = {DUE_RETRY: "retry", DUE_SNOOZE: "snooze", DUE_SLEEP: "workflow sleep",
         DUE_LATER: "enqueue with start_at"}  # fmt: skip
PROCS = 2
BACKLOG = 5_000  # no-op jobs kept pending beside the delayed ones, in the drain scene
TOP_UP = 2_500  # the feeder's batch
TARGET_P99_MS = 50.0
# a snooze job snoozes DUE_DELAY at a time until this long after its enqueue: long enough that
# its first run (behind the backlog, in the drain scene) comes before it; its last run counts
SNOOZE_FOR = 2.0


@dataclass(frozen=True, slots=True)
class Lateness:
    kind: str
    ms: tuple[float, ...]  # sorted

    def row(self, scene: str) -> str:
        p = [percentile(self.ms, q) for q in (50, 90, 99)]
        return (
            f"| {scene} | {self.kind} | {len(self.ms)} | {p[0]:.1f} | {p[1]:.1f} | {p[2]:.1f}"
            f" | {self.ms[-1]:.1f} |"
        )


class Feeder(threading.Thread):
    """Keeps about BACKLOG no-op jobs pending until stopped."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="due-feeder", daemon=True)
        self.dsn = dsn
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.done.is_set():
                    if _pending_noops(conn) < BACKLOG:
                        jobs = [pgq.NewJob(NOOP)] * TOP_UP
                        pgq.enqueue_many(conn, jobs, schema=SCHEMA)
                    else:
                        self.done.wait(0.05)
        except BaseException as exc:  # reported by the scene, which joins this thread
            self.error = exc


def _enqueue_delayed(conn: psycopg.Connection[tuple[object, ...]], n: int, rate: float) -> None:
    start = time.monotonic()
    for i in range(n):
        pause = start + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # the pace of the arrivals, not a wait for a result
        now = time.time()
        pgq.enqueue(conn, DUE_RETRY, schema=SCHEMA)
        pgq.enqueue(conn, DUE_SNOOZE, {"until": now + SNOOZE_FOR}, schema=SCHEMA)
        pgq.enqueue(conn, DUE_SLEEP, schema=SCHEMA)
        at = datetime.now(UTC) + timedelta(seconds=DUE_DELAY)
        pgq.enqueue(conn, DUE_LATER, start_at=at, schema=SCHEMA)


def _unfinished(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgq.job WHERE type = ANY(%s) AND state IN ('pending', 'running')",
        (list(KINDS),),
    ).fetchone()
    return 0 if row is None else int(str(row[0]))


def scene(dsn: str, n: int, rate: float, beside_drain: bool) -> list[Lateness]:
    reset(dsn)
    with (
        running(Supervisor(dsn, PROCS, app=DUE_APP)) as sup,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        sup.wait_idle()
        feeder = Feeder(dsn) if beside_drain else None
        if feeder is not None:
            feeder.start()
            wait_for("the backlog", lambda: _pending_noops(conn) >= BACKLOG // 2, 60)
        try:
            _enqueue_delayed(conn, n, rate)
            wait_for("every delayed job done", lambda: _unfinished(conn) == 0, 120, 0.05)
        finally:
            if feeder is not None:
                feeder.done.set()
                feeder.join(timeout=30)
        if feeder is not None and feeder.error is not None:
            raise BenchError(f"the feeder failed: {feeder.error}")
        failed = conn.execute(
            "SELECT count(*) FROM pgq.job WHERE type = ANY(%s) AND state <> 'succeeded'",
            (list(KINDS),),
        ).fetchone()
        if failed is None or failed[0]:
            raise BenchError(f"{failed} delayed jobs did not succeed: {sup.log_tail(3)}")
        rows = conn.execute(
            "SELECT type, 1000 * extract(epoch FROM started_at - start_at)::float8 FROM pgq.job"
            " WHERE type = ANY(%s) AND start_at > created_at",
            (list(KINDS),),
        ).fetchall()
    by_kind: dict[str, list[float]] = {t: [] for t in KINDS}
    for type_, ms in rows:
        by_kind[str(type_)].append(float(str(ms)))
    return [Lateness(KINDS[t], tuple(sorted(v))) for t, v in by_kind.items() if v]


def _pending_noops(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgq.job WHERE type = %s AND state = 'pending'", (NOOP,)
    ).fetchone()
    return 0 if row is None else int(str(row[0]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.due",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dsn", help="a database to CREATE DATABASE from (default: found)")
    parser.add_argument("--jobs", type=int, default=500, help="jobs of each kind (default 500)")
    parser.add_argument("--rate", type=float, default=20.0, help="of each kind per second")
    parser.add_argument("--only", choices=["idle", "drain"], help="one scene only")
    args = parser.parse_args(argv)
    server = find_server(args.dsn)
    scratch = Scratch(server)
    results: list[tuple[str, list[Lateness]]] = []
    try:
        dsn = scratch.create("due", migrate=True)
        for name, drain in (("idle queue", False), ("beside a drain", True)):
            if args.only is None or args.only == ("drain" if drain else "idle"):
                results.append((name, scene(dsn, args.jobs, args.rate, drain)))
    finally:
        scratch.close()
    print(
        f"Due-time lateness (started_at - start_at, ms), {args.jobs} of each kind at"
        f" {args.rate:g}/s each, --procs {PROCS} at the defaults; target p99 <= {TARGET_P99_MS:g}"
    )
    print("| scene | kind | jobs | p50 | p90 | p99 | max |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, lateness in results:
        for late in lateness:
            print(late.row(name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
