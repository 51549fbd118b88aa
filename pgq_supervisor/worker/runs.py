"""How one job of a child with many in flight (inflight.py) runs, and what it came to.

An async handler runs as a task on the child's loop, cancelled at its timeout; a sync one runs
in a thread of the child. A handler that takes `conn` runs inside a transaction on a pooled
connection, and its job's fenced success is written in that same transaction, as
completion.Completer.run_in_transaction does at concurrency 1: its writes and its success
commit together, or neither. Nothing here touches the Completer (it is the loop's alone): a
run returns a `Settlement` that the loop hands to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgq_supervisor import db
from pgq_supervisor.errors import LeaseLost
from pgq_supervisor.jobs import Job
from pgq_supervisor.worker.executor import Executor, Ran

# handlers' pooled connections: their transaction is explicit, their commit durable
POOL_KWARGS: Final[dict[str, Any]] = {"autocommit": True, "application_name": "pgq-handler"}


class Committed(NamedTuple):
    """A `conn` handler's writes and its job's success committed together."""

    job: Job
    took: float


class Lost(NamedTuple):
    """The job's fenced success found its lease gone: its writes were rolled back."""

    job: Job
    took: float


class TimedOut(NamedTuple):
    """An async job outran its timeout and was cancelled."""

    job: Job
    timeout: float
    took: float


# Ran: a handler without `conn` (a success to buffer, or a failure to write), or a `conn`
# handler's failure (its writes rolled back)
Settlement = Ran | Committed | Lost | TimedOut


class _Undo(Exception):
    """Raised inside a handler's transaction to roll its writes back: the run failed."""

    def __init__(self, ran: Ran) -> None:
        self.ran = ran


async def run_async(
    executor: Executor,
    job: Job,
    timeout: float | None,
    *,
    schema: str,
    pool: AsyncConnectionPool | None,
    clock: Callable[[], float] = time.monotonic,
) -> Settlement:
    """Run an async handler, cancelled after `timeout`; in a transaction on a connection of
    `pool` if it takes `conn` (then `pool` must be given)."""
    start = clock()
    if pool is None:
        try:
            return await asyncio.wait_for(executor.run_async(job), timeout)
        except TimeoutError:
            return TimedOut(job, timeout or 0.0, clock() - start)
    try:
        async with pool.connection() as conn, conn.transaction():
            await db.durable_commit_async(conn)
            ran = await asyncio.wait_for(executor.run_async(job, conn), timeout)
            if ran.failure is not None:
                raise _Undo(ran)
            if not await db.succeed_async(conn, schema, job.lease, [(job.id, ran.result)]):
                raise LeaseLost(f"job {job.id} lost its lease")
    except _Undo as undo:
        return undo.ran
    except LeaseLost:
        return Lost(job, clock() - start)
    except TimeoutError:
        return TimedOut(job, timeout or 0.0, clock() - start)
    except Exception as exc:  # COMMIT, the pool or our statement failed: the job's failure
        return executor.failed(job, exc, clock() - start)
    return Committed(job, clock() - start)


def run_in_transaction(
    executor: Executor,
    job: Job,
    *,
    schema: str,
    pool: ConnectionPool,
    clock: Callable[[], float] = time.monotonic,
) -> Settlement:
    """Run a sync handler that takes `conn` (in a thread) in a transaction on a connection
    of `pool`, its success written in it."""
    start = clock()
    try:
        with pool.connection() as conn, conn.transaction():
            db.durable_commit(conn)
            ran = executor.run(job, conn)
            if ran.failure is not None:
                raise _Undo(ran)
            if not db.succeed(conn, schema, job.lease, [(job.id, ran.result)]):
                raise LeaseLost(f"job {job.id} lost its lease")
    except _Undo as undo:
        return undo.ran
    except LeaseLost:
        return Lost(job, clock() - start)
    except Exception as exc:  # COMMIT, the pool or our statement failed: the job's failure
        return executor.failed(job, exc, clock() - start)
    return Committed(job, clock() - start)
