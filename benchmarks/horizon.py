"""Vacuum's horizon held back (the `horizon` group, issue 23 item 2).

A producer enqueues `HORIZON_RATE` no-op jobs a second (`BATCH` per transaction) for `seconds`
while one supervisor at the defaults (`--procs 2`) runs them. Three variants, one after the
other on a fresh table:

- clean: nothing else;
- held: a REPEATABLE READ transaction that read the job table first, then sat idle in
  transaction for the whole run (a report, a forgotten session): vacuum can remove no row
  version made after its snapshot;
- held+scan: the same, and a reader scanning the job table in a loop (a dashboard, an
  analytics query), each scan its own statement;
- control: the held snapshot and a reader of the same kind scanning an unrelated table as
  large as the job table is at the end of the clean run (issue 35): what a reader costs the
  queue through the machine alone (CPU, buffers), so that scan / control is the part our
  tables' dead versions add.

Each variant's figures: the jobs run a second over the run, the largest backlog (pending jobs,
sampled every second), the claim's p99 (a probe times `claim_pick` of one job in a rolled-back
transaction every 100 ms: the walk a child's claim makes), the wake p99 (a job's start minus its
creation, both by the database clock, over every job), the job table with its indexes and
TOAST after the run (the held transaction still open), and the schema's size (every relation
in it). Issue 35's targets: the schema's size held / clean <= 1.3, claim and wake p99 held /
clean <= 1.5, and with the reader on our tables p99 <= 1.2x the control's.

The server must run autovacuum (PostgreSQL's default): without it the clean run keeps every row
version as well, and the comparison says nothing. The group refuses a server that has it off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

import pgq_supervisor as pgq
from benchmarks.apps import NOOP
from benchmarks.enqueue import reset
from benchmarks.probes import percentile
from benchmarks.procs import BenchError, Supervisor, running, wait_for
from benchmarks.report import Json
from benchmarks.server import SCHEMA, settle

HORIZON_RATE = 1500  # jobs a second
BATCH = 30  # jobs per enqueue transaction: 50 transactions a second
PROCS = 2
PROBE_EVERY = 0.1
VARIANTS = ("clean", "held", "scan", "control")
JOB_TABLE = sql.Identifier(SCHEMA, "job")
CONTROL_TABLE = sql.Identifier("public", "horizon_control")


@dataclass(frozen=True, slots=True)
class Weather:
    variant: str
    seconds: float
    enqueued: int
    rate: float  # jobs run a second over the run
    max_backlog: int
    claim_ms: list[float]
    wake_p50_ms: float
    wake_p99_ms: float
    table_bytes: int
    schema_bytes: int
    dead_tuples: int
    scans: int

    @property
    def claim_p99(self) -> float:
        return percentile(self.claim_ms, 99)

    def details(self) -> dict[str, Json]:
        return {
            "variant": self.variant,
            "seconds": self.seconds,
            "enqueued": self.enqueued,
            "jobs_per_s": round(self.rate, 1),
            "max_backlog": self.max_backlog,
            "claim_samples": len(self.claim_ms),
            "claim_p50_ms": round(percentile(self.claim_ms, 50), 3),
            "claim_p99_ms": round(self.claim_p99, 3),
            "wake_p50_ms": round(self.wake_p50_ms, 3),
            "wake_p99_ms": round(self.wake_p99_ms, 3),
            "table_bytes": self.table_bytes,
            "schema_bytes": self.schema_bytes,
            "dead_tuples": self.dead_tuples,
            "scans": self.scans,
        }


def _produce(dsn: str, stop: threading.Event, counted: list[int]) -> None:
    """BATCH jobs per transaction, HORIZON_RATE a second on a fixed schedule, until `stop`."""
    jobs = [pgq.NewJob(NOOP, {})] * BATCH
    with psycopg.connect(dsn) as conn:
        next_at = time.monotonic()
        while not stop.is_set():
            pgq.enqueue_many(conn, jobs, schema=SCHEMA)
            conn.commit()
            counted[0] += BATCH
            next_at += BATCH / HORIZON_RATE
            stop.wait(max(0.0, next_at - time.monotonic()))


def _probe(dsn: str, stop: threading.Event, claim_ms: list[float], backlog: list[int]) -> None:
    """Every PROBE_EVERY s: the claim's walk, timed and rolled back; every second the backlog."""
    with psycopg.connect(dsn) as conn:
        tick = 0
        next_at = time.monotonic()
        while not stop.is_set():
            began = time.perf_counter()
            conn.execute("SELECT pgq.claim_pick(%s::text[], 1)", ([NOOP],))
            claim_ms.append((time.perf_counter() - began) * 1000)
            conn.rollback()
            if tick % round(1 / PROBE_EVERY) == 0:
                row = conn.execute(
                    "SELECT count(*) FROM pgq.job WHERE state = 'pending'"
                ).fetchone()
                conn.rollback()
                backlog.append(0 if row is None else int(row[0]))
            tick += 1
            next_at += PROBE_EVERY
            stop.wait(max(0.0, next_at - time.monotonic()))


