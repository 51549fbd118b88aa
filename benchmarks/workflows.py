"""Workflows (issue 26): what a step costs, and what sleeping workflows cost the claim.

- steps: one workflow job claimed, then `n` no-op steps run through its context on one
  connection, in-process (no supervisor: the figure is the step's own cost). A plain step is
  its function and its checkpoint row committed durably (fenced by the lease); a `conn` step
  the same inside the transaction it gives the function; a replayed step is what a later run
  pays per stored step (the history read once, then the step returned from it).
- sleepers: deep.py's poll probe (the earliest-due query and a claim of 10 ready jobs, rolled
  back) on a table without and then with `sleepers` workflows asleep (each a pending job due
  within the hour with five step rows); the figure is what they add to the claim's median.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg
from psycopg.rows import TupleRow

from benchmarks.apps import NOOP
from benchmarks.deep import PollTimes, fill_pending, time_polls
from benchmarks.enqueue import reset
from benchmarks.report import Json
from benchmarks.server import SCHEMA, settle
from pgq_supervisor import db
from pgq_supervisor.db import workflows as wdb
from pgq_supervisor.jobs import Job
from pgq_supervisor.registry import Registry
from pgq_supervisor.workflows.context import WorkflowContext
from pgq_supervisor.workflows.replay import Replay

WORKFLOW = "bench_workflow"
READY = 1000


def _noop() -> None:
    return None


def _noop_conn(conn: db.Conn) -> None:
    return None


@dataclass(frozen=True, slots=True)
class StepTimes:
    plain_us: float  # per step
    conn_us: float
    replay_us: float
    steps: int

    def details(self) -> dict[str, Json]:
        return {
            "steps": self.steps,
            "plain_us": round(self.plain_us, 1),
            "conn_us": round(self.conn_us, 1),
            "replay_us": round(self.replay_us, 1),
        }


def _claimed(conn: db.Conn) -> Job:
    conn.execute("INSERT INTO pgq.job (type, payload) VALUES (%s, '{}')", (WORKFLOW,))
    (job,) = db.claim(conn, SCHEMA, worker_id="bench", types=[WORKFLOW], max_retry_counts=[3],
                      limit=1)  # fmt: skip
    return job


def time_steps(dsn: str, n: int) -> StepTimes:
    """Microseconds per no-op step: plain, `conn`, and replayed (see the module docstring)."""
    reset(dsn)
    registry = Registry()
    registry.workflow(WORKFLOW)(lambda ctx, payload: None)
    policy = registry.policy(WORKFLOW)
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = _claimed(conn)
        ctx = WorkflowContext(job, conn, SCHEMA, Replay(job, policy, [], []))
        start = time.perf_counter()
        for i in range(n):
            ctx.step(f"plain {i}", _noop)
        plain = (time.perf_counter() - start) / n
        start = time.perf_counter()
        for i in range(n):
            ctx.step(f"conn {i}", _noop_conn)
        with_conn = (time.perf_counter() - start) / n
        start = time.perf_counter()
        steps, signals = wdb.history(conn, SCHEMA, job.id)
        replay = WorkflowContext(job, conn, SCHEMA, Replay(job, policy, steps, signals))
        for i in range(n):
            replay.step(f"plain {i}", _noop)
        for i in range(n):
            replay.step(f"conn {i}", _noop_conn)
        replayed = (time.perf_counter() - start) / (2 * n)
    return StepTimes(plain * 1e6, with_conn * 1e6, replayed * 1e6, n)


def fill_sleepers(conn: psycopg.Connection[TupleRow], n: int) -> None:
    """`n` workflows asleep: pending, due within the hour, five step rows each."""
    conn.execute(
        """
        WITH sleepers AS (
            INSERT INTO pgq.job (type, payload, start_at)
            SELECT %s, '{}', now() + interval '1 minute' + g * (interval '1 hour' / %s)
            FROM generate_series(1, %s) g
            RETURNING id, start_at
        )
        INSERT INTO pgq.workflow_step (job_id, seq, name, kind, state, wake_at)
        SELECT id, s, 'step ' || s, CASE WHEN s = 4 THEN 'sleep' ELSE 'step' END,
               CASE WHEN s = 4 THEN 'sleeping' ELSE 'succeeded' END,
               CASE WHEN s = 4 THEN start_at END
        FROM sleepers, generate_series(0, 4) s
        """,
        (NOOP, n, n),
    )


@dataclass(frozen=True, slots=True)
class SleepersRun:
    without: PollTimes
    with_sleepers: PollTimes
    sleepers: int

    @property
    def claim_added_ms(self) -> float:
        return self.with_sleepers.claim_ms - self.without.claim_ms

    def details(self) -> dict[str, Json]:
        return {"sleepers": self.sleepers, "without": self.without.to_json(),
                "with": self.with_sleepers.to_json()}  # fmt: skip


def run_sleepers(dsn: str, sleepers: int, samples: int) -> SleepersRun:
    reset(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        fill_pending(conn, READY)
    settle(dsn, ["pgq.job"])
    without = time_polls(dsn, samples)
    with psycopg.connect(dsn, autocommit=True) as conn:
        fill_sleepers(conn, sleepers)
    settle(dsn, ["pgq.job", "pgq.workflow_step"])
    return SleepersRun(without, time_polls(dsn, samples), sleepers)
