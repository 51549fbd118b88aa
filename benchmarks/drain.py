"""Drain throughput of the real supervisor: no-op jobs for 1..8 procs, and CPU-bound jobs.

A timed drain: fill the job table, VACUUM ANALYZE + CHECKPOINT, close the start gate, start
`python -m pgq_supervisor run`, wait until every child's first claim waits at the gate, open it,
wait until no job is pending or running, stop the supervisor with SIGTERM (it must exit 0), then
read the figure from the job rows: jobs / (last `stopped_at` - gate opening), both by the
database clock. Every job must have succeeded on its first attempt: done exactly once.

`waiting=N` (the `deps` group) adds N jobs of the drained type that wait, all through the
drain, on a job nobody serves: they sit in the table (higher priority than the drained jobs,
so a claim that walked them would meet them first) and are left out of the counts.

`mark` (the `wal` group, wal.py; peers.py and graphile.py take one too) is called at the
phases' edges: "enqueue" once the table is empty, "enqueued" when the jobs are in,
"drain" when the table has settled and the workers are about to start.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import psycopg
from psycopg.rows import TupleRow

import pgq_supervisor as pgq
from benchmarks.apps import ASLEEP, IO_APP, IO_THREADS_APP, NOOP, SPIN, TSLEEP, spin
from benchmarks.enqueue import BULK_CHUNK, reset
from benchmarks.procs import BenchError, Supervisor, running, wait_for
from benchmarks.report import Json
from benchmarks.server import SCHEMA, StartGate, settle
from pgq_supervisor.jobs import JsonValue

GATE_TIMEOUT = 60.0
BLOCKER = "bench_blocker"  # a type no benchmark worker serves
FINISHED = "bench_finished"  # rows of a deep table, finished before the drain (deep.py)
# the drained jobs: neither the blocker, the jobs waiting for it, nor finished filler
DRAINED = f"depends_on IS NULL AND NOT has_dependents AND type <> '{FINISHED}'"

Phase = Literal["enqueue", "enqueued", "drain"]
Mark = Callable[[Phase], None]  # told when a drain run reaches each phase


def no_mark(phase: Phase) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Drained:
    jobs: int
    seconds: float
    workers: int  # distinct children that completed jobs
    mean_handler_s: float | None  # from the handlers' own reports, when they report one
    start: float = 0.0  # when the clock started: epoch seconds by the database clock

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    def details(self) -> dict[str, Json]:
        return {
            "jobs": self.jobs,
            "seconds": round(self.seconds, 4),
            "workers": self.workers,
            "mean_handler_ms": None
            if self.mean_handler_s is None
            else round(self.mean_handler_s * 1000, 3),
        }


def fill(
    dsn: str, n: int, job_type: str, payload: JsonValue, waiting: int = 0, mark: Mark = no_mark
) -> None:
    reset(dsn)
    mark("enqueue")
    with psycopg.connect(dsn) as conn:
        for i in range(0, n, BULK_CHUNK):
            size = min(BULK_CHUNK, n - i)
            pgq.enqueue_many(conn, [pgq.NewJob(job_type, payload)] * size, schema=SCHEMA)
            conn.commit()
        if waiting:
            blocker = pgq.enqueue(conn, BLOCKER, schema=SCHEMA)
            dependent = pgq.NewJob(job_type, payload, priority=1, depends_on=[blocker])
            for i in range(0, waiting, BULK_CHUNK):
                size = min(BULK_CHUNK, waiting - i)
                pgq.enqueue_many(conn, [dependent] * size, schema=SCHEMA)
            conn.commit()
    mark("enqueued")
    settle(dsn, ["pgq.job"])


def unfinished(conn: psycopg.Connection[TupleRow]) -> bool:
    """Is any job still pending or running? (Cheap: stops at the first such row.)"""
    row = conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM pgq.job WHERE state IN ('pending', 'running') AND {DRAINED})"
    ).fetchone()
    return row is None or bool(row[0])


def stuck(conn: psycopg.Connection[TupleRow], sup: Supervisor) -> str:
    """What a drain that does not finish looks like: job states, children, the log's end."""
    rows = conn.execute(
        "SELECT state::text, count(*) FROM pgq.job GROUP BY 1 ORDER BY 1"
    ).fetchall()
    states = ", ".join(f"{s} {c}" for s, c in rows)
    children = "; ".join(w.title for w in sup.workers())
    log = sup.log_tail(5).replace("\n", " | ")
    return f"jobs: {states}; children: {children}; supervisor log: {log or '(empty)'}"


