"""Domain types. No I/O here, and no imports from the rest of the package."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, NewType
from uuid import UUID

JobId = NewType("JobId", UUID)
BundleId = NewType("BundleId", UUID)
LeaseToken = NewType("LeaseToken", UUID)
# What a public call takes where it takes a job or bundle id: the id, or its string form (as
# the CLI prints it, as a URL carries it). pgq_supervisor.ids parses it.
IdLike = UUID | str

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]
JsonObject = dict[str, JsonValue]

# What becomes of a job when one of its dependencies fails or is cancelled.
DependencyFailure = Literal["cancel", "run"]

MAX_TYPE_LENGTH = 100
# The job type alphabet, decided once (check_type_name): any character but whitespace, control
# characters (C0, DEL, C1) and lone surrogates (no UTF-8 for them); `/`, `%`, `?`, `#`, `.` and
# any other Unicode letter or symbol are fine. "." and ".." are refused whole: in a URL's path
# they are the dot segments a browser resolves away, so the dashboard could not link to them.
_TYPE_RE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\ud800-\udfff]{1,100}")


class JobState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class AttemptKind(enum.StrEnum):
    """Why an attempt ended without success; stored as `kind` in the job's attempt history
    (the values are what the SQL writes: a test holds them equal)."""

    ERROR = "error"  # the handler raised; retried while attempts are left
    PERMANENT = "permanent"  # PermanentError, invalid payload, no handler: never retried
    TIMEOUT = "timeout"  # the supervisor killed the child for outrunning the timeout
    WORKER_DEATH = "worker_death"  # the child died (signal, exit) while running the job
    RESCUED = "rescued"  # the heartbeat went stale (a whole pod died, a child hung)
    CANCELLED = "cancelled"  # cancelled while running (cancel_job): never retried
    SNOOZED = "snoozed"  # the handler snoozed the job (pgq.Snooze): not counted as an attempt


class OutcomeKind(enum.StrEnum):
    """How one attempt ended, as a child reports it and the metrics count it."""

    SUCCEEDED = "succeeded"
    RETRIED = "retried"
    FAILED = "failed"
    LOST = "lost"  # the lease was lost: another worker owns the job, nothing was written
    SNOOZED = "snoozed"  # the handler snoozed it: pending again after its delay
    SUSPENDED = "suspended"  # a workflow's sleep, wait or step retry ended its run, not its job


# The longest duration taken anywhere (a start delay, a retention, a purge, a setting): a
# century. Past it a start time passes datetime's year 9999, and what was meant was surely
# something else (1e12 is milliseconds read as seconds).
MAX_DURATION = 100 * 365 * 86_400.0


# Liveness, said once: a heartbeat's writer (a child's beat, a supervisor's row in the supervisor
# table, schema/0010) that has missed three beats in a row counts as gone. `workers`, `status`,
# `show`, `doctor`, the gauge pgq_unserved_jobs, the dashboard, `wait`'s timeout and the
# supervisor's unserved warning judge supervisor rows by it, and dead_after may not be shorter.
DEFAULT_HEARTBEAT_INTERVAL = 1.0  # the setting heartbeat_interval's default
MISSED_BEATS = 3


def stale_after(heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL) -> float:
    """Seconds without a beat after which a writer beating every `heartbeat_interval` seconds
    counts as gone (3 s at the default)."""
    return MISSED_BEATS * heartbeat_interval


def check_duration(seconds: float) -> float:
    """`seconds` if it is a number from 0 to MAX_DURATION (100 years), else ValueError."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"must be a number of seconds, got {seconds!r}")
    if not 0 <= seconds <= MAX_DURATION:  # nan compares false: refused too
        raise ValueError(f"must be from 0 to 100 years ({MAX_DURATION:.0f} s), got {seconds:g}")
    return float(seconds)


