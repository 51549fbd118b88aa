"""The `retention` group (issue 35, opt-in): expiring N finished jobs, two ways.

Set-up (not timed, not in the figures): `n` succeeded jobs finished over the day before the
last hour, made by one `INSERT … SELECT generate_series` (deep.fill_finished), then VACUUM
ANALYZE and a CHECKPOINT, as a table whose history autovacuum has long since visited. Then a
CHECKPOINT, the WAL insert position, and one of:
- `purge`: the one job table (the default), through the path users run for retention by hand
  or from cron (docs/retention.md): the real CLI, `python -m pgq_supervisor purge
  --older-than 0` (db.delete_finished: DELETEs of 5,000 rows a statement, each its own
  transaction; the supervisor's `--retain-*` rounds run the same statement), timed from its
  start to its exit (the CLI's own start-up, about 0.3 s, is in);
- `round`: the job table partitioned first (schema/0029, opt-in: `partition`; the jobs, made
  before that, sit in its first partition) and one round of the supervisor's partition
  maintenance (maintenance/partitions.py) in this process, with retain_succeeded 1 s (the
  default day would keep jobs made this last day): the partition dropped whole.
Then the flushed WAL position: the WAL between the two, this database's records only
(walcount.wal_bytes); and the dead tuples the schema's tables hold afterwards (`n_dead_tup`,
once the CLI's statistics have reached the server), which a vacuum must still reclaim.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

import psycopg
from psycopg.rows import TupleRow

from benchmarks.deep import fill_finished
from benchmarks.enqueue import reset
from benchmarks.procs import ROOT, BenchError, child_env, wait_for
from benchmarks.report import Json
from benchmarks.server import SCHEMA, settle
from benchmarks.walcount import flush_lsn, insert_lsn, keep_wal, schema_bytes, wal_bytes
from pgq_supervisor.db import partitions as db_partitions
from pgq_supervisor.supervisor.maintenance.partitions import Partitions

MB = 1_000_000


@dataclass(frozen=True, slots=True)
class Retention:
    jobs: int
    seconds: float
    wal: int
    fpi: int  # of `wal`, full-page images (-1: not known, `wal` is every database's)
    dead_tuples: int
    size_before: int  # the schema's bytes before and after: a DELETE frees, it does not shrink
    size_after: int
    setup_seconds: float
    path: str

    def details(self) -> dict[str, Json]:
        return {
            "jobs": self.jobs,
            "seconds": round(self.seconds, 3),
            "wal_bytes": self.wal,
            "fpi_bytes": self.fpi,
            "own_database_only": self.fpi >= 0,
            "dead_tuples_after": self.dead_tuples,
            "schema_bytes_before": self.size_before,
            "schema_bytes_after": self.size_after,
            "setup_seconds": round(self.setup_seconds, 1),
            "path": self.path,
        }


def _dead_and_deleted(conn: psycopg.Connection[TupleRow]) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(sum(n_dead_tup), 0)::bigint, coalesce(sum(n_tup_del), 0)::bigint"
        " FROM pg_stat_user_tables WHERE schemaname = %s",
        (SCHEMA,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


PATHS = {
    "purge": "CLI purge of the one table (the default): DELETE",
    "round": "partitioned table (opt-in: `partition`), the supervisor's round,"
    " retain_succeeded 1 s (not default)",
}


def _round(dsn: str) -> int:
    """The supervisor's partition round (maintenance/partitions.py), in this process: the
    default windows would keep jobs made this last day, so retain_succeeded is 1 s."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = Partitions(SCHEMA, 86400.0, 1.0, 7 * 86400.0).run_once(conn)
    return done.expired.jobs


def run_retention(dsn: str, n: int, path: str = "purge") -> Retention:
    started = time.monotonic()
    reset(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if path == "round":  # the jobs, made before it, are all in its first partition
            db_partitions.convert(conn, SCHEMA, interval=86400.0, lock_timeout=10.0)
        fill_finished(conn, n)
    settle(dsn, ["pgq.job"])
    setup = time.monotonic() - started
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        keep_wal(conn, "retention")
        size_before = schema_bytes(conn, SCHEMA)
        _, deleted_before = _dead_and_deleted(conn)
        conn.execute("CHECKPOINT")
        start = insert_lsn(conn)
        t0 = time.monotonic()
        if path == "round":
            _round(dsn)
        else:
            done = subprocess.run(
                [sys.executable, "-m", "pgq_supervisor", "purge", "--dsn", dsn,
                 "--schema", SCHEMA, "--older-than", "0", "--json"],
                capture_output=True, text=True, env=child_env(), cwd=ROOT, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise BenchError(f"purge exited {done.returncode}: {done.stderr.strip()[-300:]}")
            purged = int(json.loads(done.stdout)["purged"])
            if purged != n:
                raise BenchError(f"purge deleted {purged} jobs of {n}")
        seconds = time.monotonic() - t0
        end = flush_lsn(conn)
        if path == "purge":  # deleted row by row: the CLI's backend reports as it exits
            wait_for(
                "the purge's statistics",
                lambda: _dead_and_deleted(conn)[1] - deleted_before >= n,
                10.0,
                0.05,
            )
        dead, _ = _dead_and_deleted(conn)  # a dropped partition's rows count nowhere
        left = conn.execute("SELECT count(*) FROM pgq.job").fetchone()
        if left is None or left[0] != 0:
            raise BenchError(f"{left} jobs left after the purge")
        size_after = schema_bytes(conn, SCHEMA)
        wal, fpi = wal_bytes(conn, start, end)
    return Retention(n, seconds, wal, fpi, dead, size_before, size_after, setup, PATHS[path])
