"""Runs a held job's handler and reports what happened. It writes nothing.

Shared by the worker child and by `pgq_supervisor.testing`. A run ends in a `Ran`: the
handler's result as JSON text, or a `Failure` that says what the completer must write (the
message, the data, whether the attempt may be retried and after how long, from the handler's
`Policy`). Writing it, fenced by the job's lease, is `completion.Completer`'s job.
"""

from __future__ import annotations

import inspect
import json
import logging
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import pydantic

from pgq_supervisor import db, tracing
from pgq_supervisor.errors import InvalidInput, PermanentError, Snooze, Suspend
from pgq_supervisor.jobs import AttemptKind, Job, JsonValue
from pgq_supervisor.jsontext import dump_payload
from pgq_supervisor.registry import Registry
from pgq_supervisor.worker.progress import ProgressSink, reporting
from pgq_supervisor.workflows.runner import workflow_call

log = logging.getLogger(__name__)


# The attempt kinds a run can end in (timeouts and deaths are the supervisor's to write); a
# snooze is no failure, but like one it is not a success and is written at once.
FailureKind = Literal[AttemptKind.ERROR, AttemptKind.PERMANENT, AttemptKind.SNOOZED]


@dataclass(frozen=True, slots=True)
class Failure:
    """An attempt that ended without success, as it is to be written."""

    kind: FailureKind
    message: str
    data: JsonValue
    retry_delay: float  # seconds before the retry, if the job has attempts left (a snooze's)
    max_snoozes: int = 0  # a snooze: the type's limit; past it the job fails with `message`
    suspends: bool = False  # a workflow's sleep or wait (a snooze without max_snoozes)
    wait: str | None = None  # the signal a suspended workflow waits for (it wakes it)


class Ran(NamedTuple):
    """What one run of a handler came to: `failure` is None on success. A named tuple: one
    is made per job on the hot path."""

    job: Job
    result: str | None  # the handler's return value as JSON text
    failure: Failure | None
    duration: float


# a handler call: the function, the payload validated, the keyword arguments
_Call = tuple[Callable[..., object], object, dict[str, object]]


class _NeedsConn(ValueError):
    """A handler that takes `conn` run without one: the caller's mistake, raised to it (not
    the job's failure)."""


def _result_json(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, Snooze):  # returned rather than raised: the same
        raise value
    if isinstance(value, pydantic.BaseModel):
        # through dump_json too: a NUL or a lone surrogate would make jsonb refuse the whole
        # batch's completion; here it is this job's failure alone
        value = value.model_dump(mode="json")
    # over the payload cap: this job's failure (InvalidInput, permanent: the same handler
    # would return the same result), not a result the dashboard and `show` must carry
    return dump_payload(value, "handler result")


