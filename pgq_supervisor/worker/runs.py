"""Every way a child runs a job, each ending in the `Settlement` the completer writes.

    run_sync ─────────── a sync handler, on the calling thread (sync.py's loop, or a thread of
      │                  inflight.py's); one that takes `conn` goes to run_in_transaction
      run_in_transaction  its writes and its fenced success in one transaction, on the worker's
                          own connection or a pooled one: they commit together, or neither
    run_async ────────── an async handler, a task cancelled at its timeout; in a transaction
                          on a pooled connection if it takes `conn`, as run_in_transaction

Nothing here touches the Completer (it is the loop's alone): the loop hands it the settlement
(Completer.settle). A plain success is the executor's own `Ran`, nothing more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Final, NamedTuple

from pgq_supervisor import db
from pgq_supervisor.errors import LeaseLost
from pgq_supervisor.jobs import Job, JobId
from pgq_supervisor.worker.executor import Executor, Ran

# handlers' pooled connections: their transaction is explicit, their commit durable
POOL_KWARGS: Final[dict[str, Any]] = {"autocommit": True, "application_name": "pgq-handler"}


class Committed(NamedTuple):
    """A `conn` handler's writes and its job's success committed together."""

    job: Job
    took: float


class Lost(NamedTuple):
    """The job's fenced success found its lease gone (its writes were rolled back), or its
    task was cancelled: nothing is written."""

    job: Job
    took: float


class TimedOut(NamedTuple):
    """An async job outran its timeout and was cancelled: its attempt ends as a timeout,
    retried after `retry_delay` if it has attempts left."""

    job: Job
    timeout: float
    took: float
    retry_delay: float


# Ran: a handler without `conn` (a success to buffer, or a failure to write), or a `conn`
# handler's failure (its writes rolled back)
Settlement = Ran | Committed | Lost | TimedOut

Connect = Callable[[], AbstractContextManager[db.Conn]]
ConnectAsync = Callable[[], AbstractAsyncContextManager[db.AsyncConn]]


class _Undo(Exception):
    """Raised inside a handler's transaction to roll its writes back: the run failed."""

    def __init__(self, ran: Ran) -> None:
        self.ran = ran


def run_sync(
    executor: Executor, job: Job, schema: str, connection: Connect | None = None
) -> Settlement:
    """Run `job`'s handler on this thread. One that takes `conn` runs in a transaction on a
    connection of `connection` (run_in_transaction); without `connection` it cannot run. A
    workflow runs on a connection of `connection` outside a transaction: each of its steps
    commits its own."""
    if connection is not None and executor.is_workflow(job):
        with connection() as conn:
            return executor.run(job, conn)
    if connection is not None and executor.takes_conn(job):
        return run_in_transaction(executor, job, schema, connection())
    return executor.run(job)


def _ephemeral(executor: Executor, job: Job) -> list[JobId]:
    handler = executor.registry.handlers.get(job.type)
    return [job.id] if handler is not None and handler.ephemeral else []


def run_in_transaction(
    executor: Executor,
    job: Job,
    schema: str,
    connection: AbstractContextManager[db.Conn],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Settlement:
    """Run a sync handler that takes `conn` in a transaction on the connection `connection`
    gives, its fenced success written in it. A failure (the handler's, or the commit's: a
    deferred constraint, say) rolls its writes back and is the settlement."""
    start = clock()
    try:
        with connection as conn, conn.transaction():
            # the handler's own writes are user data: durable even when bookkeeping is not
            db.durable_commit(conn)
            ran = _succeeded(executor.run(job, conn))
            gone = _ephemeral(executor, job)
            _fence(job, db.succeed(conn, schema, job.lease, [(job.id, ran.result)], gone))
    except Exception as exc:
        return _settlement(executor, job, exc, clock() - start, None)
    return Committed(job, clock() - start)


async def run_async(
    executor: Executor,
    job: Job,
    timeout: float | None,
    schema: str,
    connection: ConnectAsync | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Settlement:
    """Run an async handler, cancelled after `timeout`; in a transaction on a connection of
    `connection` if it takes `conn` (then `connection` must be given), as run_in_transaction."""
    start = clock()
    if connection is None or executor.is_workflow(job):
        try:
            if connection is None:
                return await asyncio.wait_for(executor.run_async(job), timeout)
            async with connection() as conn:  # a workflow: its steps commit one by one
                return await asyncio.wait_for(executor.run_async(job, conn), timeout)
        except TimeoutError:
            return _timed_out(executor, job, timeout, clock() - start)
    try:
        async with connection() as conn, conn.transaction():
            await db.durable_commit_async(conn)
            ran = _succeeded(await asyncio.wait_for(executor.run_async(job, conn), timeout))
            gone = _ephemeral(executor, job)
            result = [(job.id, ran.result)]
            _fence(job, await db.succeed_async(conn, schema, job.lease, result, gone))
    except Exception as exc:
        return _settlement(executor, job, exc, clock() - start, timeout)
    return Committed(job, clock() - start)


def _succeeded(ran: Ran) -> Ran:
    """A run in a transaction that failed rolls its writes back."""
    if ran.failure is not None:
        raise _Undo(ran)
    return ran


def _fence(job: Job, held: set[JobId]) -> None:
    """The success was written only if the job's lease still held."""
    if not held:
        raise LeaseLost(f"job {job.id} lost its lease")


def _settlement(
    executor: Executor, job: Job, exc: Exception, took: float, timeout: float | None
) -> Settlement:
    """What an exception out of a handler's transaction makes of the run (`timeout`: an async
    run's, None for a sync run, which is never cancelled)."""
    match exc:
        case _Undo():
            return exc.ran  # its writes rolled back: its failure is written after
        case LeaseLost():
            return Lost(job, took)
        case TimeoutError() if timeout is not None:
            return _timed_out(executor, job, timeout, took)
        case _:  # COMMIT, the pool or our own statement failed: the job's failure too
            return executor.failed(job, exc, took)


def _timed_out(executor: Executor, job: Job, timeout: float | None, took: float) -> TimedOut:
    return TimedOut(job, timeout or 0.0, took, executor.retry_delay(job))