SCAN = sql.SQL("SELECT state, count(*), max(updated_at) FROM {} GROUP BY state")


def _scan(dsn: str, table: sql.Identifier, stop: threading.Event, scans: list[int]) -> None:
    """`table` read whole, one statement after the other, until `stop`."""
    query = SCAN.format(table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            conn.execute(query)
            scans[0] += 1


def make_control(dsn: str, rows: int) -> None:
    """CONTROL_TABLE: `rows` finished jobs' rows of the job table's shape, apart from the
    queue (no trigger, no index a claim walks), vacuumed and frozen: the control reader's."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(CONTROL_TABLE))
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(CONTROL_TABLE, JOB_TABLE)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, type, payload, state, started_at, stopped_at,"
                " max_retry_count)"
                " SELECT gen_random_uuid(), %s, '{{}}', 'succeeded', now(), now(), 3"
                " FROM generate_series(1, %s)"
            ).format(CONTROL_TABLE),
            (NOOP, rows),
        )
        conn.execute(sql.SQL("VACUUM (FREEZE, ANALYZE) {}").format(CONTROL_TABLE))


def run_weather(
    dsn: str,
    variant: str,
    seconds: float,
    supervisor_args: Sequence[str] = (),
    control_rows: int = 0,
) -> Weather:
    """One variant's run; `control_rows` sizes the control's table (default: the flow's
    jobs, the size the clean run's table reaches)."""
    if variant not in VARIANTS:
        raise BenchError(f"unknown horizon variant {variant!r}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    if row is None or row[0] != "on":
        raise BenchError(
            "autovacuum is off on this server: the clean run would keep every row version too;"
            " give --dsn of a server with autovacuum on"
        )
    if variant == "control":
        make_control(dsn, control_rows or round(HORIZON_RATE * seconds))
    reset(dsn)
    settle(dsn, ["pgq.job"])
    stop = threading.Event()
    counted = [0]
    scans = [0]
    claim_ms: list[float] = []
    backlog: list[int] = []
    holder = psycopg.connect(dsn)
    try:
        if variant != "clean":
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM pgq.job").fetchone()  # the snapshot, held
        with running(Supervisor(dsn, PROCS, supervisor_args)) as sup:
            sup.wait_idle()
            threads = [
                threading.Thread(target=_produce, args=(dsn, stop, counted)),
                threading.Thread(target=_probe, args=(dsn, stop, claim_ms, backlog)),
            ]
            if variant in ("scan", "control"):
                table = JOB_TABLE if variant == "scan" else CONTROL_TABLE
                threads.append(threading.Thread(target=_scan, args=(dsn, table, stop, scans)))
            began = time.monotonic()
            for t in threads:
                t.start()
            try:
                while time.monotonic() - began < seconds:  # the run's length, not a wait
                    sup.check_alive()
                    time.sleep(1.0)
            finally:
                stop.set()
                for t in threads:
                    t.join()
            with psycopg.connect(dsn, autocommit=True) as watch:

                def drained() -> bool:
                    sup.check_alive()
                    row = watch.execute(
                        "SELECT EXISTS (SELECT 1 FROM pgq.job"
                        " WHERE state IN ('pending', 'running'))"
                    ).fetchone()
                    return row is not None and not row[0]

                wait_for("the last jobs to finish", drained, 120.0, 0.05)
                row = watch.execute(
                    "SELECT count(*) FILTER (WHERE state = 'succeeded'),"
                    " extract(epoch FROM max(stopped_at) - min(created_at))::float8,"
                    " 1000 * extract(epoch FROM percentile_cont(0.5)"
                    "   WITHIN GROUP (ORDER BY started_at - created_at))::float8,"
                    " 1000 * extract(epoch FROM percentile_cont(0.99)"
                    "   WITHIN GROUP (ORDER BY started_at - created_at))::float8,"
                    " (SELECT sum(pg_total_relation_size(relid))::bigint"
                    "  FROM pgq.job_tables() relid),"
                    " (SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c"
                    "  WHERE c.relnamespace = 'pgq'::regnamespace AND c.relkind IN ('r', 'm')),"
                    " (SELECT sum(n_dead_tup)::bigint FROM pg_stat_user_tables"
                    "  WHERE relid IN (SELECT pgq.job_tables()))"
                    " FROM pgq.job"
                ).fetchone()
            code = sup.stop()
            if code != 0:
                raise BenchError(f"supervisor exited {code} on SIGTERM: {sup.log_tail(3)}")
    finally:
        holder.close()
        if variant == "control":
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(CONTROL_TABLE))
    if row is None or row[0] != counted[0]:
        raise BenchError(f"{counted[0]} jobs enqueued, {None if row is None else row[0]} ran")
    return Weather(
        variant=variant,
        seconds=seconds,
        enqueued=counted[0],
        rate=counted[0] / float(row[1]),
        max_backlog=max(backlog, default=0),
        claim_ms=claim_ms,
        wake_p50_ms=float(row[2]),
        wake_p99_ms=float(row[3]),
        table_bytes=int(row[4]),
        schema_bytes=int(row[5]),
        dead_tuples=int(row[6] or 0),
        scans=scans[0],
    )
