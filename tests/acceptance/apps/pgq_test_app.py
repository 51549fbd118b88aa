"""Handlers for process tests. Effects are written to the `effects` table through the job's
connection, so a test can count exactly what ran and where."""

from __future__ import annotations

import os
import time

import pgq_supervisor as pgq
from pgq_supervisor.db import Conn

registry = pgq.Registry()
NO_BACKOFF = pgq.RetryPolicy(base=0.0, cap=0.0)

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS effects (
    job_id uuid NOT NULL, pid int NOT NULL, attempt int NOT NULL, note text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

# A handler waits at each step until the test opens its gate (a row here).
GATES_DDL = "CREATE TABLE IF NOT EXISTS gates (job_id uuid NOT NULL, step int NOT NULL)"


def _effect(conn: Conn, job: pgq.Job, note: str = "") -> None:
    conn.execute(
        "INSERT INTO effects (job_id, pid, attempt, note) VALUES (%s, %s, %s, %s)",
        (job.id, os.getpid(), job.attempt, note),
    )


@registry.handler("noop")
def noop(payload: dict[str, int]) -> None:
    return None


@registry.handler("rated", rate=(20, 1.0))
def rated(payload: dict[str, int]) -> None:
    """At most 20 starts a second, across every supervisor."""
    return None


@registry.handler("record", retry=NO_BACKOFF)
def record(payload: dict[str, int], job: pgq.Job, conn: Conn) -> dict[str, int]:
    """Writes one effect row in the same transaction as the job's completion."""
    _effect(conn, job)
    return {"pid": os.getpid()}


@registry.handler("sleep", max_retry_count=3, retry=NO_BACKOFF)
def sleep(payload: dict[str, float], job: pgq.Job, conn: Conn) -> dict[str, int]:
    """Sleeps `seconds` (a stand-in for slow I/O), then records its effect."""
    started = time.monotonic()
    while time.monotonic() - started < payload.get("seconds", 1.0):
        time.sleep(0.01)  # the handler's simulated work
    _effect(conn, job)
    return {"pid": os.getpid()}


@registry.handler("sleep_first", max_retry_count=3, retry=NO_BACKOFF)
def sleep_first(payload: dict[str, float], job: pgq.Job, conn: Conn) -> None:
    """Long on the first attempt (a job to be interrupted), quick on later ones."""
    seconds = payload.get("seconds", 60.0) if job.attempt == 1 else 0.0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        time.sleep(0.01)  # the handler's simulated work
    _effect(conn, job)


@registry.handler("bundle_done", max_retry_count=20, retry=NO_BACKOFF)
def bundle_done(payload: dict[str, str], job: pgq.Job, conn: Conn) -> None:
    """A bundle's completion job: records which bundle it completed."""
    _effect(conn, job, payload["bundle_id"])


@registry.handler("spin", timeout=1.0, max_retry_count=2, retry=NO_BACKOFF)
def spin(payload: dict[str, int]) -> None:
    """CPU-bound forever: a pure-Python loop that never returns to a checkpoint."""
    x = 0
    while True:
        x += 1


@registry.handler("busy_loop", max_retry_count=3, retry=NO_BACKOFF)
def busy_loop(payload: dict[str, int]) -> None:
    """CPU-bound with no timeout: only a cancel (or a kill) ends it."""
    while True:
        pass


@registry.handler("poison", max_retry_count=2, retry=NO_BACKOFF)
def poison(payload: dict[str, int]) -> None:
    os._exit(1)


@registry.handler("fail", max_retry_count=1, retry=NO_BACKOFF)
def fail(payload: dict[str, int]) -> None:
    raise RuntimeError("boom")


@registry.handler("steps", retry=NO_BACKOFF)
def steps(payload: dict[str, int], job: pgq.Job, conn: Conn) -> dict[str, int]:
    """Reports progress at each of `n` steps, then waits for the test to open that step's
    gate. Inside its own transaction: the progress must show while it runs all the same."""
    n = payload["n"]
    for step in range(1, n + 1):
        job.report_progress({"fraction": step / n, "step": step})
        deadline = time.monotonic() + 60
        while not conn.execute(
            "SELECT 1 FROM gates WHERE job_id = %s AND step = %s", (job.id, step)
        ).fetchone():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {step} never opened")
            time.sleep(0.01)  # polling the gate, with a deadline
    _effect(conn, job)
    return {"steps": n}


# `steps`, at most one in flight per child: at --concurrency N the rest of a claim waits in the
# child, claimed but not started (the stop-signal tests release them)
registry.handler("capped_steps", concurrency=1, retry=NO_BACKOFF)(steps)


@registry.handler("step", max_retry_count=0)
def step(payload: dict[str, str | float | bool], job: pgq.Job) -> dict[str, object]:
    """A step of a dependency graph: returns its name and the results it was handed."""
    time.sleep(float(payload.get("seconds", 0.0)))  # the step's work
    if payload.get("fail"):
        raise pgq.PermanentError(f"{payload['name']} fails")
    return {"name": payload["name"], "saw": {str(k): v for k, v in job.dependency_results.items()}}


@registry.handler("flaky", max_retry_count=0, retry=NO_BACKOFF)
def flaky(payload: dict[str, str], job: pgq.Job, conn: Conn) -> dict[str, str]:
    """Fails (with a traceback) until the test opens the job's gate (a row in `gates`)."""
    row = conn.execute("SELECT 1 FROM gates WHERE job_id = %s", (job.id,)).fetchone()
    if row is None:
        raise RuntimeError("gate closed")
    return {"gate": "open"}


@registry.handler("gated")
def gated(payload: dict[str, str]) -> None:
    """Returns at once; one given a `gate` (a file's path) first waits for the test to create
    it: a slow job among fast ones of its type."""
    gate = payload.get("gate")
    deadline = time.monotonic() + 120
    while gate and not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        time.sleep(0.01)  # polling the gate, with a deadline
