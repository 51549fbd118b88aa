"""Counts and rates as the CLI and the logs print them: `1 job`, `2 jobs`, no `(0/s)`."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from pgq_supervisor.display import per_second, plural, step_line
from pgq_supervisor.errors import Suspend
from pgq_supervisor.steps import StepView


@pytest.mark.parametrize(
    ("n", "word", "words", "said"),
    [
        (1, "job", None, "1 job"),
        (0, "job", None, "0 jobs"),
        (2, "proc", None, "2 procs"),
        (1_204, "job", None, "1,204 jobs"),
        (1, "child", "children", "1 child"),
        (3, "child", "children", "3 children"),
    ],
)
def test_plural(n: int, word: str, words: str | None, said: str) -> None:
    assert plural(n, word, words) == said


@pytest.mark.parametrize(
    ("n", "seconds", "said"),
    [
        (0, 10.0, None),  # nothing counted: no rate
        (5, 0.0, None),  # no time to count in
        (1, 60.0, "0.017/s"),  # slow, not "0/s"
        (5, 2.0, "2.5/s"),
        (33, 10.0, "3.3/s"),
        (1_204, 10.0, "120/s"),
        (40_000, 2.0, "20,000/s"),
    ],
)
def test_per_second(n: int, seconds: float, said: str | None) -> None:
    assert per_second(n, seconds) == said


def test_per_second_with_a_unit() -> None:
    assert per_second(1_204, 10.0, "jobs") == "120 jobs/s"
    assert per_second(0, 10.0, "jobs") is None


def test_a_step_failed_after_one_try_is_one_try() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    step = StepView(0, "charge", "step", "failed", None, "OSError: refused", 1, None, 0.5, at, at)
    assert step_line(step).detail == "failed after 1 try: OSError: refused"
    step = dataclasses.replace(step, tries=3)
    assert step_line(step).detail == "failed after 3 tries: OSError: refused"


def test_a_workflow_pause_in_the_words_of_its_log_line() -> None:
    assert Suspend.sleeping("nap", 1.99998).why == "sleeping 2 s (sleep 'nap')"
    assert Suspend.sleeping("nap", 3600.0).why == "sleeping 3600 s (sleep 'nap')"
    assert (
        Suspend.waiting("approved", 30.0, True).why == "waiting for signal 'approved' (up to 30 s)"
    )
    waits = Suspend.waiting("job:0190", 1e9, False)
    assert (waits.why, waits.wait) == ("waiting for child job 0190", "job:0190")
    assert (
        Suspend.retrying("charge", 1.734, 1).why
        == "retrying step 'charge' in 1.73 s (try 1 failed)"
    )
