"""The `retention` group (issue 35, opt-in): expiring N finished jobs as users do today.

Set-up (not timed, not in the figures): `n` succeeded jobs finished over the last day, made
by one `INSERT … SELECT generate_series` (deep.fill_finished), then VACUUM ANALYZE and a
CHECKPOINT, as a table whose history autovacuum has long since visited. Then a CHECKPOINT, the
WAL insert position, and the path users run for retention by hand or from cron (docs/retention.md):
the real CLI, `python -m pgq_supervisor purge --older-than 0`: since schema 0029 it drops the
partitions whose every job is finished and past the window first (db/partitions.expire_old,
the supervisor's partition rounds), then DELETEs what is left, 5,000 rows a statement (db.
delete_finished, the supervisor's `--retain-*` rounds); the jobs were made over the last day,
before the database's migration, so they sit in its first partition. Timed from its start to
its exit (the CLI's own start-up, about 0.3 s, is
in). Then the flushed WAL position: the WAL between the two, this database's records only
(walcount.wal_bytes); and the dead tuples the schema's tables hold afterwards
(`n_dead_tup`, once the CLI's statistics have reached the server), which a vacuum must still
reclaim.
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
    "purge": "CLI purge: partitions dropped, the rest deleted",
    "round": "the supervisor's partition round, retain_succeeded 1 s (not default)",
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
        dropped = conn.execute("SELECT to_regclass('pgq.job_legacy') IS NULL").fetchone()
        if dropped != (True,):  # deleted row by row: the CLI's backend reports as it exits
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
