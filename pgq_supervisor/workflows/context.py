"""`ctx`, what a sync workflow handler is given: its steps, sleeps, waits and child jobs.

    @registry.workflow("onboard")
    def onboard(ctx: pgq.WorkflowContext, payload: dict) -> dict:
        account = ctx.step("create", create_account, payload["email"])  # conn: exactly once
        ctx.sleep("grace", timedelta(days=1))      # the job leaves its worker meanwhile
        answer = ctx.wait_for("approved", timeout=3600)  # pgq.signal(conn, job_id, ...)

Every call writes its row on the job's connection (autocommit: each row commits on its own,
durably), fenced by the job's lease; see replay.py for how a run walks its history, and
schema/0020 for the tables. A sleep or a wait raises Suspend: the completer puts the job back to
pending, due when it should wake, no attempt counted; the next run replays to that place.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from uuid import UUID

from pgq_supervisor import db
from pgq_supervisor.client import enqueue
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


class WorkflowContext:
    """The `ctx` of a sync workflow (see the module docstring). Made by the executor."""

    def __init__(self, job: Job, conn: db.Conn, schema: str, replay: Replay) -> None:
        self.job = job
        self.conn = conn
        self.schema = schema
        self.replay = replay

    @property
    def job_id(self) -> JobId:
        return self.job.id

    def step(self, name: str, fn: Callable[..., object], *args: object) -> JsonValue:
        """Run `fn(*args)` once and return its JSON result (as JSON gives it back: a tuple
        comes back a list), stored: a replay returns it without running `fn`. A `fn` that
        takes `conn` gets the job's connection in a transaction that also writes the step's
        row: its writes happen exactly once. Others run at least once (a crash between `fn`
        and its row runs it again). A failure is retried after the type's backoff while the
        step has tries left (each step has the job's retry budget), then raises StepFailed."""
        place = self.replay.take(name, "step")
        if isinstance(place, Stored):
            return place.value
        tries = place.tries + 1
        start = time.monotonic()
        try:
            if takes_conn(fn):
                with self.conn.transaction():
                    db.durable_commit(self.conn)
                    text, value = as_json(fn(*args, conn=self.conn), f"step {name!r} result")
                    self._write(place, name, "step", "succeeded", result=text, tries=tries,
                                duration=time.monotonic() - start)  # fmt: skip
                return value
            text, value = as_json(fn(*args), f"step {name!r} result")
        except (LeaseLost, Suspend):
            raise
        except _Unwritten:
            raise LeaseLost(f"job {self.job.id} lost its lease in step {name!r}") from None
        except Exception as exc:
            self._failed(place, name, tries, exc, time.monotonic() - start)
        self._commit(place, name, "step", "succeeded", result=text, tries=tries,
                     duration=time.monotonic() - start)  # fmt: skip
        return value

    def sleep(self, name: str, duration: float | timedelta) -> None:
        """Sleep `duration` (seconds or a timedelta), counted from the first time the run got
        here: the job leaves its worker and comes back due then."""
        self._sleep(name, seconds(duration), None)

    def sleep_until(self, name: str, when: datetime) -> None:
        """Sleep until `when` (an aware datetime)."""
        if when.tzinfo is None:
            raise ValueError(f"sleep_until {name!r}: give an aware datetime, got {when!r}")
        self._sleep(name, None, when)

    def wait_for(self, name: str, *, timeout: float | timedelta | None = None) -> JsonValue:
        """Sleep until the signal `name` is sent to this job (pgq.signal, from any process;
        one sent earlier is kept) and return its payload. Past `timeout` (counted from the
        first time the run got here): WaitTimeout, which the workflow may catch."""
        limit = None if timeout is None else seconds(timeout)
        place = self.replay.take(name, "wait")
        if isinstance(place, Stored):
            return place.value
        if name in self.replay.signals:
            payload = self.replay.signals[name]
            self._commit(place, name, "wait", "succeeded", result=dump_json(payload))
            return payload
        left = place.record.wake_in if place.record is not None else None
        if place.record is None:
            left = self._commit(place, name, "wait", "waiting", wake_in=limit)
        if left is not None and left <= 0:
            self._commit(place, name, "wait", "timed_out", error="timed out")
            raise WaitTimeout(name)
        raise Suspend.waiting(
            name, FOREVER if left is None else min(FOREVER, left), left is not None
        )

    def enqueue(
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
        """Enqueue a child job once (a step: a replay returns the same id). Its end wakes
        this workflow when it waits for it (`wait`)."""
        place = self.replay.take(name, "enqueue")
        if isinstance(place, Stored):
            return JobId(UUID(str(place.value)))
        try:
            with self.conn.transaction():
                db.durable_commit(self.conn)
                child = enqueue(
                    self.conn, type, payload, priority=priority, start_at=start_at,
                    max_retry_count=max_retry_count, timeout=timeout,
                    concurrency_key=concurrency_key, schema=self.schema,
                )  # fmt: skip
                wdb.adopt(self.conn, self.schema, child, self.job.id)
                self._write(place, name, "enqueue", "succeeded", result=dump_json(str(child)))
        except _Unwritten:
            raise LeaseLost(f"job {self.job.id} lost its lease in step {name!r}") from None
        return child

    def wait(self, job_id: IdLike, *, timeout: float | timedelta | None = None) -> JsonValue:
        """Sleep until the child `job_id` (from `ctx.enqueue`) ends; its result if it
        succeeded, else ChildFailed (the workflow may catch it). Past `timeout`: WaitTimeout."""
        job_id = parse_job_id(job_id)  # its string form too, spelt as the end signal is
        outcome = self.wait_for(f"job:{job_id}", timeout=timeout)
        if not isinstance(outcome, dict):
            raise PermanentError(f"child job {job_id}: unexpected end signal {outcome!r}")
        state = outcome.get("state")
        if state == "succeeded":
            return outcome.get("result")
        error = outcome.get("error")
        raise ChildFailed(job_id, str(state), error if isinstance(error, str) else None)

    def patched(self, name: str) -> bool:
        """Version a change: `if ctx.patched("v2-email"): new code else: old code`. True for
        runs that reach this place for the first time (the marker is stored), and on their
        replays; False for a run whose history was written by the old code here."""
        decided = self.replay.patched(name)
        if isinstance(decided, bool):
            return decided
        self._commit(Pending(decided, None), name, "patch", "succeeded")
        return True

    def _sleep(self, name: str, duration: float | None, until: datetime | None) -> None:
        place = self.replay.take(name, "sleep")
        if isinstance(place, Stored):
            return
        if place.record is None:
            left = self._commit(place, name, "sleep", "sleeping", wake_in=duration, wake_at=until)
        else:
            left = place.record.wake_in
        if left is not None and left > 0:
            raise Suspend.sleeping(name, min(left, FOREVER))
        self._commit(place, name, "sleep", "succeeded")

    def _failed(self, place: Pending, name: str, tries: int, exc: Exception, took: float) -> None:
        """A step's try failed: retried later (Suspend) or failed for good (StepFailed)."""
        error = f"{type(exc).__name__}: {exc}"
        delay = None if isinstance(exc, PermanentError) else self.replay.retry_delay(tries)
        if delay is None:
            self._commit(place, name, "step", "failed", error=error, tries=tries, duration=took)
            raise StepFailed(name, error) from exc
        self._commit(place, name, "step", "retrying", error=error, tries=tries,
                     duration=took, wake_in=delay)  # fmt: skip
        raise Suspend.retrying(name, delay, tries) from exc

    def _commit(
        self, place: Pending, name: str, kind: str, state: str, *,
        result: str | None = None, error: str | None = None, tries: int = 0,
        wake_in: float | None = None, wake_at: datetime | None = None,
        duration: float | None = None,
    ) -> float | None:  # fmt: skip
        """Write the row in its own durable transaction; its wake_in."""
        try:
            with self.conn.transaction():
                db.durable_commit(self.conn)
                return self._write(place, name, kind, state, result=result, error=error,
                                   tries=tries, wake_in=wake_in, wake_at=wake_at,
                                   duration=duration)  # fmt: skip
        except _Unwritten:
            raise LeaseLost(f"job {self.job.id} lost its lease in step {name!r}") from None

    def _write(
        self, place: Pending, name: str, kind: str, state: str, *,
        result: str | None = None, error: str | None = None, tries: int = 0,
        wake_in: float | None = None, wake_at: datetime | None = None,
        duration: float | None = None,
    ) -> float | None:  # fmt: skip
        """Write the row in the transaction open on the connection; _Unwritten if it was not."""
        params = wdb.record_params(
            self.job.id, self.job.lease, place.seq, name, kind, state, result=result,
            error=error, tries=tries, wake_in=wake_in, wake_at=wake_at, duration=duration,
        )  # fmt: skip
        written = wdb.record(self.conn, self.schema, params)
        if written is None:
            raise _Unwritten
        tally.count(self.job.type, kind, state)
        return written.wake_in
