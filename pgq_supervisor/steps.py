"""A workflow's steps as stored (schema/0020): domain types, no I/O."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Literal

from pgq_supervisor.jobs import JsonValue

StepKind = Literal["step", "sleep", "wait", "enqueue", "patch"]
# succeeded and failed end a step; retrying (a failed try, due again at wake_at), sleeping and
# waiting are the workflow's current pause;
# timed_out: a wait whose deadline passed (the workflow got WaitTimeout)
StepState = Literal["succeeded", "failed", "retrying", "sleeping", "waiting", "timed_out"]


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a workflow's history, as a replay reads it. `wake_in`: seconds to a sleep's
    end or a wait's deadline by the database's clock (negative: passed; None: no deadline)."""

    seq: int
    name: str
    kind: StepKind
    state: StepState
    result: JsonValue
    error: str | None
    tries: int
    wake_in: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class Recorded:
    """A step row written: its `wake_in` as StepRecord's."""

    seq: int
    wake_in: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class SignalRecord:
    """A signal sent to a job (pgq.signal, or a child's end as 'job:<id>')."""

    name: str
    payload: JsonValue


@dataclasses.dataclass(frozen=True, slots=True)
class StepView:
    """A step as `show` and the dashboard list it."""

    seq: int
    name: str
    kind: StepKind
    state: StepState
    result: JsonValue
    error: str | None
    tries: int
    wake_at: datetime | None
    duration: float | None
    started_at: datetime
    finished_at: datetime | None
