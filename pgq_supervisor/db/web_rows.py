"""What the dashboard's statements take and return: their parameter and row types, and
`ROWS` and `PARAMS` for them as rows.py and params.py have for the others (the statement tests
check both)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import TypedDict

from pgq_supervisor.db.params import IdParams, NoParams, TypeParams
from pgq_supervisor.db.rows import JOB_RECORD, NamedRow, maybe_state_of, state_of
from pgq_supervisor.jobs import BundleId, JobId, JobState, JsonValue


@dataclasses.dataclass(frozen=True, slots=True)
class JobListed:
    """A job as the dashboard's job list shows it (no payload, result or history)."""

    id: JobId
    type: str
    state: JobState
    priority: int
    unique_key: str | None
    bundle_id: BundleId | None
    current_retry_count: int
    max_retry_count: int | None
    progress: JsonValue
    error_msg: str | None
    created_at: datetime
    started_at: datetime | None
    stopped_at: datetime | None
    start_at: datetime
    waiting_on: int
    worker_id: str | None

    @property
    def attempt(self) -> int:
        """1-based, as Job.attempt and JobRecord.attempt."""
        return self.current_retry_count + 1


@dataclasses.dataclass(frozen=True, slots=True)
class JobLink:
    """Another job, as a link shows it: a dependency, a dependent, a completion job."""

    id: JobId
    type: str
    state: JobState


@dataclasses.dataclass(frozen=True, slots=True)
class RunningJob:
    """A running (claimed) job, the worker holding it, and when it was claimed."""

    id: JobId
    type: str
    state: JobState
    worker_id: str
    started_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class BundleListed:
    """A bundle and its completion job (None: not enqueued yet, or none declared)."""

    id: BundleId
    type: str
    origin: str | None
    num_jobs: int
    num_jobs_stopped: int
    on_complete: str | None
    created_at: datetime
    updated_at: datetime
    completion_id: JobId | None
    completion_state: JobState | None


@dataclasses.dataclass(frozen=True, slots=True)
class ThroughputMinute:
    """Jobs that finished in one bucket (its start; a minute on the overview), by outcome."""

    minute: datetime
    succeeded: int
    failed: int


@dataclasses.dataclass(frozen=True, slots=True)
class Durations:
    """Run time percentiles in seconds over `jobs` finished jobs (None: no job)."""

    jobs: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class TypeActive:
    """One type's unfinished jobs now, and its concurrency limits (None: none)."""

    ready: int
    delayed: int
    waiting: int
    running: int
    oldest_ready_age: float | None
    global_concurrency: int | None
    key_concurrency: int | None


JOB_LISTED = NamedRow(JobListed, state=state_of)
JOB_LINK = NamedRow(JobLink, state=state_of)
RUNNING_JOB = NamedRow(RunningJob, state=state_of)
BUNDLE_LISTED = NamedRow(BundleListed, completion_state=maybe_state_of)
THROUGHPUT_MINUTE = NamedRow(ThroughputMinute)
DURATIONS = NamedRow(Durations)
TYPE_ACTIVE = NamedRow(TypeActive)


class JobsPageParams(TypedDict):
    """`jobs_page`: each filter None for none; `payload` is JSON text the payload must contain;
    the keyset (`before_at`, `before_id`) is the last row of the page before (both None: the
    first page)."""

    state: str | None
    type: str | None
    unique_key: str | None
    payload: str | None
    bundle_id: BundleId | None
    since: datetime | None
    until: datetime | None
    before_at: datetime | None
    before_id: JobId | None
    limit: int


class IdLimitParams(TypedDict):
    id: uuid.UUID
    limit: int


class JobPageParams(TypedDict):
    id: uuid.UUID
    inline: int


class BodyHeadParams(TypedDict):
    id: uuid.UUID
    chars: int


class BodyParams(TypedDict):
    id: uuid.UUID
    part: str


class LimitParams(TypedDict):
    limit: int


class BundlesPageParams(TypedDict):
    """`bundles_page`: how many, and how long after a bundle's last update its completion job
    may be enqueued (seconds: dashboard.COMPLETION_WINDOW)."""

    limit: int
    window: float


class MinutesParams(TypedDict):
    minutes: int


class TypeWindowParams(TypedDict):
    """`type_throughput`, `type_durations`: seconds back from now; buckets of `bucket` s."""

    type: str
    window: float
    bucket: float


class TypeWindowOnlyParams(TypedDict):
    type: str
    window: float


class DashboardIndexParams(TypedDict):
    schema: str
    index: str


class WorkersParams(TypedDict):
    workers: list[str]


class BundleCompletionParams(TypedDict):
    """`bundle_completion`: the bundle's id, its on_complete type, and the lowest ids of its
    creation, its last update and a minute after (params.id_floor)."""

    id: uuid.UUID
    type: str
    since: uuid.UUID
    done_from: uuid.UUID
    done_until: uuid.UUID


class TimeLimitParams(TypedDict):
    ms: str


class ScheduleNameParams(TypedDict):
    name: str


class SchedulePauseParams(TypedDict):
    name: str
    paused_by: str


class ScheduleRunParams(TypedDict):
    name: str
    id: uuid.UUID


ROWS: dict[str, tuple[str, ...]] = {
    "jobs_page": JOB_LISTED.columns,
    "job_page_record": JOB_RECORD.columns,
    "job_dependencies": JOB_LINK.columns,
    "job_dependents": JOB_LINK.columns,
    "bundles_page": BUNDLE_LISTED.columns,
    "bundle_completion": JOB_LINK.columns,
    "throughput": THROUGHPUT_MINUTE.columns,
    "type_throughput": THROUGHPUT_MINUTE.columns,
    "type_durations": DURATIONS.columns,
    "type_active": TYPE_ACTIVE.columns,
    "running_on": RUNNING_JOB.columns,
}

PARAMS: dict[str, type] = {
    "jobs_page": JobsPageParams,
    "job_page_record": JobPageParams,
    "job_body_head": BodyHeadParams,
    "job_body": BodyParams,
    "job_dependencies": IdParams,
    "job_dependents": IdLimitParams,
    "bundles_page": BundlesPageParams,
    "bundle_completion": BundleCompletionParams,
    "throughput": MinutesParams,
    "type_throughput": TypeWindowParams,
    "type_durations": TypeWindowOnlyParams,
    "type_active": TypeParams,
    "type_names": NoParams,
    "running_on": WorkersParams,
    "schedule_pause": SchedulePauseParams,
    "schedule_resume": ScheduleNameParams,
    "schedule_run_now": ScheduleRunParams,
    "delete_job": IdParams,
    "dashboard_index_missing": DashboardIndexParams,
    "job_partitioned": NoParams,
    "statement_time_limit": TimeLimitParams,
}
