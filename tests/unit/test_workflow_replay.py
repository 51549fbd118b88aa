"""A workflow run's walk through its history (workflows/replay.py), without a database."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable

import pytest

import pgq_supervisor as pgq
from pgq_supervisor.errors import ConfigError
from pgq_supervisor.jobs import Job, JobId, LeaseToken
from pgq_supervisor.registry import Policy, RetryPolicy
from pgq_supervisor.steps import StepRecord
from pgq_supervisor.workflows.replay import Pending, Replay, Stored, seconds

JOB = Job(JobId(uuid.uuid4()), "flow", {}, 0, 1, 2, None, None, LeaseToken(uuid.uuid4()))
POLICY = Policy(timeout=None, max_retry_count=2, backoff=RetryPolicy(base=1, cap=1))


def _row(seq: int, name: str, kind: str = "step", state: str = "succeeded") -> StepRecord:
    return StepRecord(seq, name, kind, state, {"n": seq}, "boom", 1, None)  # type: ignore[arg-type]


def _replay(*rows: StepRecord) -> Replay:
    return Replay(JOB, POLICY, list(rows), [], random.Random(1))


def test_stored_steps_are_returned_in_order_then_the_frontier_is_pending() -> None:
    replay = _replay(_row(0, "a"), _row(1, "nap", "sleep", "sleeping"))
    assert replay.take("a", "step") == Stored({"n": 0})
    pending = replay.take("nap", "sleep")
    assert isinstance(pending, Pending) and pending.record is not None and pending.seq == 1
    assert replay.take("b", "step") == Pending(2, None)


@pytest.mark.parametrize(("name", "kind"), [("b", "step"), ("a", "sleep")])
def test_another_step_at_a_stored_place_is_refused_naming_both(name: str, kind: str) -> None:
    replay = _replay(_row(0, "a"))
    with pytest.raises(pgq.NonDeterministic, match=r"step 1 is step 'a' in its history"):
        replay.take(name, kind)  # type: ignore[arg-type]


def test_a_step_that_failed_for_good_and_a_timed_out_wait_raise_again() -> None:
    replay = _replay(_row(0, "a", state="failed"), _row(1, "w", "wait", "timed_out"))
    with pytest.raises(pgq.StepFailed, match="step 'a' failed: boom"):
        replay.take("a", "step")
    with pytest.raises(pgq.WaitTimeout):
        replay.take("w", "wait")


def test_patched_is_false_on_old_histories_and_true_past_them() -> None:
    old = _replay(_row(0, "charge"))
    assert old.patched("v2") is False and old.take("charge", "step") == Stored({"n": 0})
    assert old.patched("v3") == 1  # past the history: new code, a marker to store at 1
    new = _replay(_row(0, "v2", "patch"))
    assert new.patched("v2") is True and new.seq == 1


def test_each_step_has_the_jobs_retry_budget() -> None:
    replay = _replay()
    assert replay.retry_delay(1) is not None and replay.retry_delay(2) is not None
    assert replay.retry_delay(3) is None  # max_retry_count=2: three tries


@pytest.mark.parametrize("bad", ["", "x" * 201])
def test_a_step_name_must_be_1_to_200_characters(bad: str) -> None:
    with pytest.raises(pgq.InvalidInput, match="step name"):
        _replay().take(bad, "step")


@pytest.mark.parametrize("bad", [-1, float("nan"), True, "5"])
def test_a_bad_duration_is_refused(bad: object) -> None:
    with pytest.raises(pgq.InvalidInput, match="duration"):
        seconds(bad)  # type: ignore[arg-type]


def test_a_workflow_must_take_ctx_and_payload() -> None:
    registry = pgq.Registry()
    with pytest.raises(ConfigError, match=r"workflow 'flow' must take \(ctx, payload\)"):
        one_parameter: Callable[..., None] = lambda payload: None  # noqa: E731 (mypy rejects it)
        registry.workflow("flow")(one_parameter)
    registry.workflow("flow")(lambda ctx, payload: None)
    handler = registry.handlers["flow"]
    assert handler.workflow and handler.wants_conn and not handler.wants_job
    with pytest.raises(ConfigError, match="two handlers"):
        registry.workflow("flow")(lambda ctx, payload: None)
