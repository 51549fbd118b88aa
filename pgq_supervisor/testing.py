"""Helpers for users' own tests: run a job inline, drain the queue synchronously in-process.

`drain` goes through the same claim, fencing and outcome writes as a real worker, on the
caller's database, so a test sees exactly the rows production would write. Progress a handler
reports is recorded (`DrainResult.progress`, or the `progress` list given to `run_inline`);
`drain` also writes each value at once, fenced, on the caller's connection, unthrottled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import os
import uuid
from collections.abc import Collection, Coroutine, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TypeVar

from pgq_supervisor import db
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.frameworks import ConnLike, as_psycopg
from pgq_supervisor.jobs import Job, JobId, JsonValue, LeaseToken, OutcomeKind
from pgq_supervisor.registry import Registry
from pgq_supervisor.worker import runs
from pgq_supervisor.worker.completion import Completer, Outcome
from pgq_supervisor.worker.executor import Executor
from pgq_supervisor.worker.progress import Recorder, reporting

_ZERO = uuid.UUID(int=0)
T = TypeVar("T")


def run_inline(
    registry: Registry,
    type: str,
    payload: JsonValue = None,
    *,
    progress: list[JsonValue] | None = None,
) -> object:
    """Validate `payload` and call the handler of `type` directly: no database, no retries.

    Each value the handler reports with `job.report_progress` is checked as a worker would
    and appended to `progress` when given. An `async def` handler is run to its end on its own
    event loop (in a thread if one is running here; `run_inline_async` awaits it on the
    running loop). Handlers that take `conn` cannot run this way (use `drain`)."""
    recorder = Recorder()
    with reporting(recorder):
        result = _call_inline(registry, type, payload)
        if inspect.iscoroutine(result):  # an async handler: run it to its end here
            result = _run_to_end(result)
    _recorded(recorder, progress)
    return result


async def run_inline_async(
    registry: Registry,
    type: str,
    payload: JsonValue = None,
    *,
    progress: list[JsonValue] | None = None,
) -> object:
    """`run_inline` from inside a running event loop: an `async def` handler is awaited on it."""
    recorder = Recorder()
    with reporting(recorder):
        result = _call_inline(registry, type, payload)
        if inspect.isawaitable(result):
            result = await result
    _recorded(recorder, progress)
    return result


def _call_inline(registry: Registry, type_: str, payload: JsonValue) -> object:
    handler = registry.get(type_)
    if handler.wants_conn:
        raise TypeError(f"handler {type_!r} takes conn: run it with drain() on a database")
    value = handler.validate({} if payload is None else payload)
    kwargs: dict[str, object] = {}
    if handler.wants_job:
        kwargs["job"] = Job(
            id=JobId(_ZERO),
            type=type_,
            payload=payload,
            priority=0,
            attempt=1,
            max_retry_count=handler.max_retry_count,
            timeout=handler.timeout,
            bundle_id=None,
            lease=LeaseToken(_ZERO),
        )
    return handler.func(value, **kwargs)


def _recorded(recorder: Recorder, progress: list[JsonValue] | None) -> None:
    if progress is not None:
        progress.extend(v for values in recorder.values.values() for v in values)


@dataclass
class DrainResult:
    outcomes: list[Outcome] = field(default_factory=list)
    # every value each job reported, in order
    progress: dict[JobId, list[JsonValue]] = field(default_factory=dict)

    def count(self, kind: OutcomeKind | str) -> int:
        return sum(1 for o in self.outcomes if o.kind == kind)

    @property
    def succeeded(self) -> int:
        return self.count(OutcomeKind.SUCCEEDED)

    @property
    def failed(self) -> int:
        return self.count(OutcomeKind.FAILED)

    @property
    def retried(self) -> int:
        return self.count(OutcomeKind.RETRIED)

    @property
    def snoozed(self) -> int:
        """Snoozes (pgq.Snooze); a workflow's sleep, wait or step retry is `suspended`."""
        return self.count(OutcomeKind.SNOOZED)

    @property
    def suspended(self) -> int:
        """Workflow runs that ended in a sleep, a wait or a step's retry (the job pending)."""
        return self.count(OutcomeKind.SUSPENDED)


