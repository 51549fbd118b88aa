"""Soak (issue 15): a steady load for many minutes, with retention on, and what decays.

1. Capacity: a timed drain (drain.py) of `--drain-jobs` no-op jobs with `--procs 2` alone;
   then one minute of the load below offered that rate: what the workers finish in that minute,
   with the producer, the probe and retention on the same cores, is the capacity (on a 2-core
   machine that hosts PostgreSQL too, 70% of a drain measured alone was more than the workers
   could do beside the producer, and the backlog grew from the first minute).
2. Load: a supervisor with `--procs 2 --retain-succeeded 60` (the one non-default flag:
   retention prunes succeeded jobs older than a minute, as a long-running queue would) while a
   producer process enqueues no-op jobs at 70% of that capacity, in `enqueue_many` calls every
   TICK seconds, paced by the clock (a late tick is caught up, never skipped), for `minutes`.
   A probe enqueues one wake job per second (type bench_wake, returns time.time()).
3. Each minute, from the database: jobs finished (enqueued - growth of the unfinished set,
   exact even though retention deletes rows), the backlog (pending + running), claim latency
   (a job's started_at - start_at: how long a ready job waited to be claimed) p50/p99 over the
   jobs that started in that minute, wake latency p50/p99 of the probe jobs, the job table's
   and its indexes' sizes, dead tuples (pg_stat_user_tables.n_dead_tup), autovacuum runs.

Targets: the last minute's throughput ≥ 90% of the second minute's; table + indexes at the end
≤ 2x minute 2; no backlog growth (the backlog at the end ≤ one second of production more than
at minute 2). The table goes to stdout and the JSON; a PNG plot (matplotlib, the `bench` extra)
goes next to the JSON.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.rows import TupleRow

import pgq_supervisor as pgq
from benchmarks.apps import NOOP, WAKE
from benchmarks.drain import run_drain
from benchmarks.enqueue import reset
from benchmarks.probes import percentile
from benchmarks.procs import BenchError, Supervisor, running
from benchmarks.report import Json
from benchmarks.server import SCHEMA, settle

LOAD = 0.7  # of the measured drain capacity
TICK = 0.05  # seconds between the producer's enqueue_many calls
RETAIN = 60  # seconds: --retain-succeeded
PROCS = 2


@dataclass(frozen=True, slots=True)
class Minute:
    minute: int
    enqueued: int
    finished: int
    backlog: int
    claim_p50_ms: float | None
    claim_p99_ms: float | None
    wake_p50_ms: float | None
    wake_p99_ms: float | None
    table_mib: float
    index_mib: float
    dead_tuples: int
    autovacuums: int

    @property
    def rate(self) -> float:
        return self.finished / 60

    @property
    def size_mib(self) -> float:
        return self.table_mib + self.index_mib

    def to_json(self) -> dict[str, Json]:
        return {
            "minute": self.minute,
            "enqueued": self.enqueued,
            "finished": self.finished,
            "jobs_per_s": round(self.rate, 1),
            "backlog": self.backlog,
            "claim_p50_ms": _round(self.claim_p50_ms),
            "claim_p99_ms": _round(self.claim_p99_ms),
            "wake_p50_ms": _round(self.wake_p50_ms),
            "wake_p99_ms": _round(self.wake_p99_ms),
            "table_mib": round(self.table_mib, 2),
            "index_mib": round(self.index_mib, 2),
            "dead_tuples": self.dead_tuples,
            "autovacuums": self.autovacuums,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


@dataclass(frozen=True, slots=True)
class Soak:
    capacity: float  # jobs/s the workers finished in a minute offered a lone drain's rate
    target_rate: float  # jobs/s the producer aimed at
    minutes: list[Minute]

    def second(self) -> Minute:
        return self.minutes[1]

    def last(self) -> Minute:
        return self.minutes[-1]

    @property
    def throughput_ratio(self) -> float:
        return self.last().rate / self.second().rate if self.second().rate else 0.0

    @property
    def size_ratio(self) -> float:
        return self.last().size_mib / self.second().size_mib

    @property
    def backlog_growth_s(self) -> float:
        """Backlog growth from minute 2 to the end, in seconds of production."""
        return (self.last().backlog - self.second().backlog) / self.target_rate

    def details(self) -> dict[str, Json]:
        return {
            "capacity_jobs_per_s": round(self.capacity, 1),
            "target_jobs_per_s": round(self.target_rate, 1),
            "minutes": [m.to_json() for m in self.minutes],
        }

    def table(self) -> str:
        head = (
            f"{'min':>3} {'enq/s':>7} {'done/s':>7} {'backlog':>8} {'claim p50/p99 ms':>17}"
            f" {'wake p50/p99 ms':>16} {'table MiB':>9} {'index MiB':>9} {'dead tup':>9}"
            f" {'autovac':>7}"
        )
        lines = [head, "-" * len(head)]
        for m in self.minutes:
            lines.append(
                f"{m.minute:>3} {m.enqueued / 60:>7,.0f} {m.rate:>7,.0f} {m.backlog:>8,}"
                f" {_pair(m.claim_p50_ms, m.claim_p99_ms):>17}"
                f" {_pair(m.wake_p50_ms, m.wake_p99_ms):>16}"
                f" {m.table_mib:>9.1f} {m.index_mib:>9.1f} {m.dead_tuples:>9,} {m.autovacuums:>7}"
            )
        return "\n".join(lines)


def _pair(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    return f"{a:.1f} / {b:.1f}"


def _produce(
    dsn: str,
    rate: float,
    seconds: float,
    counter: multiprocessing.sharedctypes.Synchronized[int],
    stop: multiprocessing.synchronize.Event,
) -> None:
    """Enqueue no-op jobs at `rate` per second for `seconds`, counting them in `counter`."""
    with psycopg.connect(dsn) as conn:
        start = time.monotonic()
        sent = 0
        job = pgq.NewJob(NOOP, {})
        while not stop.is_set():
            elapsed = time.monotonic() - start
            if elapsed >= seconds:
                break
            due = int(rate * elapsed) - sent
            if due > 0:
                pgq.enqueue_many(conn, [job] * due, schema=SCHEMA)
                conn.commit()
                sent += due
                with counter.get_lock():
                    counter.value = sent
            time.sleep(max(0.0, start + (elapsed // TICK + 1) * TICK - time.monotonic()))


# the job table's size, summed over its partitions where it has some (schema/0029)
JOB_SIZES = "SELECT sum({size}(t)) FROM pgq.job_tables() t"


def _scalar(conn: psycopg.Connection[TupleRow], query: str, *params: object) -> float:
    row = conn.execute(query.encode(), params).fetchone()
    return 0.0 if row is None or row[0] is None else float(row[0])


class Sampler:
    """Reads one minute's figures from the database."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self.conn = conn
        self.unfinished = self.backlog()
        self.enqueued = 0
        self.wakes: list[float] = []

    def backlog(self) -> int:
        return int(
            _scalar(self.conn, "SELECT count(*) FROM pgq.job WHERE state IN ('pending', 'running')")
        )

    def sample(self, minute: int, enqueued_total: int, since: float) -> Minute:
        c = self.conn
        backlog = self.backlog()
        enqueued = enqueued_total - self.enqueued
        finished = enqueued - (backlog - self.unfinished)
        self.enqueued, self.unfinished = enqueued_total, backlog
        row = c.execute(
            """
            SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY started_at - start_at),
                   percentile_disc(0.99) WITHIN GROUP (ORDER BY started_at - start_at)
            FROM pgq.job
            WHERE type = %s AND started_at >= to_timestamp(%s) AND started_at >= start_at
            """,
            (NOOP, since),
        ).fetchone()
        claim = [None if v is None else v.total_seconds() * 1000 for v in (row or (None, None))]
        stats = c.execute(  # summed over the job table's partitions (schema/0029)
            "SELECT sum(n_dead_tup), sum(autovacuum_count) FROM pg_stat_user_tables"
            " WHERE relid IN (SELECT pgq.job_tables())"
        ).fetchone()
        wakes, self.wakes = self.wakes, []
        return Minute(
            minute=minute,
            enqueued=enqueued,
            finished=finished,
            backlog=backlog,
            claim_p50_ms=claim[0],
            claim_p99_ms=claim[1],
            wake_p50_ms=percentile(wakes, 50) if wakes else None,
            wake_p99_ms=percentile(wakes, 99) if wakes else None,
            table_mib=_scalar(c, JOB_SIZES.format(size="pg_table_size")) / 2**20,
            index_mib=_scalar(c, JOB_SIZES.format(size="pg_indexes_size")) / 2**20,
            dead_tuples=0 if stats is None or stats[0] is None else int(stats[0]),
            autovacuums=0 if stats is None or stats[1] is None else int(stats[1]),
        )


