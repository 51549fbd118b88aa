"""Row factories: each result becomes a domain object, column by name.

A `NamedRow` finds, by name, where each field of its class is among the result's columns, and
builds every row from those positions; the names are the fields of the class, written once,
there. The positions are worked out once per result shape, not per result: a claim returns up
to a few hundred rows many times a second, and each microsecond per statement shows. `ROWS`
pairs each row-returning statement with its columns (`web_rows.ROWS` the dashboard's); a test
checks each statement returns exactly those.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from itertools import repeat
from operator import itemgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Generic, NamedTuple, Protocol, TypeVar
from uuid import UUID

from psycopg.pq import ExecStatus
from psycopg.rows import RowMaker, no_result

from pgq_supervisor.jobs import (
    Bundle,
    EndedAttempt,
    Job,
    JobId,
    JobRecord,
    JobState,
    JsonValue,
    LeaseToken,
    TypeStats,
)

if TYPE_CHECKING:
    from psycopg.pq.abc import PGresult

T = TypeVar("T")


class _WithResult(Protocol):
    """What a row factory reads of a cursor (a sync or async one)."""

    @property
    def pgresult(self) -> PGresult | None: ...


_ROWS_STATUS = (ExecStatus.TUPLES_OK, ExecStatus.SINGLE_TUPLE, ExecStatus.TUPLES_CHUNK)


def _shape(cursor: _WithResult) -> tuple[bytes, ...] | None:
    """The current result's column names, undecoded (None: the result has no rows to read).
    Cheaper than `cursor.description`, which makes a Column object per column."""
    res = cursor.pgresult
    if res is None or res.status not in _ROWS_STATUS:
        return None
    return tuple(res.fname(i) or b"" for i in range(res.nfields))


@dataclasses.dataclass(frozen=True, slots=True)
class UniqueHolder:
    """The unfinished job that holds a unique_key."""

    unique_key: str
    id: JobId


@dataclasses.dataclass(frozen=True, slots=True)
class JobStateRow:
    """Where one job stands (a waiter's re-check)."""

    id: JobId
    state: JobState


@dataclasses.dataclass(frozen=True, slots=True)
class CancelResult:
    """What `cancel` found: the state the job was in, and whether it is now cancelled (a
    running job's `worker_id` is the worker whose supervisor was told to stop it)."""

    state: JobState
    cancelled: bool
    worker_id: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class TypeControl:
    """A paused or rate-limited type: when and why it was paused (None: not paused), its rate
    (None: none) and the starts its window allows now."""

    type: str
    paused_at: datetime | None
    paused_by: str | None
    reason: str | None
    max_starts: int | None
    period: float | None
    free_starts: int | None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


class OriginSummary(NamedTuple):
    """The jobs of one origin, per type and state (a tuple: callers unpack it)."""

    type: str
    state: JobState
    jobs: int
    mean_seconds: float | None
    failed_attempts: int


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleState:
    """Where a schedule stands: ticks after `last_tick` (after `created_at` when none was
    enqueued yet) up to `now`, the database's clock, are due, unless it is `paused`."""

    name: str
    created_at: datetime
    last_tick: datetime | None
    now: datetime
    paused: bool


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A declared schedule as stored (the CLI's view)."""

    name: str
    type: str
    cron: str | None
    every: timedelta | None
    timezone: str
    priority: int
    catch_up: int
    created_at: datetime
    declared_at: datetime
    last_tick: datetime | None
    last_job_id: JobId | None
    now: datetime
    payload: JsonValue
    paused_at: datetime | None
    paused_by: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class SupervisorRecord:
    """A registered supervisor (schema/0010): `children` is one object per child (index, pid,
    state, job_id, job_type, jobs_done); `seen_ago` is seconds since its last upsert, by the
    database's clock."""

    id: str
    host: str
    pid: int
    procs: int
    types: list[str]
    started_at: datetime
    seen_at: datetime
    children: JsonValue
    seen_ago: float


def _columns(cls: type[object]) -> tuple[str, ...]:
    """The constructor's parameters, in order: a dataclass's fields, a NamedTuple's too."""
    return tuple(inspect.signature(cls).parameters)


class NamedRow(Generic[T]):
    """Rows as `cls(...)`, each field from the column of the same name, through `convert[name]`
    where given. Other columns of the result are ignored."""

    def __init__(self, cls: type[T], **convert: Callable[[object], object]) -> None:
        self.cls = cls
        self.columns = _columns(cls)
        unknown = set(convert) - set(self.columns)
        assert not unknown, f"{cls.__name__} has no field {unknown}"
        self._convert = [(self.columns.index(name), fn) for name, fn in convert.items()]
        # one entry per result shape: a statement's columns do not change
        self._makers: dict[tuple[bytes, ...], RowMaker[T]] = {}

    def __call__(self, cursor: _WithResult) -> RowMaker[T]:
        shape = _shape(cursor)
        if shape is None:
            return no_result
        maker = self._makers.get(shape)
        if maker is None:
            maker = self._makers[shape] = self._maker([name.decode() for name in shape])
        return maker

    def _maker(self, names: list[str]) -> RowMaker[T]:
        missing = [c for c in self.columns if c not in names]
        if missing:
            raise TypeError(f"{self.cls.__name__} needs columns {missing}; the result has {names}")
        positions = [names.index(c) for c in self.columns]
        cls, convert = self.cls, self._convert
        if not convert and positions == list(range(len(names))):
            # exactly the fields, in order (the claim's rows): nothing to pick or convert
            return lambda values: cls(*values)
        get = itemgetter(*positions)
        if not convert:
            return lambda values: cls(*get(values))

        def make(values: Sequence[object]) -> T:
            args = list(get(values))
            for i, fn in convert:
                args[i] = fn(args[i])
            return cls(*args)

        return make


def state_of(value: object) -> JobState:
    return JobState(str(value))


def maybe_state_of(value: object) -> JobState | None:
    return None if value is None else JobState(str(value))


def _zero_if_null(value: object) -> object:
    return 0 if value is None else value


_NO_IDS: tuple[JobId, ...] = ()
_NO_RESULTS: Mapping[JobId, JsonValue] = MappingProxyType({})


def _ids(value: object) -> object:
    """A uuid[] column (NULL: none) as a tuple of ids."""
    if value is None:
        return _NO_IDS
    assert isinstance(value, list)
    return tuple(value)


def _results(value: object) -> object:
    """A JSON object keyed by job id (NULL: none), keyed by JobId."""
    if value is None:
        return _NO_RESULTS
    assert isinstance(value, dict)
    return {JobId(UUID(k)): v for k, v in value.items()}


JOB = NamedRow(Job, dependencies=_ids, dependency_results=_results)
JOB_RECORD = NamedRow(JobRecord, state=state_of)
BUNDLE = NamedRow(Bundle)
ENDED_ATTEMPT = NamedRow(EndedAttempt, new_state=state_of)
TYPE_STATS = NamedRow(TypeStats, state=state_of)
ORIGIN_SUMMARY = NamedRow(OriginSummary, state=state_of, failed_attempts=_zero_if_null)
UNIQUE_HOLDER = NamedRow(UniqueHolder)
JOB_STATE = NamedRow(JobStateRow, state=state_of)
CANCEL_RESULT = NamedRow(CancelResult, state=state_of)
SCHEDULE_STATE = NamedRow(ScheduleState)
SCHEDULE_RECORD = NamedRow(ScheduleRecord)
TYPE_CONTROL = NamedRow(TypeControl)
SUPERVISOR_RECORD = NamedRow(SupervisorRecord)


@dataclasses.dataclass(frozen=True, slots=True)
class TypeLimit:
    """A type with a concurrency limit: its limits (None: none), its running and ready jobs,
    and how many of the ready ones wait because their concurrency_key is at its limit."""

    type: str
    global_concurrency: int | None
    key_concurrency: int | None
    running: int
    ready: int
    key_held: int

    @property
    def held_by_global(self) -> int:
        """Ready jobs (not already held by their key) beyond the running slots left."""
        if self.global_concurrency is None:
            return 0
        free = max(0, self.global_concurrency - self.running)
        return max(0, self.ready - self.key_held - free)


TYPE_LIMIT = NamedRow(TypeLimit)

DoneAndClaimed = tuple[list[JobId], list[Job]]


def _batch_dependencies(column: list[object]) -> Iterable[object]:
    """The batch's `dependencies` column: JSON arrays of ids (array_agg cannot stack uuid[]s of
    different lengths), NULL for a job without dependencies."""
    if not any(column):
        return repeat(_NO_IDS)  # the common batch: nothing to convert
    return [_json_ids(v) for v in column]


def _json_ids(value: object) -> tuple[JobId, ...]:
    if value is None:
        return _NO_IDS
    assert isinstance(value, list)
    return tuple(JobId(UUID(str(i))) for i in value)


def _batch_results(column: list[object]) -> Iterable[object]:
    if not any(column):
        return repeat(_NO_RESULTS)
    return [_results(v) for v in column]


_BATCH_CONVERT: dict[str, Callable[[list[object]], Iterable[object]]] = {
    "dependencies": _batch_dependencies,
    "dependency_results": _batch_results,
}


class DoneAndClaimedRow:
    """`succeed_and_claim`'s one row: `done_ids`, the jobs whose success landed, and the claimed
    jobs as one array per field of Job, each named after its field; `lease` is not among them
    (the batch's lease is the statement's own parameter), so a factory is made per batch."""

    columns = ("done_ids", *(c for c in JOB.columns if c != "lease"))
    _positions: dict[tuple[bytes, ...], tuple[int, list[int | None]]] = {}

    def __init__(self, lease: LeaseToken) -> None:
        self.lease = lease

    def __call__(self, cursor: _WithResult) -> RowMaker[DoneAndClaimed]:
        shape = _shape(cursor)
        if shape is None:
            return no_result
        if shape not in self._positions:
            self._positions[shape] = self._locate([name.decode() for name in shape])
        done, positions = self._positions[shape]
        lease = self.lease

        def make(values: Sequence[object]) -> DoneAndClaimed:
            done_ids = values[done]
            assert isinstance(done_ids, list)
            fields: list[Iterable[object]] = []
            for name, p in zip(JOB.columns, positions, strict=True):
                column = repeat(lease) if p is None else values[p]
                if column is None:  # nothing claimed: array_agg of no rows is NULL
                    return done_ids, []
                assert isinstance(column, list | repeat)
                convert = _BATCH_CONVERT.get(name)
                if convert is not None and isinstance(column, list):
                    column = convert(column)
                fields.append(column)
            # the arrays have one length; repeat(lease) has none
            return done_ids, [Job(*job) for job in zip(*fields, strict=False)]

        return make

    @classmethod
    def _locate(cls, names: list[str]) -> tuple[int, list[int | None]]:
        missing = [c for c in cls.columns if c not in names]
        if missing:
            raise TypeError(f"succeed_and_claim needs columns {missing}; the result has {names}")
        return names.index("done_ids"), [
            None if c == "lease" else names.index(c) for c in JOB.columns
        ]


# Statement -> the columns its rows must have, exactly (checked against the server by a test).
ROWS: dict[str, tuple[str, ...]] = {
    "claim": JOB.columns,
    "succeed_and_claim": DoneAndClaimedRow.columns,
    "get_job": JOB_RECORD.columns,
    "list_jobs": JOB_RECORD.columns,
    "insert_bundle": BUNDLE.columns,
    "get_bundle": BUNDLE.columns,
    "end_attempt": ENDED_ATTEMPT.columns,
    "rescue": ENDED_ATTEMPT.columns,
    "rescue_orphans": ENDED_ATTEMPT.columns,
    "snooze": ENDED_ATTEMPT.columns,
    "queue_stats": TYPE_STATS.columns,
    "active_stats": TYPE_STATS.columns,
    "summary_by_origin": ORIGIN_SUMMARY.columns,
    "unfinished_by_unique_keys": UNIQUE_HOLDER.columns,
    "unique_holders": UNIQUE_HOLDER.columns,
    "job_states": JOB_STATE.columns,
    "get_jobs": JOB_RECORD.columns,
    "cancel": CANCEL_RESULT.columns,
    "schedule_declare": SCHEDULE_STATE.columns,
    "schedule_states": SCHEDULE_STATE.columns,
    "schedules_list": SCHEDULE_RECORD.columns,
    "type_controls": TYPE_CONTROL.columns,
    "type_limits": TYPE_LIMIT.columns,
    "supervisors_list": SUPERVISOR_RECORD.columns,
}