class Executor:
    """Runs handlers for one worker id. Handlers that take `conn` get the one passed to `run`
    (runs.py runs them inside its transaction). `job.report_progress` goes to
    `progress` (the worker's heartbeat writes it; None: nowhere)."""

    def __init__(
        self,
        registry: Registry,
        worker_id: str,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        progress: ProgressSink | None = None,
        schema: str = db.DEFAULT_SCHEMA,
    ) -> None:
        self.registry = registry
        self.schema = schema  # a workflow's context writes its steps there
        self.progress = progress
        self.worker_id = worker_id
        self.rng = rng or random.Random()
        self.clock = clock
        self.tracer = tracing.attempt_tracer()  # once: None costs nothing per job

    def is_workflow(self, job: Job) -> bool:
        """Is `job` a workflow (run on a connection outside a transaction: its steps commit
        one by one)?"""
        handler = self.registry.handlers.get(job.type)
        return handler is not None and handler.workflow

    def takes_conn(self, job: Job) -> bool:
        """Does `job`'s handler write through the job's connection (and so need a transaction)?"""
        handler = self.registry.handlers.get(job.type)
        return handler is not None and handler.wants_conn

    def run(self, job: Job, conn: db.Conn | None = None) -> Ran:
        """Run `job`'s handler. Its exceptions are the job's outcome, never raised from here.
        With OpenTelemetry configured, inside a span of the attempt (tracing.py)."""
        if self.tracer is None:
            return self._run(job, conn)
        with tracing.attempt_span(self.tracer, job) as outcome:
            return _traced(outcome, self._run(job, conn))

    def _run(self, job: Job, conn: db.Conn | None) -> Ran:
        start = self.clock()
        try:
            func, payload, kwargs = self._call(job, conn)
            with reporting(self.progress):
                result = _result_json(func(payload, **kwargs))
        except _NeedsConn:
            raise
        except Exception as exc:  # the handler's failure is the job's outcome, never ours
            return self.failed(job, exc, self.clock() - start)
        return Ran(job, result, None, self.clock() - start)

    async def run_async(self, job: Job, conn: db.AsyncConn | None = None) -> Ran:
        """`run` for an `async def` handler, awaited on the caller's loop. Cancelling the
        awaiting task cancels the handler (CancelledError is not the job's failure: it
        propagates). With OpenTelemetry configured, inside a span of the attempt."""
        if self.tracer is None:
            return await self._run_async(job, conn)
        with tracing.attempt_span(self.tracer, job) as outcome:
            return _traced(outcome, await self._run_async(job, conn))

    async def _run_async(self, job: Job, conn: db.AsyncConn | None) -> Ran:
        start = self.clock()
        try:
            func, payload, kwargs = self._call(job, conn)
            with reporting(self.progress):
                value = func(payload, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
                result = _result_json(value)
        except _NeedsConn:
            raise
        except Exception as exc:  # the handler's failure is the job's outcome, never ours
            return self.failed(job, exc, self.clock() - start)
        return Ran(job, result, None, self.clock() - start)

    def _call(self, job: Job, conn: db.Conn | db.AsyncConn | None) -> _Call:
        """What `job`'s handler is called with: its payload validated into the handler's
        annotation, and `job` and `conn` if it takes them. Raises what the run's failure is
        when it cannot be called: InvalidInput for no handler of the type or a payload that
        does not fit (the caller makes it the job's failure: on the hot path a raise costs
        nothing until raised, where a returned failure would be checked at every job)."""
        # DEBUG: two lines per job at INFO cost a third of the throughput (activity.py logs
        # a periodic summary instead); failures and retries stay WARNING/ERROR.
        log.debug(
            "job start id=%s type=%s attempt=%d worker=%s",
            job.id,
            job.type,
            job.attempt,
            self.worker_id,
        )
        handler = self.registry.handlers.get(job.type)
        if handler is None:
            raise InvalidInput(f"no handler for {job.type!r}")
        if handler.wants_conn and conn is None:
            raise _NeedsConn(f"handler {job.type!r} takes conn: run it with a connection")
        payload = handler.validate(job.payload)
        if handler.workflow:
            assert conn is not None
            return workflow_call(handler, job, conn, self.schema, self.rng), payload, {}
        kwargs: dict[str, object] = {}
        if handler.wants_job:
            kwargs["job"] = job
        if handler.wants_conn:
            kwargs["conn"] = conn
        return handler.func, payload, kwargs

    def retry_delay(self, job: Job) -> float:
        """Seconds before `job` runs again after this attempt fails, under its type's policy."""
        return self.registry.policy(job.type).retry_delay(job.attempt, self.rng)

    def failed(self, job: Job, exc: Exception, duration: float) -> Ran:
        """What `exc`, raised while running `job`, means under its handler's policy."""
        handler = self.registry.handlers.get(job.type)
        if isinstance(exc, Suspend):
            message = f"workflow {exc.why}"
            failure = Failure(AttemptKind.SNOOZED, message, None, exc.seconds, 0, True, exc.wait)
            return Ran(job, None, failure, duration)
        if isinstance(exc, Snooze) and handler is not None:
            limit = handler.policy.max_snoozes
            message = (
                f"Snooze: snoozed more than max_snoozes={limit} times"
                f" (the last asked for {exc.seconds:g} s more)"
            )
            return Ran(
                job, None, Failure(AttemptKind.SNOOZED, message, None, exc.seconds, limit), duration
            )
        permanent = isinstance(exc, PermanentError | InvalidInput) or handler is None
        data: dict[str, object] = {"exception": type(exc).__name__}
        if isinstance(exc, PermanentError) and exc.data is not None:
            data["data"] = exc.data
        if permanent:
            kind: FailureKind = AttemptKind.PERMANENT
            delay = 0.0
        else:
            kind = AttemptKind.ERROR
            delay = self.retry_delay(job)
            data["traceback"] = "".join(traceback.format_exception(exc))[-4000:]
        failure = Failure(kind, f"{type(exc).__name__}: {exc}", _jsonable(data), delay)
        return Ran(job, None, failure, duration)


def _jsonable(data: dict[str, object]) -> JsonValue:
    """error_data travels as JSON; a value that is not JSON (say PermanentError data) is kept
    as its repr rather than losing the error."""
    out: dict[str, JsonValue] = {}
    for key, value in data.items():
        try:
            out[key] = json.loads(db.dump_json(value))
        except InvalidInput:
            out[key] = repr(value)
    return out


def _traced(outcome: tracing.Outcome, ran: Ran) -> Ran:
    """Record the attempt's outcome on its span."""
    failure = ran.failure
    if failure is None:
        outcome("succeeded", None)
    else:
        outcome(failure.kind.value, failure.message)
    return ran