def probe_wake(
    conn: psycopg.Connection[TupleRow], sampler: Sampler, pending: list[tuple[pgq.JobId, float]]
) -> None:
    """Enqueue one wake job; collect the latency of those that ran (handler start - commit)."""
    job_id = pgq.enqueue(conn, WAKE, {}, schema=SCHEMA)
    conn.commit()
    pending.append((job_id, time.time()))
    ids = [j for j, _ in pending]
    rows = conn.execute(
        "SELECT id, (result->>'t')::float8 FROM pgq.job WHERE id = ANY(%s) AND state = 'succeeded'",
        (ids,),
    ).fetchall()
    conn.commit()
    ran = {r[0]: float(r[1]) for r in rows if r[1] is not None}
    for job_id, committed in list(pending):
        if job_id in ran:
            sampler.wakes.append((ran[job_id] - committed) * 1000)
            pending.remove((job_id, committed))


def require_autovacuum(dsn: str) -> None:
    """A soak measures decay, and what holds it back in production is autovacuum: a server
    running without it (some test machines do) would only measure its absence."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    if row is None or row[0] != "on":
        raise BenchError(
            "soak: autovacuum is off on this server, so dead tuples are never reclaimed and the"
            " figures would measure that; turn it on (ALTER SYSTEM SET autovacuum = on;"
            " SELECT pg_reload_conf()) or point --dsn at a server where it is"
        )


def run_soak(
    dsn: str, minutes: float, capacity_jobs: int, supervisor_args: tuple[str, ...] = ()
) -> Soak:
    require_autovacuum(dsn)
    alone = run_drain(dsn, PROCS, capacity_jobs, supervisor_args=supervisor_args).rate
    (loaded,) = _load(dsn, alone, 1, supervisor_args)
    capacity = loaded.rate
    return Soak(capacity, LOAD * capacity, _load(dsn, LOAD * capacity, minutes, supervisor_args))


def _load(dsn: str, rate: float, minutes: float, supervisor_args: tuple[str, ...]) -> list[Minute]:
    """`minutes` of `rate` jobs/s offered to a fresh table, a row per minute."""
    reset(dsn)
    settle(dsn, ["pgq.job"])
    ctx = multiprocessing.get_context("spawn")
    counter = ctx.Value("q", 0)
    stop = ctx.Event()
    seconds = minutes * 60
    args = ("--retain-succeeded", str(RETAIN), *supervisor_args)
    rows: list[Minute] = []
    with running(Supervisor(dsn, PROCS, args)) as sup, psycopg.connect(dsn) as conn:
        sup.wait_idle()
        sampler = Sampler(conn)
        producer = ctx.Process(target=_produce, args=(dsn, rate, seconds, counter, stop))
        producer.start()
        try:
            start = time.time()
            pending: list[tuple[pgq.JobId, float]] = []
            minute_start = start
            for m in range(1, int(minutes) + 1):
                while time.time() < start + m * 60:
                    sup.check_alive()
                    if not producer.is_alive() and producer.exitcode not in (0, None):
                        raise BenchError(f"the producer exited with {producer.exitcode}")
                    probe_wake(conn, sampler, pending)
                    time.sleep(max(0.0, min(1.0, start + m * 60 - time.time())))
                rows.append(sampler.sample(m, int(counter.value), minute_start))
                minute_start = time.time()
        finally:
            stop.set()
            producer.join(timeout=30)
            if producer.is_alive():
                producer.kill()
        code = sup.stop()
        if code != 0:
            raise BenchError(f"supervisor exited {code} on SIGTERM: {sup.log_tail(3)}")
    return rows


def plot(soak: Soak, path: Path) -> Path:
    """A PNG of the minutes: throughput, latencies, sizes, dead tuples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [m.minute for m in soak.minutes]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    a = axes[0][0]
    a.plot(xs, [m.rate for m in soak.minutes], marker="o", label="finished")
    a.plot(xs, [m.enqueued / 60 for m in soak.minutes], marker=".", label="enqueued")
    a.set_title("jobs/s")
    a.legend()
    a = axes[0][1]
    for label, values in (
        ("claim p50", [m.claim_p50_ms for m in soak.minutes]),
        ("claim p99", [m.claim_p99_ms for m in soak.minutes]),
        ("wake p50", [m.wake_p50_ms for m in soak.minutes]),
        ("wake p99", [m.wake_p99_ms for m in soak.minutes]),
    ):
        a.plot(xs, [float("nan") if v is None else v for v in values], marker="o", label=label)
    a.set_title("latency, ms")
    a.set_yscale("log")
    a.legend()
    a = axes[1][0]
    a.plot(xs, [m.table_mib for m in soak.minutes], marker="o", label="table")
    a.plot(xs, [m.index_mib for m in soak.minutes], marker="o", label="indexes")
    a.set_title("pgq.job size, MiB")
    a.legend()
    a = axes[1][1]
    a.plot(xs, [m.dead_tuples for m in soak.minutes], marker="o", label="dead tuples")
    a.plot(xs, [m.backlog for m in soak.minutes], marker="o", label="backlog")
    a.set_title("rows")
    a.legend()
    for a in axes[1]:
        a.set_xlabel("minute")
        a.set_xticks(xs)
    fig.suptitle(
        f"soak: {soak.target_rate:,.0f} jobs/s offered (70% of {soak.capacity:,.0f}),"
        f" --procs {PROCS} --retain-succeeded {RETAIN}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
