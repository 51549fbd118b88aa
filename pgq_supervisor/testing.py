"""Helpers for users' own tests: run a job inline, drain the queue synchronously in-process.

`drain` goes through the same claim, fencing and outcome writes as a real worker, on the
caller's database, so a test sees exactly the rows production would write. Progress a handler
reports is recorded (`DrainResult.progress`, or the `progress` list given to `run_inline`);
`drain` also writes each value at once, fenced, on the caller's connection, unthrottled.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import uuid
from collections.abc import Collection
from contextlib import nullcontext
from dataclasses import dataclass, field

from pgq_supervisor import db
from pgq_supervisor.jobs import Job, JobId, JsonValue, LeaseToken, OutcomeKind
from pgq_supervisor.registry import Registry
from pgq_supervisor.worker import runs
from pgq_supervisor.worker.completion import Completer, Outcome
from pgq_supervisor.worker.executor import Executor
from pgq_supervisor.worker.progress import Recorder, reporting

_ZERO = uuid.UUID(int=0)


def run_inline(
    registry: Registry,
    type: str,
    payload: JsonValue = None,
    *,
    progress: list[JsonValue] | None = None,
) -> object:
    """Validate `payload` and call the handler of `type` directly: no database, no retries.

    Each value the handler reports with `job.report_progress` is checked as a worker would
    and appended to `progress` when given. An `async def` handler is run to its end with
    asyncio.run (so not from inside a running event loop). Handlers that take `conn` cannot
    run this way (use `drain`)."""
    handler = registry.get(type)
    if handler.wants_conn:
        raise TypeError(f"handler {type!r} takes conn: run it with drain() on a database")
    value = handler.validate({} if payload is None else payload)
    kwargs: dict[str, object] = {}
    if handler.wants_job:
        kwargs["job"] = Job(
            id=JobId(_ZERO),
            type=type,
            payload=payload,
            priority=0,
            attempt=1,
            max_retry_count=handler.max_retry_count,
            timeout=handler.timeout,
            bundle_id=None,
            lease=LeaseToken(_ZERO),
        )
    recorder = Recorder()
    with reporting(recorder):
        result = handler.func(value, **kwargs)
        if inspect.iscoroutine(result):  # an async handler: run it to its end here
            result = asyncio.run(result)
    if progress is not None:
        progress.extend(v for values in recorder.values.values() for v in values)
    return result


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


def drain(
    conn: db.Conn,
    registry: Registry,
    *,
    ignore: Collection[str] = (),
    max_jobs: int | None = None,
    batch: int = 10,
    schema: str | None = None,
) -> DrainResult:
    """Run ready jobs of the registry's types (minus `ignore`) until none is ready.

    `conn` must be in autocommit mode: each outcome commits as the worker's would. Retries
    whose backoff has not elapsed are left pending.
    """
    if not conn.autocommit:
        raise ValueError("drain() needs an autocommit connection")
    s = schema or db.default_schema()
    types = [t for t in registry.types if t not in ignore]
    worker_id = f"testing:{os.getpid()}"
    recorder = Recorder(conn, s)
    executor = Executor(registry, worker_id, progress=recorder)
    completer = Completer(s, worker_id)
    policy = registry.claim_policy(types)

    def own_conn() -> nullcontext[db.Conn]:  # `conn` handlers: in a transaction on it
        return nullcontext(conn)

    result = DrainResult(progress=recorder.values)
    while types and (max_jobs is None or len(result.outcomes) < max_jobs):
        limit = batch if max_jobs is None else min(batch, max_jobs - len(result.outcomes))
        jobs = completer.claim(conn, policy, limit)
        if not jobs:
            break
        for job in jobs:
            handler = registry.handlers.get(job.type)
            if handler is not None and handler.is_async:
                if handler.wants_conn:
                    completer.release(conn, [job])
                    raise TypeError(
                        f"handler {job.type!r} is async and takes conn: drain() cannot give it"
                        " an AsyncConnection; run it under the supervisor"
                    )
                completer.settle(conn, asyncio.run(executor.run_async(job)))
            else:
                completer.settle(conn, runs.run_sync(executor, job, s, own_conn))
        completer.flush(conn)
        result.outcomes.extend(completer.take_outcomes())
    return result