def check_type_name(type_: str) -> str:
    """Return `type_` if it is a valid job type name, else raise ValueError: 1 to 100
    characters, none of them whitespace, a control character or a lone surrogate, and not "."
    or ".." (see _TYPE_RE)."""
    if not isinstance(type_, str) or not _TYPE_RE.fullmatch(type_) or type_ in (".", ".."):
        shown = type_ if isinstance(type_, str) and len(type_) <= 40 else f"{str(type_)[:40]}..."
        raise ValueError(
            f"invalid job type {shown!r}: must be 1 to {MAX_TYPE_LENGTH} characters without"
            " whitespace, control characters or lone surrogates, and not '.' or '..'"
        )
    return type_


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to enqueue. `max_retry_count=None` and `timeout=None` mean the handler's default.

    `depends_on`: ids of existing jobs (committed, or enqueued earlier in the same
    transaction) that must succeed before this one can be claimed. If one fails or is
    cancelled, this job is cancelled too, or, with `on_dependency_failure="run"`, runs anyway.

    `concurrency_key`: with a handler declaring `key_concurrency=N`, at most N jobs of the
    type with this key run at once, started in claim order (ignored by other handlers).

    `unique_for` (seconds or a timedelta; needs `unique_key`): a dedup window. Besides an
    unfinished job holding the key, a finished one created within the window in one of
    `unique_states` (default: succeeded) also holds it: the enqueue returns its id.

    `replace=True` (needs `unique_key`; debounce): the pending job holding the key gets this
    one's payload, start_at and priority instead. A running holder is left alone; this job
    waits behind it (`replace_running="wait"`) or is dropped (`"drop"`: its id is the
    running job's). Not in enqueue_many.

    `ordered_key`: the jobs of one key run one at a time, in enqueue order; a failed one
    blocks the key until it is reset or deleted.

    `tenant`: the claims of a type with tenant jobs go round-robin across its tenants
    (optionally weighted, see set_tenant_weight), so one tenant's backlog does not delay
    another's jobs.
    """

    type: str
    payload: JsonValue = field(default_factory=dict)
    priority: int = 0
    start_at: datetime | None = None
    max_retry_count: int | None = None
    unique_key: str | None = None
    origin: str | None = None
    timeout: float | None = None
    depends_on: Sequence[IdLike] = ()
    on_dependency_failure: DependencyFailure = "cancel"
    concurrency_key: str | None = None
    unique_for: float | timedelta | None = None
    unique_states: Sequence[str] | None = None
    replace: bool = False
    replace_running: Literal["wait", "drop"] = "wait"
    ordered_key: str | None = None
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: JobId
    bundle_id: BundleId | None
    type: str
    payload: JsonValue
    priority: int
    origin: str | None
    state: JobState
    max_retry_count: int | None
    current_retry_count: int
    start_at: datetime
    started_at: datetime | None
    stopped_at: datetime | None
    worker_alive_at: datetime | None
    worker_id: str | None
    timeout: float | None
    unique_key: str | None
    result: JsonValue
    error_msg: str | None
    error_data: JsonValue
    attempts: list[JsonValue]
    created_at: datetime
    updated_at: datetime
    progress: JsonValue  # the last value its handler reported (None: none yet)
    # how many of its dependencies a pending job still waits for (0: it can be claimed)
    waiting_on: int = 0
    depends_on: list[JobId] | None = None
    on_dependency_failure: DependencyFailure | None = None
    # some job depends on this one (its terminal transitions release or cancel them)
    has_dependents: bool = False
    concurrency_key: str | None = None
    trace_context: str | None = None  # W3C traceparent at enqueue (OpenTelemetry)
    snoozes: int = 0  # times its handler snoozed it since it was enqueued or last reset
    # replace=True: the unique_key this job holds while it waits behind the running holder
    debounce_key: str | None = None
    ordered_key: str | None = None  # its key's jobs run one at a time, in enqueue order
    workflow_parent: JobId | None = None  # the workflow whose ctx.enqueue made it
    tenant: str | None = None  # claims of its type go round-robin across tenants

    @property
    def attempt(self) -> int:
        """1-based number of the attempt in progress (or the last one made)."""
        return self.current_retry_count + 1


@dataclass(frozen=True, slots=True)
class Job:
    """The job a handler runs, as its worker holds it. `lease` fences every write about it."""

    id: JobId
    type: str
    payload: JsonValue
    priority: int
    attempt: int
    max_retry_count: int
    timeout: float | None
    bundle_id: BundleId | None
    lease: LeaseToken
    dependencies: tuple[JobId, ...] = ()
    # the results of its dependencies as of the claim, by id (a purged one is missing); empty
    # for a job without dependencies, which the claim does not look up
    dependency_results: Mapping[JobId, JsonValue] = field(default_factory=dict)
    # the W3C traceparent current at enqueue (OpenTelemetry), None without one
    trace_context: str | None = None

    def report_progress(self, value: float | JsonObject) -> None:
        """Report how far this job has come: a number from 0 to 1, or a small JSON object
        (at most 8 KiB; say {"fraction": 0.4, "step": "upload"}). Raises InvalidInput for
        anything else. Written in the background, a few times a second at most (the latest
        value wins), and only while this worker still holds the job; watchers see it in
        `get_job(...).progress` and on the `pgq_job_progress` channel.

        Call it from the handler's own thread (the executor binds the reporter to that
        thread's context). Outside a worker or `pgq.testing`, it does nothing.
        """
        reporter = PROGRESS_REPORTER.get()
        if reporter is not None:
            reporter(self, value)


# The executor binds one for the job it runs (see progress.py); a context variable keeps Job
# plain data, with no I/O and no reference to a worker.
ProgressReporter = Callable[[Job, "float | JsonObject"], None]
PROGRESS_REPORTER: ContextVar[ProgressReporter | None] = ContextVar(
    "pgq_progress_reporter", default=None
)


@dataclass(frozen=True, slots=True)
class Bundle:
    id: BundleId
    type: str
    origin: str | None
    num_jobs: int
    num_jobs_stopped: int
    on_complete: str | None
    created_at: datetime
    updated_at: datetime

    @property
    def is_complete(self) -> bool:
        return self.num_jobs > 0 and self.num_jobs_stopped == self.num_jobs


@dataclass(frozen=True, slots=True)
class EndedAttempt:
    """A job whose attempt ended as a failure: `state` is pending (retry) or failed."""

    job_id: JobId
    job_type: str
    new_state: JobState
    retry_count: int


@dataclass(frozen=True, slots=True)
class TypeStats:
    type: str
    state: JobState
    count: int
    ready: int
    oldest_ready_age: float | None
    # pending jobs that wait for dependencies (neither ready nor delayed)
    waiting: int = 0
