"""Head-of-line blocking (the `hol` group, issue 20): one slow job among fast ones.

`HOL_JOBS` jobs of one type, enqueued in one statement; the one at `HOL_SLOW_AT` (claim order)
sleeps `HOL_SLOW_S`, the others return at once. `--procs 2`, the start gate and checks of a
timed drain (drain.py). The figure: seconds from the gate's opening to the last fast job's
completion, by the database clock. It is taken at the defaults and with `--claim-batch 1`, back
to back in every run: a child that claimed a batch around the slow job must not keep the jobs
behind it waiting, so the two should be close (the ratio's target).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

import pgq_supervisor as pgq
from benchmarks.apps import NAP
from benchmarks.drain import run_drain
from benchmarks.enqueue import reset
from benchmarks.procs import BenchError
from benchmarks.report import Json
from benchmarks.server import SCHEMA, settle

HOL_JOBS = 600
HOL_SLOW_AT = 100  # past the first claims, which are small: the slow job lands inside a batch
HOL_SLOW_S = 10.0
HOL_PROCS = 2


@dataclass(frozen=True, slots=True)
class Hol:
    fast_done_s: float  # gate opening -> the last fast job's completion
    slow_done_s: float  # gate opening -> the slow job's completion
    workers: int

    def details(self) -> dict[str, Json]:
        return {
            "fast_done_s": round(self.fast_done_s, 3),
            "slow_done_s": round(self.slow_done_s, 3),
            "workers": self.workers,
        }


def fill(dsn: str) -> None:
    reset(dsn)
    jobs = [pgq.NewJob(NAP, {"seconds": 0}) for _ in range(HOL_JOBS)]
    jobs[HOL_SLOW_AT] = pgq.NewJob(NAP, {"seconds": HOL_SLOW_S})
    with psycopg.connect(dsn) as conn:
        pgq.enqueue_many(conn, jobs, schema=SCHEMA)
    settle(dsn, ["pgq.job"])


def run_hol(dsn: str, supervisor_args: Sequence[str] = ()) -> Hol:
    """One timed run of the scenario with these flags."""
    drained = run_drain(
        dsn, HOL_PROCS, HOL_JOBS, prefill=lambda: fill(dsn), supervisor_args=supervisor_args
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT extract(epoch FROM max(stopped_at) FILTER (
                       WHERE (payload->>'seconds')::float8 = 0))::float8,
                   extract(epoch FROM max(stopped_at) FILTER (
                       WHERE (payload->>'seconds')::float8 > 0))::float8
            FROM pgq.job"""
        ).fetchone()
    if row is None or row[0] is None or row[1] is None:
        raise BenchError("no fast or no slow job finished")
    fast, slow = float(row[0]) - drained.start, float(row[1]) - drained.start
    if slow < HOL_SLOW_S:
        raise BenchError(f"the slow job took {slow:.2f} s, less than its {HOL_SLOW_S:g} s sleep")
    return Hol(fast, slow, drained.workers)
