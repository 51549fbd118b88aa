"""A workflow run's walk through its stored history: no I/O.

Each run of a workflow starts from the top of its code. Every `ctx` call takes the next place
(`seq`) in the history: when a row is there, it must be the same step (name and kind) or the
replay is refused (NonDeterministic, naming both); past the end of the history the call runs
for real and writes its row. What a stored row means for the call is decided here, the
contexts (sync and async) do the writing.
"""

from __future__ import annotations

import inspect
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from pgq_supervisor.errors import InvalidInput, NonDeterministic, StepFailed, WaitTimeout
from pgq_supervisor.inputs import check_key
from pgq_supervisor.jobs import Job, JsonValue
from pgq_supervisor.jsontext import dump_json
from pgq_supervisor.registry import Policy
from pgq_supervisor.steps import SignalRecord, StepKind, StepRecord

# A wait without a timeout sleeps this long; its signal wakes it (Snooze's bound is 100 years).
FOREVER = 50 * 365 * 86_400.0


@dataclass(frozen=True, slots=True)
class Stored:
    """The call has already happened: return `value` (a replay)."""

    value: JsonValue


@dataclass(frozen=True, slots=True)
class Pending:
    """The call must (still) run or pause: `record` is its row so far (None: first time)."""

    seq: int
    record: StepRecord | None

    @property
    def tries(self) -> int:
        return 0 if self.record is None else self.record.tries


class Replay:
    """Where a run is in its workflow's history (see the module docstring)."""

    def __init__(
        self,
        job: Job,
        policy: Policy,
        steps: list[StepRecord],
        signals: list[SignalRecord],
        rng: random.Random | None = None,
    ) -> None:
        self.job = job
        self.policy = policy
        self.history = steps
        self.signals = {s.name: s.payload for s in signals}
        self.seq = 0
        self.rng = rng or random.Random()

    def take(self, name: str, kind: StepKind) -> Pending | Stored:
        """The next place, for a call of `kind` named `name`: Stored when it ended already
        (a step that failed for good raises StepFailed again, a wait that timed out raises
        WaitTimeout again)."""
        check_key(name, "workflow step name")
        seq = self.seq
        self.seq += 1
        if seq >= len(self.history):
            return Pending(seq, None)
        rec = self.history[seq]
        if rec.name != name or rec.kind != kind:
            raise NonDeterministic(
                f"workflow {self.job.type!r} job {self.job.id}: step {seq + 1} is {rec.kind}"
                f" {rec.name!r} in its history but the code now reaches {kind} {name!r} there"
                " (the code changed under a running workflow: guard the change with"
                " ctx.patched)"
            )
        if rec.state == "succeeded":
            return Stored(rec.result)
        if rec.state == "failed":
            raise StepFailed(name, rec.error or "failed")
        if rec.state == "timed_out":
            raise WaitTimeout(name)
        return Pending(seq, rec)

    def patched(self, name: str) -> bool | int:
        """ctx.patched: True when the history has this patch marker here (consumed), False when
        it has another step here (a run recorded before the patch), else the place to record
        the marker at (the run is past its history: new code)."""
        seq = self.seq
        if seq < len(self.history):
            rec = self.history[seq]
            if rec.kind == "patch" and rec.name == name:
                self.seq += 1
                return True
            return False
        self.seq += 1
        return seq

    def retry_delay(self, tries: int) -> float | None:
        """Seconds before a failed step's next try, or None when its tries are spent (the
        job's retry budget is each step's)."""
        if tries > self.job.max_retry_count:
            return None
        return self.policy.retry_delay(tries, self.rng)


def seconds(duration: float | timedelta) -> float:
    """A sleep's or timeout's length in seconds; InvalidInput for a bad one."""
    value = duration.total_seconds() if isinstance(duration, timedelta) else duration
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"a duration must be seconds or a timedelta, got {duration!r}")
    if value < 0 or value > FOREVER:
        raise InvalidInput(f"a duration must be from 0 to 50 years, got {duration!r}")
    return float(value)


def takes_conn(fn: Callable[..., object]) -> bool:
    """Does the step function take `conn` (then it runs in its checkpoint's transaction)?"""
    try:
        return "conn" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def as_json(value: object, what: str) -> tuple[str, JsonValue]:
    """A step's value as the JSON text stored and the value a replay returns (the same)."""
    text = dump_json(value, what)
    loaded: JsonValue = json.loads(text)
    return text, loaded
