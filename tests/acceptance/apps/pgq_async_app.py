"""Handlers for the many-jobs-in-flight tests (inflight.py): async ones on the child's loop,
sync ones in its threads. A handler's result says when it ran (wall clock, in the child), so a
test measures how many ran at once from the database, not from what it assumed."""

from __future__ import annotations

import asyncio
import os
import time

import psycopg

import pgq_supervisor as pgq

registry = pgq.Registry()
NO_BACKOFF = pgq.RetryPolicy(base=0.0, cap=0.0)

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS effects (
    job_id uuid NOT NULL, pid int NOT NULL, attempt int NOT NULL, note text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def _span(started: float) -> dict[str, float | int]:
    return {"pid": os.getpid(), "start": started, "end": time.time()}


@registry.handler("asleep", retry=NO_BACKOFF)
async def asleep(payload: dict[str, float]) -> dict[str, float | int]:
    started = time.time()
    await asyncio.sleep(payload.get("seconds", 0.1))  # the job's simulated async I/O
    return _span(started)


@registry.handler("tsleep", retry=NO_BACKOFF)
def tsleep(payload: dict[str, float]) -> dict[str, float | int]:
    """Blocking I/O, as a sync library does it: runs in the child's thread pool."""
    started = time.time()
    time.sleep(payload.get("seconds", 0.1))  # the job's simulated blocking I/O
    return _span(started)


@registry.handler("ahang", timeout=1.0, max_retry_count=1, retry=NO_BACKOFF)
async def ahang(payload: dict[str, int]) -> None:
    await asyncio.sleep(3600)  # never ends by itself: its timeout must cancel it


@registry.handler("thang", timeout=1.0, max_retry_count=1, retry=NO_BACKOFF)
def thang(payload: dict[str, int]) -> None:
    time.sleep(3600)  # a thread that never ends by itself: its timeout must kill the child


@registry.handler("apoison", max_retry_count=2, retry=NO_BACKOFF)
async def apoison(payload: dict[str, int]) -> None:
    """Kills its child every time it runs, as a segfault would."""
    await asyncio.sleep(0.05)  # in flight a moment beside its neighbours, then it kills them
    os._exit(1)


@registry.handler("arecord", retry=NO_BACKOFF)
async def arecord(
    payload: dict[str, str], job: pgq.Job, conn: psycopg.AsyncConnection[tuple[object, ...]]
) -> str:
    """Writes an effect through the job's connection; `steal`: an operator takes the job back
    (another connection) before it returns, so its lease is stale when the success is written."""
    await conn.execute(
        "INSERT INTO effects (job_id, pid, attempt, note) VALUES (%s, %s, %s, %s)",
        (job.id, os.getpid(), job.attempt, payload.get("note", "")),
    )
    await asyncio.sleep(0.01)  # the job's simulated async I/O after its write
    if payload.get("steal"):
        async with await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True) as other:
            await other.execute(
                "UPDATE pgq.job SET lease = gen_random_uuid() WHERE id = %s", (job.id,)
            )
    if payload.get("fail"):
        raise RuntimeError("handler failed after its write")
    return "done"


@registry.handler("acapped", concurrency=3, retry=NO_BACKOFF)
async def acapped(payload: dict[str, float]) -> dict[str, float | int]:
    """At most 3 of these in flight in one child, whatever the child's concurrency."""
    started = time.time()
    await asyncio.sleep(payload.get("seconds", 0.2))  # the job's simulated async I/O
    return _span(started)


@registry.handler("trecord", retry=NO_BACKOFF)
def trecord(
    payload: dict[str, str], job: pgq.Job, conn: psycopg.Connection[tuple[object, ...]]
) -> str:
    """The sync twin of arecord, in a thread of the child, on a pooled connection."""
    conn.execute(
        "INSERT INTO effects (job_id, pid, attempt, note) VALUES (%s, %s, %s, %s)",
        (job.id, os.getpid(), job.attempt, payload.get("note", "")),
    )
    if payload.get("fail"):
        raise RuntimeError("handler failed after its write")
    return "done"


@registry.handler("agated", concurrency=1, retry=NO_BACKOFF)
async def agated(payload: dict[str, str]) -> None:
    """One in flight per child. Returns at once; one given a `gate` (a file's path) first
    waits for the test to create it: a slow job among fast ones of its type."""
    gate = payload.get("gate")
    deadline = time.monotonic() + 120
    while gate and not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        await asyncio.sleep(0.01)  # polling the gate, with a deadline