def run_drain(
    dsn: str,
    procs: int,
    n: int,
    *,
    job_type: str = NOOP,
    payload: JsonValue = None,
    gate: bool = True,
    supervisor_args: Sequence[str] = (),
    waiting: int = 0,
    prefill: Callable[[], None] | None = None,
    app: str = "benchmarks.apps:registry",
    mark: Mark = no_mark,
) -> Drained:
    """One timed drain of `n` pre-enqueued jobs by a supervisor with `procs` children.
    `prefill` replaces the enqueue of the `n` jobs (deep.py fills the table in SQL)."""
    if prefill is None:
        fill(dsn, n, job_type, {} if payload is None else payload, waiting, mark)
    else:
        prefill()
    mark("drain")
    start_gate = StartGate(dsn, "pgq.job", "pgq-worker") if gate else None
    opened_at: float | None = None
    try:
        with (
            running(Supervisor(dsn, procs, supervisor_args, app)) as sup,
            psycopg.connect(dsn, autocommit=True) as watch,
        ):
            if start_gate is not None:

                def all_waiting() -> bool:
                    sup.check_alive()
                    return start_gate.waiting() >= procs

                wait_for(
                    f"{procs} children at the start gate (do workers still connect as"
                    " application_name 'pgq-worker'? --cold-start runs without the gate)",
                    all_waiting,
                    GATE_TIMEOUT,
                    0.02,
                )
                opened_at = start_gate.open()

            def drained() -> bool:
                sup.check_alive()
                return not unfinished(watch)

            try:
                wait_for(f"{n} jobs to drain", drained, max(120.0, n / 200), 0.05)
            except BenchError as exc:
                raise BenchError(f"{exc}; {stuck(watch, sup)}") from None
            code = sup.stop()
            if code != 0:
                raise BenchError(f"supervisor exited {code} on SIGTERM: {sup.log_tail(3)}")
    finally:
        if start_gate is not None:
            start_gate.close()
    return verify(dsn, n, opened_at, waiting)


def verify(dsn: str, n: int, opened_at: float | None, waiting: int = 0) -> Drained:
    """Every job succeeded on its first attempt; the time from the start to the last completion."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT count(*),
                   count(*) FILTER (WHERE state = 'succeeded' AND current_retry_count = 0
                                    AND attempts = '[]'::jsonb),
                   extract(epoch FROM min(started_at))::float8,
                   extract(epoch FROM max(stopped_at))::float8,
                   count(DISTINCT worker_id),
                   avg((result->>'s')::float8)
            FROM pgq.job WHERE """
            + DRAINED
        ).fetchone()
        still = conn.execute(
            "SELECT count(*) FROM pgq.job WHERE state = 'pending' AND waiting_on = 1"
        ).fetchone()
    if row is None:
        raise BenchError("no job rows")
    total, once, first_start, last_stop, workers, mean_s = row
    if still is None or still[0] != waiting:
        raise BenchError(f"{waiting} jobs should still wait, {still} do")
    if total != n or once != n:
        raise BenchError(
            f"{n} jobs enqueued, {total} found, {once} succeeded on their first attempt"
        )
    start = opened_at if opened_at is not None else float(first_start)
    seconds = float(last_stop) - start
    if seconds <= 0:
        raise BenchError(f"the drain took {seconds:.4f} s by the database clock")
    mean = None if mean_s is None else float(mean_s)
    return Drained(n, seconds, int(workers), mean, start)


def run_io(
    dsn: str,
    procs: int,
    n: int,
    *,
    seconds: float,
    concurrency: int | None,
    threads: bool,
    supervisor_args: Sequence[str] = (),
) -> Drained:
    """The timed drain of I/O-bound jobs (the `io` group): each waits `seconds`, in an async
    handler or, `threads`, a blocking one; the supervisor runs with `--concurrency` (None:
    without, at the defaults)."""
    flag = () if concurrency is None else ("--concurrency", str(concurrency))
    return run_drain(
        dsn,
        procs,
        n,
        job_type=TSLEEP if threads else ASLEEP,
        payload={"seconds": seconds},
        supervisor_args=(*supervisor_args, *flag),
        app=IO_THREADS_APP if threads else IO_APP,
    )


def run_cpu(
    dsn: str, procs: int, jobs_per_proc: int, loops: int, supervisor_args: Sequence[str] = ()
) -> Drained:
    """The same timed drain with ~20 ms pure-Python jobs; the figure is jobs/s."""
    return run_drain(
        dsn,
        procs,
        jobs_per_proc * procs,
        job_type=SPIN,
        payload={"loops": loops},
        supervisor_args=supervisor_args,
    )


def run_cpu_bare(procs: int, jobs_per_proc: int, loops: int) -> Drained:
    """The machine's own ceiling for `run_cpu`: the same loops in `procs` plain forked
    processes, no queue, started together; jobs / (last end - first start)."""
    ctx = multiprocessing.get_context("fork")  # nothing to re-import: the loop is all they run
    gate = ctx.Barrier(procs + 1)
    out: multiprocessing.queues.Queue[tuple[float, float, float]] = ctx.Queue()
    workers = [
        ctx.Process(target=_spin_worker, args=(loops, jobs_per_proc, gate, out), daemon=True)
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    try:
        gate.wait(timeout=30)
        spans = [out.get(timeout=max(60.0, jobs_per_proc)) for _ in workers]
    finally:
        for w in workers:
            w.join(timeout=5)
            if w.is_alive():
                w.kill()
    seconds = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
    mean = sum(per_job for _, _, per_job in spans) / len(spans)
    return Drained(procs * jobs_per_proc, seconds, procs, mean)


def _spin_worker(
    loops: int,
    n: int,
    gate: threading.Barrier,
    out: multiprocessing.queues.Queue[tuple[float, float, float]],
) -> None:
    gate.wait()
    start = time.time()
    for _ in range(n):
        spin(loops)
    end = time.time()
    out.put((start, end, (end - start) / n))
