"""The `wal` group (issue 35): WAL bytes per job of the enqueue and of the drain, and the bytes
a retained job holds, for ours and for the peers that --peers selects (pgqueuer,
graphile-worker).

Each system runs in a database of its own (`bench_<run>_wal_<system>`), so neither its WAL nor
its size mixes with another's. One run of one system is a timed drain of drain.py (ours),
peers.py or graphile.py, the same bulk path and workers as the drain group (ours: enqueue_many
with 1,000 jobs a call, then the real CLI at the defaults, `--procs 2`), with marks at the
phases' edges:

- the table emptied (TRUNCATE): the schema's size (`pg_total_relation_size` over its tables,
  walcount.schema_bytes), a CHECKPOINT, the WAL insert position;
- the jobs in: the flushed position. Enqueue = the WAL between the two;
- the table settled (VACUUM ANALYZE and a CHECKPOINT, as every timed drain starts; not in
  either figure), a CHECKPOINT, the insert position; the workers started and the queue drained
  (every job once, as the drain group checks); the flushed position. Drain = the WAL between.
  It includes the workers' start-up and shutdown writes (a supervisor's registration, say);
- the schema's size again, before any vacuum or retention: minus the first, divided by the
  jobs, the bytes each retained job holds (graphile-worker deletes a job as it completes it:
  what it holds is the dead rows' space until a vacuum).

A CHECKPOINT before each phase makes its first touch of each page write a full-page image, as
it does in production once per checkpoint interval; the JSON has the images' share. Only the
system's own database's records count (pg_walinspect, walcount.wal_bytes) where the extension
can be had; else every database's. graphile-worker's figure includes the harness's completion
trigger (one small row per completing statement, graphile.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
from psycopg.rows import TupleRow

from benchmarks import drain, peers
from benchmarks.drain import Drained, Mark, Phase
from benchmarks.report import Json
from benchmarks.server import SCHEMA
from benchmarks.walcount import flush_lsn, insert_lsn, keep_wal, schema_bytes, wal_bytes

OURS = "pgq"
WAL_PEERS: tuple[peers.Peer, ...] = ("pgqueuer", "graphile-worker")
SCHEMAS: dict[str, str] = {OURS: SCHEMA, "pgqueuer": "public", "graphile-worker": "graphile_worker"}
DRAIN_PROCS = 2


@dataclass(frozen=True, slots=True)
class Wal:
    system: str
    jobs: int
    enqueue: int  # WAL bytes of the enqueue phase
    enqueue_fpi: int  # of them, full-page images (-1: not known)
    drain: int
    drain_fpi: int
    retained: int  # schema bytes after the drain minus before the enqueue
    drained: Drained

    @property
    def enqueue_per_job(self) -> float:
        return self.enqueue / self.jobs

    @property
    def drain_per_job(self) -> float:
        return self.drain / self.jobs

    @property
    def total_per_job(self) -> float:
        return (self.enqueue + self.drain) / self.jobs

    @property
    def retained_per_job(self) -> float:
        return self.retained / self.jobs

    def details(self) -> dict[str, Json]:
        return {
            "jobs": self.jobs,
            "enqueue_bytes": self.enqueue,
            "enqueue_fpi_bytes": self.enqueue_fpi,
            "drain_bytes": self.drain,
            "drain_fpi_bytes": self.drain_fpi,
            "retained_bytes": self.retained,
            "own_database_only": self.enqueue_fpi >= 0 and self.drain_fpi >= 0,
            "drain_jobs_per_s": round(self.drained.rate, 1),
        }

    def summary(self) -> str:
        return (
            f"enqueue {self.enqueue_per_job:,.0f} + drain {self.drain_per_job:,.0f}"
            f" = {self.total_per_job:,.0f} B/job; {self.retained_per_job:,.0f} schema B/job"
            f" retained; drained at {self.drained.rate:,.0f} jobs/s"
        )


@dataclass
class _Marks:
    """What a drain run's marks record: the schema's size, a CHECKPOINT before each phase,
    the WAL positions at its edges."""

    conn: psycopg.Connection[TupleRow]
    schema: str
    size_before: int = 0
    lsn: dict[Phase, str] = field(default_factory=dict)

    def __call__(self, phase: Phase) -> None:
        if phase == "enqueued":
            self.lsn[phase] = flush_lsn(self.conn)
            return
        if phase == "enqueue":
            self.size_before = schema_bytes(self.conn, self.schema)
        self.conn.execute("CHECKPOINT")
        self.lsn[phase] = insert_lsn(self.conn)


def measure(system: str, dsn: str, n: int, run: Callable[[Mark], Drained]) -> Wal:
    """One run of `system` in its database `dsn`: `run(mark)` enqueues `n` jobs and drains
    them, calling `mark` at each phase (drain.Mark)."""
    schema = SCHEMAS[system]
    with psycopg.connect(dsn, autocommit=True) as conn:
        # made before any window opens: its catalog rows are in neither figure
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        keep_wal(conn, f"wal_{system.replace('-', '_')}")
        marks = _Marks(conn, schema)
        drained = run(marks)
        end = flush_lsn(conn)
        retained = schema_bytes(conn, schema) - marks.size_before
        enqueue, enqueue_fpi = wal_bytes(conn, marks.lsn["enqueue"], marks.lsn["enqueued"])
        drain_wal, drain_fpi = wal_bytes(conn, marks.lsn["drain"], end)
    return Wal(system, n, enqueue, enqueue_fpi, drain_wal, drain_fpi, retained, drained)


def run_ours(dsn: str, n: int, *, gate: bool = True, supervisor_args: tuple[str, ...] = ()) -> Wal:
    return measure(
        OURS,
        dsn,
        n,
        lambda mark: drain.run_drain(
            dsn, DRAIN_PROCS, n, gate=gate, supervisor_args=supervisor_args, mark=mark
        ),
    )


def run_peer(peer: peers.Peer, dsn: str, n: int) -> Wal:
    return measure(peer, dsn, n, lambda mark: peers.drain(peer, dsn, n, mark=mark))
