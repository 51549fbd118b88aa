"""Row factories: each result becomes a domain object, column by name.

A `NamedRow` finds, by name, where each field of its class is among the result's columns, and
builds every row from those positions; the names are the fields of the class, written once,
there. The positions are worked out once per result shape, not per result: a claim returns up
to a few hundred rows many times a second, and each microsecond per statement shows. `ROWS`
pairs each row-returning statement with its columns; a test checks each statement returns
exactly those.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
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


class OriginSummary(NamedTuple):
    """The jobs of one origin, per type and state (a tuple: callers unpack it)."""

    type: str
    state: JobState
    jobs: int
    mean_seconds: float | None
    failed_attempts: int


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


def _state(value: object) -> JobState:
    return JobState(str(value))


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
JOB_RECORD = NamedRow(JobRecord, state=_state)
BUNDLE = NamedRow(Bundle)
ENDED_ATTEMPT = NamedRow(EndedAttempt, new_state=_state)
TYPE_STATS = NamedRow(TypeStats, state=_state)
ORIGIN_SUMMARY = NamedRow(OriginSummary, state=_state, failed_attempts=_zero_if_null)
UNIQUE_HOLDER = NamedRow(UniqueHolder)

DoneAndClaimed = tuple[list[JobId] | None, Job | None]


class DoneAndClaimedRow:
    """`succeed_and_claim`: each row is a claimed job (or None: nothing was claimed), and the
    first also carries `done_ids`, the jobs whose success was written."""

    columns = ("done_ids", *JOB.columns)

    def __init__(self) -> None:
        self._makers: dict[tuple[bytes, ...], RowMaker[DoneAndClaimed]] = {}

    def __call__(self, cursor: _WithResult) -> RowMaker[DoneAndClaimed]:
        shape = _shape(cursor)
        if shape is None:
            return no_result
        maker = self._makers.get(shape)
        if maker is None:
            maker = self._makers[shape] = self._maker(cursor, shape)
        return maker

    @staticmethod
    def _maker(cursor: _WithResult, shape: tuple[bytes, ...]) -> RowMaker[DoneAndClaimed]:
        job = JOB(cursor)
        done, job_id = shape.index(b"done_ids"), shape.index(b"id")

        def make(values: Sequence[object]) -> DoneAndClaimed:
            done_ids = values[done]
            assert done_ids is None or isinstance(done_ids, list)
            return done_ids, (None if values[job_id] is None else job(values))

        return make


DONE_AND_CLAIMED = DoneAndClaimedRow()

# Statement -> the columns its rows must have, exactly (checked against the server by a test).
ROWS: dict[str, tuple[str, ...]] = {
    "claim": JOB.columns,
    "succeed_and_claim": DONE_AND_CLAIMED.columns,
    "get_job": JOB_RECORD.columns,
    "list_jobs": JOB_RECORD.columns,
    "insert_bundle": BUNDLE.columns,
    "get_bundle": BUNDLE.columns,
    "end_attempt": ENDED_ATTEMPT.columns,
    "rescue": ENDED_ATTEMPT.columns,
    "queue_stats": TYPE_STATS.columns,
    "active_stats": TYPE_STATS.columns,
    "summary_by_origin": ORIGIN_SUMMARY.columns,
    "unfinished_by_unique_keys": UNIQUE_HOLDER.columns,
}
