"""The parameters of each statement, by name, as psycopg receives them (a plain dict at run time).

`PARAMS` pairs each statement of sql/queries.sql with its type; a test checks that the keys are
exactly the statement's `%(name)s` placeholders.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TypedDict

from pgq_supervisor.db.floors import FLOOR_PARAMS
from pgq_supervisor.db.option_params import (
    AgePrioritiesParams,
    DebounceKeyParams,
    DebounceParams,
    OrderedLinkParams,
    SnoozeParams,
    UniqueHoldersParams,
)
from pgq_supervisor.db.partitions import PARTITION_PARAMS
from pgq_supervisor.db.workflow_params import WORKFLOW_PARAMS
from pgq_supervisor.jobs import BundleId, JobId, LeaseToken
from pgq_supervisor.jsontext import dump_json as dump_json  # the statements' JSON parameters

_RANDOM_BITS = (1 << 76) - 1  # a version-4 UUID below its version: 74 random bits, the variant


def time_ordered(random: int, at_ns: int) -> int:
    """A version-7 UUID (RFC 9562) as an int: the Unix time in milliseconds in the first 48
    bits, then version 7, then the random bits and variant of `random` (a version-4 UUID's int).
    Ids made later sort later, so a job's index entries land beside its neighbours' instead of
    at a random leaf of every id index (each claim and completion writes new ones: a state
    change is never a HOT update), which kept the drain from slowing behind millions of rows."""
    return ((at_ns // 1_000_000) << 80) | (7 << 76) | (random & _RANDOM_BITS)


def new_id() -> uuid.UUID:
    """A fresh id (job, bundle, lease), time-ordered (version 7). The one place that makes
    them: a test replaces `uuid` here to make them sequential."""
    return uuid.UUID(int=time_ordered(uuid.uuid4().int, time.time_ns()))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def id_floor(at: datetime) -> uuid.UUID:
    """The lowest id new_id() (or the database's new_id()) makes in `at`'s millisecond: a
    bound for a walk of the primary key by creation time."""
    return uuid.UUID(int=((at - _EPOCH) // timedelta(milliseconds=1)) << 80)


# ---- enqueue --------------------------------------------------------------------------------


class EnqueueRow(TypedDict):
    """`enqueue`: one job."""

    id: uuid.UUID
    type: str
    payload: str
    priority: int
    start_at: datetime | None
    max_retry_count: int | None
    unique_key: str | None
    origin: str | None
    timeout: float | None
    depends_on: list[uuid.UUID] | None
    on_dependency_failure: str | None
    concurrency_key: str | None
    tenant: str | None
    trace_context: str | None


class EnqueueManyParams(TypedDict):
    """`enqueue_many`: one array per column, in input order; one trace context for the call."""

    bundle_id: BundleId | None
    ids: list[uuid.UUID]
    types: list[str]
    payloads: list[str]
    priorities: list[int]
    start_ats: list[datetime | None]
    max_retry_counts: list[int | None]
    unique_keys: list[str | None]
    origins: list[str | None]
    timeouts: list[float | None]
    depends_ons: list[str | None]
    on_dependency_failures: list[str | None]
    concurrency_keys: list[str | None]
    tenants: list[str | None]
    trace_context: str | None


class LinkDependenciesParams(TypedDict):
    """`link_dependencies`: one edge per (jobs[i], deps[i])."""

    jobs: list[uuid.UUID]
    deps: list[uuid.UUID]


class UniqueKeysParams(TypedDict):
    keys: list[str | None]


class BundleParams(TypedDict):
    id: uuid.UUID
    type: str
    origin: str | None
    num_jobs: int
    on_complete: str | None


# ---- worker side ----------------------------------------------------------------------------


class ClaimArgs(TypedDict):
    """What a worker passes to `claim` and `succeed_and_claim` as keywords."""

    worker_id: str
    types: Sequence[str]
    max_retry_counts: Sequence[int]
    limit: int


class ClaimParams(TypedDict):
    """`claim`: `max_retry_counts[i]` is the default of `types[i]`; `lease` is the batch's."""

    worker_id: str
    types: list[str]
    max_retry_counts: list[int]
    limit: int
    lease: LeaseToken


class SucceedParams(TypedDict):
    """`succeed`: `results[i]` (JSON text) is the result of `ids[i]`."""

    ids: list[JobId]
    results: list[str | None]
    done_lease: LeaseToken
    ephemeral: list[JobId]  # those of `ids` to delete rather than mark succeeded


class SucceedAndClaimParams(SucceedParams, ClaimParams):
    pass


class HeartbeatParams(TypedDict):
    ids: list[JobId]  # pairs with `leases`: the lease each job is held under
    leases: list[LeaseToken]


class EndAttemptParams(TypedDict):
    ids: list[JobId]
    lease: LeaseToken | None
    worker_id: str | None
    error: str
    error_data: str | None
    kind: str
    allow_retry: bool
    delay: float


class ReleaseParams(TypedDict):
    """NULL filters match everything."""

    ids: list[JobId] | None
    lease: LeaseToken | None
    worker_id: str | None


class RescueParams(TypedDict):
    dead_after: float
    limit: int
    error: str


class OrphansParams(TypedDict):
    ids: list[str]
    error: str
    quiet: float


class TypesParams(TypedDict):
    types: list[str]


# ---- administration -------------------------------------------------------------------------


class IdParams(TypedDict):
    id: uuid.UUID


class IdsParams(TypedDict):
    ids: list[JobId]


class UnservedParams(TypedDict):
    ids: list[JobId]
    seen_within: float


class ResetParams(TypedDict):
    id: JobId
    force: bool


class TypeFilterParams(TypedDict):
    """`type` NULL means every type."""

    type: str | None


class DepthParams(TypedDict):
    """`types` NULL means every type."""

    types: list[str] | None


class ListJobsParams(TypedDict):
    state: str
    type: str | None
    limit: int


class DeleteFinishedParams(TypedDict):
    states: list[str]
    older_than: float
    limit: int


class OlderThanParams(TypedDict):
    older_than: float


class PruneFinishedParams(DeleteFinishedParams):
    zone: float
    schema: str


class OriginParams(TypedDict):
    origin: str


class NoParams(TypedDict):
    pass


# ---- pauses and rates ----------------------------------------------------------------------


class PauseParams(TypedDict):
    type: str
    paused_by: str | None
    reason: str | None


class TypeParams(TypedDict):
    type: str


class TenantWeightParams(TypedDict):
    type: str
    tenant: str
    weight: int


class SyncRatesParams(TypedDict):
    """`sync_rates`: `rated[i]` allows `max_starts[i]` starts per `periods[i]` seconds; the
    rows of `served` types not in `rated` are deleted."""

    served: list[str]
    rated: list[str]
    max_starts: list[int]
    periods: list[float]


class SyncLimitsParams(TypedDict):
    """`sync_limits`: `limited[i]` allows `global_concurrencies[i]` running jobs and
    `key_concurrencies[i]` per key (None: no such limit); the rows of `served` types not in
    `limited` are deleted."""

    served: list[str]
    limited: list[str]
    global_concurrencies: list[int | None]
    key_concurrencies: list[int | None]


# ---- waiting and progress -------------------------------------------------------------------


class SetProgressParams(TypedDict):
    """`set_progress`: `progress[i]` (JSON text) for `ids[i]`, written only under `leases[i]`."""

    ids: list[JobId]
    leases: list[LeaseToken]
    progress: list[str]


# ---- periodic schedules ---------------------------------------------------------------------


class ScheduleDeclareParams(TypedDict):
    """`schedule_declare`: one array per column, one entry per schedule."""

    names: list[str]
    types: list[str]
    crons: list[str | None]
    everys: list[timedelta | None]
    timezones: list[str]
    priorities: list[int]
    catch_ups: list[int]
    payloads: list[str]


class ScheduleNamesParams(TypedDict):
    names: list[str]


class ScheduleEnqueueParams(TypedDict):
    """`schedule_enqueue`: the tick of schedule `name`, as job `id`."""

    name: str
    tick: datetime
    id: uuid.UUID
    type: str
    payload: str
    priority: int
    unique_key: str


# ---- supervisors and the dashboard ----------------------------------------------------------


class SupervisorRegisterParams(TypedDict):
    """`supervisor_register`: `children` is JSON text (a list of objects)."""

    id: str
    host: str
    pid: int
    procs: int
    types: list[str]
    started_at: datetime
    children: str
    locked_on: str | None  # the server epoch it holds its session lock in (schema/0016)


class SupervisorIdParams(TypedDict):
    id: str


class SchemaNameParams(TypedDict):
    schema: str


PARAMS: dict[str, type] = {
    "enqueue": EnqueueRow,
    "enqueue_many": EnqueueManyParams,
    "enqueue_copy": NoParams,
    "unfinished_by_unique_keys": UniqueKeysParams,
    "link_dependencies": LinkDependenciesParams,
    "insert_bundle": BundleParams,
    "claim": ClaimParams,
    "heartbeat": HeartbeatParams,
    "succeed": SucceedParams,
    "succeed_and_claim": SucceedAndClaimParams,
    "end_attempt": EndAttemptParams,
    "snooze": SnoozeParams,
    "unique_holders": UniqueHoldersParams,
    "debounce_holder": DebounceParams,
    "set_debounce_key": DebounceKeyParams,
    "age_priorities": AgePrioritiesParams,
    "ordered_link": OrderedLinkParams,
    "release": ReleaseParams,
    "rescue": RescueParams,
    "next_due": TypesParams,
    "cancel": IdParams,
    "cancelled_among": IdsParams,
    "reset": ResetParams,
    "retry_failed": TypeFilterParams,
    "get_job": IdParams,
    "job_state": IdParams,
    "get_bundle": IdParams,
    "list_jobs": ListJobsParams,
    "delete_finished": DeleteFinishedParams,
    "delete_empty_bundles": OlderThanParams,
    "prune_finished": PruneFinishedParams,
    "queue_stats": NoParams,
    "active_stats": NoParams,
    "depth": DepthParams,
    "now": NoParams,
    "connection_limits": NoParams,
    "summary_by_origin": OriginParams,
    "durable_commit": NoParams,
    "asynchronous_commit": NoParams,
    "no_jit": NoParams,
    "begin_implicit": NoParams,
    "job_states": IdsParams,
    "unserved_types": UnservedParams,
    "get_jobs": IdsParams,
    "set_progress": SetProgressParams,
    "schedule_declare": ScheduleDeclareParams,
    "schedule_states": ScheduleNamesParams,
    "schedule_enqueue": ScheduleEnqueueParams,
    "schedules_list": NoParams,
    "pause_type": PauseParams,
    "resume_type": TypeParams,
    "set_tenant_weight": TenantWeightParams,
    "type_controls": NoParams,
    "sync_rates": SyncRatesParams,
    "rate_next_due": TypesParams,
    "sync_limits": SyncLimitsParams,
    "type_limits": NoParams,
    "supervisor_register": SupervisorRegisterParams,
    "supervisor_unregister": SupervisorIdParams,
    "worker_gone": SupervisorIdParams,
    "supervisor_lock": SupervisorIdParams,
    "supervisors_gone": SupervisorIdParams,
    "rescue_orphans": OrphansParams,
    "supervisors_list": NoParams,
    "health_backends": OlderThanParams,
    "health_slots": NoParams,
    "health_prepared": NoParams,
    "health_table": SchemaNameParams,
    "health_settings": NoParams,
    "schema_dump_search_path": NoParams,
    "schema_dump_version": NoParams,
    "schema_dump_types": SchemaNameParams,
    "schema_dump_sequences": SchemaNameParams,
    "schema_dump_tables": SchemaNameParams,
    "schema_dump_indexes": SchemaNameParams,
    "schema_dump_triggers": SchemaNameParams,
    "schema_dump_views": SchemaNameParams,
    "schema_dump_functions": SchemaNameParams,
    **WORKFLOW_PARAMS,
    **FLOOR_PARAMS,
    **PARTITION_PARAMS,
}
