"""`ctx` of an `async def` workflow: context.py's WorkflowContext with awaitable calls, on a
pooled async connection (autocommit: each step's row commits on its own). A step's `fn` may be
sync or async; one that takes `conn` gets the async connection, in its row's transaction."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from uuid import UUID

from pgq_supervisor import db
from pgq_supervisor.client import enqueue_async
from pgq_supervisor.db import workflows as wdb
from pgq_supervisor.errors import (
    ChildFailed,
    LeaseLost,
    PermanentError,
    StepFailed,
    Suspend,
    WaitTimeout,
)
from pgq_supervisor.ids import job_id as parse_job_id
from pgq_supervisor.jobs import IdLike, Job, JobId, JsonValue
from pgq_supervisor.jsontext import dump_json
from pgq_supervisor.workflows import tally
from pgq_supervisor.workflows.replay import (
    FOREVER,
    Pending,
    Replay,
    Stored,
    as_json,
    seconds,
    takes_conn,
)


class _Unwritten(Exception):
    """The step's row was not written (lease lost): roll its transaction back."""


async def _called(fn: Callable[..., object], *args: object, **kwargs: object) -> object:
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value


class AsyncWorkflowContext:
    """The `ctx` of an async workflow: the calls of WorkflowContext, awaited."""

    def __init__(self, job: Job, conn: db.AsyncConn, schema: str, replay: Replay) -> None:
        self.job = job
        self.conn = conn
        self.schema = schema
        self.replay = replay

    @property
    def job_id(self) -> JobId:
        return self.job.id

    async def step(self, name: str, fn: Callable[..., object], *args: object) -> JsonValue:
        """WorkflowContext.step; `fn` may be a coroutine function."""
        place = self.replay.take(name, "step")
        if isinstance(place, Stored):
            return place.value
        tries = place.tries + 1
        start = time.monotonic()
        try:
            if takes_conn(fn):
                async with self.conn.transaction():
                    await db.durable_commit_async(self.conn)
                    value = await _called(fn, *args, conn=self.conn)
                    text, loaded = as_json(value, f"step {name!r} result")
                    await self._write(place, name, "step", "succeeded", result=text,
                                      tries=tries, duration=time.monotonic() - start)  # fmt: skip
                return loaded
            text, loaded = as_json(await _called(fn, *args), f"step {name!r} result")
        except (LeaseLost, Suspend):
            raise
        except _Unwritten:
            raise LeaseLost(f"job {self.job.id} lost its lease in step {name!r}") from None
        except Exception as exc:
            await self._failed(place, name, tries, exc, time.monotonic() - start)
        await self._commit(place, name, "step", "succeeded", result=text, tries=tries,
                           duration=time.monotonic() - start)  # fmt: skip
        return loaded

    async def sleep(self, name: str, duration: float | timedelta) -> None:
        """WorkflowContext.sleep."""
        await self._sleep(name, seconds(duration), None)

    async def sleep_until(self, name: str, when: datetime) -> None:
        """WorkflowContext.sleep_until."""
        if when.tzinfo is None:
            raise ValueError(f"sleep_until {name!r}: give an aware datetime, got {when!r}")
        await self._sleep(name, None, when)

    async def wait_for(self, name: str, *, timeout: float | timedelta | None = None) -> JsonValue:
        """WorkflowContext.wait_for."""
        limit = None if timeout is None else seconds(timeout)
        place = self.replay.take(name, "wait")
        if isinstance(place, Stored):
            return place.value
        if name in self.replay.signals:
            payload = self.replay.signals[name]
            await self._commit(place, name, "wait", "succeeded", result=dump_json(payload))
            return payload
        left = place.record.wake_in if place.record is not None else None
        if place.record is None:
            left = await self._commit(place, name, "wait", "waiting", wake_in=limit)
        if left is not None and left <= 0:
            await self._commit(place, name, "wait", "timed_out", error="timed out")
            raise WaitTimeout(name)
        raise Suspend.waiting(
            name, FOREVER if left is None else min(FOREVER, left), left is not None
        )

    async def enqueue(
        self,
        name: str,
        type: str,
        payload: JsonValue = None,
        *,
        priority: int = 0,
        start_at: datetime | None = None,
        max_retry_count: int | None = None,
        timeout: float | None = None,
        concurrency_key: str | None = None,
    ) -> JobId:
        """WorkflowContext.enqueue."""
        place = self.replay.take(name, "enqueue")
        if isinstance(place, Stored):
            return JobId(UUID(str(place.value)))
        try:
            async with self.conn.transaction():
                await db.durable_commit_async(self.conn)
                child = await enqueue_async(
                    self.conn, type, payload, priority=priority, start_at=start_at,
                    max_retry_count=max_retry_count, timeout=timeout,
                    concurrency_key=concurrency_key, schema=self.schema,
                )  # fmt: skip
                await wdb.adopt_async(self.conn, self.schema, child, self.job.id)
                await self._write(place, name, "enqueue", "succeeded", result=dump_json(str(child)))
        except _Unwritten:
            raise LeaseLost(f"job {self.job.id} lost its lease in step {name!r}") from None
        return child

    async def wait(self, job_id: IdLike, *, timeout: float | timedelta | None = None) -> JsonValue:
        """WorkflowContext.wait."""
        job_id = parse_job_id(job_id)  # its string form too, spelt as the end signal is
        outcome = await self.wait_for(f"job:{job_id}", timeout=timeout)
        if not isinstance(outcome, dict):
            raise PermanentError(f"child job {job_id}: unexpected end signal {outcome!r}")
        state = outcome.get("state")
        if state == "succeeded":
            return outcome.get("result")
        error = outcome.get("error")
        raise ChildFailed(job_id, str(state), error if isinstance(error, str) else None)

    async def patched(self, name: str) -> bool:
        """WorkflowContext.patched."""
        decided = self.replay.patched(name)
        if isinstance(decided, bool):
            return decided
        await self._commit(Pending(decided, None), name, "patch", "succeeded")
        return True

    async def _sleep(self, name: str, duration: float | None, until: datetime | None) -> None:
        place = self.replay.take(name, "sleep")
        if isinstance(place, Stored):
            return
        if place.record is None:
            left = await self._commit(place, name, "sleep", "sleeping", wake_in=duration,
                                      wake_at=until)  # fmt: skip
        else:
            left = place.record.wake_in
        if left is not None and left > 0:
            raise Suspend.sleeping(name, min(left, FOREVER))
        await self._commit(place, name, "sleep", "succeeded")

    async def _failed(
        self, place: Pending, name: str, tries: int, exc: Exception, took: float
    ) -> None:
        error = f"{type(exc).__name__}: {exc}"
        delay = None if isinstance(exc, PermanentError) else self.replay.retry_delay(tries)
        if delay is None:
            await self._commit(place, name, "step", "failed", error=error, tries=tries,
                               duration=took)  # fmt: skip
            raise StepFailed(name, error) from exc
        await self._commit(place, name, "step", "retrying", error=error, tries=tries,
                           duration=took, wake_in=delay)  # fmt: skip
        raise Suspend.retrying(name, delay, tries) from exc

    async def _commit(
        self, place: Pending, name: str, kind: str, state: str, *,
        result: str | None = None, error: str | None = None, tries: int = 0,
        wake_in: float | None = None, wake_at: datetime | None = None,
        duration: float | None = None,
    ) -> float | None:  # fmt: skip
        try:
            async with self.conn.transaction():
                await db.durable_commit_async(self.conn)
                return await self._write(place, name, kind, state, result=result, error=error,
                                         tries=tries, wake_in=wake_in, wake_at=wake_at,
                                         duration=duration)  # fmt: skip
        except _Unwritten:
            raise LeaseLost(f"job {self.job.id} lost its lease in step {name!r}") from None

    async def _write(
        self, place: Pending, name: str, kind: str, state: str, *,
        result: str | None = None, error: str | None = None, tries: int = 0,
        wake_in: float | None = None, wake_at: datetime | None = None,
        duration: float | None = None,
    ) -> float | None:  # fmt: skip
        params = wdb.record_params(
            self.job.id, self.job.lease, place.seq, name, kind, state, result=result,
            error=error, tries=tries, wake_in=wake_in, wake_at=wake_at, duration=duration,
        )  # fmt: skip
        written = await wdb.record_async(self.conn, self.schema, params)
        if written is None:
            raise _Unwritten
        tally.count(self.job.type, kind, state)
        return written.wake_in