class _Drain:
    """One drain: claims, runs and settles on the caller's connection. Off autocommit (a test
    inside a transaction: Django's TestCase, a SQLAlchemy session) every claim and write is a
    savepoint in that transaction, so nothing commits and a failed statement undoes only
    itself. Whatever a run raises, every job claimed is settled or released before it
    propagates: none is left `running`."""

    def __init__(
        self, conn: db.Conn, registry: Registry, ignore: Collection[str], schema: str | None
    ) -> None:
        s = schema or db.default_schema()
        self.conn = conn
        self.schema = s
        self.registry = registry
        self.types = [t for t in registry.types if t not in ignore]
        worker_id = f"testing:{os.getpid()}"
        recorder = Recorder(conn, s)
        self.executor = Executor(registry, worker_id, progress=recorder, schema=s)
        self.completer = Completer(s, worker_id, ephemeral=registry.ephemeral_types())
        self.policy = registry.claim_policy(self.types)
        self.result = DrainResult(progress=recorder.values)
        self.held: list[Job] = []  # claimed, not yet settled

    def step(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self.conn.autocommit else db.atomic(self.conn)

    def claim(self, max_jobs: int | None, batch: int) -> list[Job]:
        done = len(self.result.outcomes)
        if not self.types or (max_jobs is not None and done >= max_jobs):
            return []
        limit = batch if max_jobs is None else min(batch, max_jobs - done)
        with self.step():
            self.held = self.completer.claim(self.conn, self.policy, limit)
        return list(self.held)

    def async_jobs(self, max_jobs: int | None, batch: int) -> Iterator[Job]:
        """Claim and run until none is ready; the jobs of `async def` handlers are yielded for
        the caller to run (on a loop of its choosing) and `report`."""
        while jobs := self.claim(max_jobs, batch):
            for job in jobs:
                if self.async_handler(job):
                    yield job
                else:
                    self.run(job)
            self.flush()

    @contextlib.contextmanager
    def settling(self) -> Iterator[DrainResult]:
        try:
            yield self.result
        except BaseException:
            self.abandon()
            raise

    def async_handler(self, job: Job) -> bool:
        handler = self.registry.handlers.get(job.type)
        if handler is None or not handler.is_async:
            return False
        if handler.workflow:
            raise TypeError(
                f"workflow {job.type!r} is async: drain() runs sync workflows only; run it"
                " under the supervisor"
            )
        if handler.wants_conn:
            raise TypeError(
                f"handler {job.type!r} is async and takes conn: drain() cannot give it"
                " an AsyncConnection; run it under the supervisor"
            )
        return True

    def run(self, job: Job) -> None:
        settlement = runs.run_sync(self.executor, job, self.schema, self._own_conn)
        self.report(settlement)

    def _own_conn(self) -> nullcontext[db.Conn]:  # `conn` handlers: in a transaction on it
        return nullcontext(self.conn)

    def report(self, settlement: runs.Settlement) -> None:
        with self.step():
            self.completer.settle(self.conn, settlement)
        self.held.remove(settlement.job)

    def flush(self) -> None:
        with self.step():
            self.completer.flush(self.conn)
        self.result.outcomes.extend(self.completer.take_outcomes())

    def abandon(self) -> None:
        """A run raised: write the successes run so far, release the jobs not settled."""
        with contextlib.suppress(DatabaseError):
            self.flush()
        self.completer.discard()  # what could not be written runs again
        with contextlib.suppress(DatabaseError), self.step():
            self.completer.release(self.conn, self.held)
        self.held = []


def drain(
    conn: ConnLike,
    registry: Registry,
    *,
    ignore: Collection[str] = (),
    max_jobs: int | None = None,
    batch: int = 10,
    schema: str | None = None,
) -> DrainResult:
    """Run ready jobs of the registry's types (minus `ignore`) until none is ready.

    On an autocommit connection each outcome commits as the worker's would; on one inside a
    transaction (or not autocommit) claims and outcomes are savepoints in that transaction.
    Retries whose backoff has not elapsed are left pending. An `async def` handler runs on its
    own event loop (in a thread when one is running here: in an async test, `drain_async`
    runs it on the test's loop). If a handler raises past its job (KeyboardInterrupt,
    pytest.fail), the jobs claimed are settled or released first.
    """
    d = _Drain(as_psycopg(conn), registry, ignore, schema)
    with d.settling() as result:
        for job in d.async_jobs(max_jobs, batch):
            d.report(_run_to_end(d.executor.run_async(job)))
    return result


async def drain_async(
    conn: ConnLike,
    registry: Registry,
    *,
    ignore: Collection[str] = (),
    max_jobs: int | None = None,
    batch: int = 10,
    schema: str | None = None,
) -> DrainResult:
    """`drain` from inside a running event loop (pytest-asyncio, anyio): `async def` handlers
    are awaited on that loop. `conn` is a sync connection (the pgq_conn fixture): the queue's
    statements block the loop briefly, as a test can afford."""
    d = _Drain(as_psycopg(conn), registry, ignore, schema)
    with d.settling() as result:
        for job in d.async_jobs(max_jobs, batch):
            d.report(await d.executor.run_async(job))
    return result


def _run_to_end(coro: Coroutine[object, object, T]) -> T:
    """asyncio.run, also from a thread whose loop is running (there, on a thread of its own:
    asyncio.run refuses to nest), in a copy of this context (job.report_progress is bound in a
    context variable)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pgq-drain") as pool:
        return pool.submit(contextvars.copy_context().run, asyncio.run, coro).result()
