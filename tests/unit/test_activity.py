"""The supervisor's periodic summary of ended jobs (the default log's view of throughput)."""

from __future__ import annotations

import logging

import pytest

from pgq_supervisor.supervisor.maintenance.activity import ActivitySummary


def test_summary_counts_per_type_and_outcome_then_starts_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    summary = ActivitySummary(10.0, now=100.0)
    summary.record([("email", "succeeded", 30), ("email", "retried", 1)])
    summary.record([("resize", "failed", 1), ("email", "succeeded", 1)])
    assert not summary.due(109.9) and summary.due(110.0)
    with caplog.at_level(logging.INFO, logger="pgq_supervisor.supervisor.maintenance.activity"):
        result = summary.run_once(110.0)
    assert result.ended == 33
    assert result.line == (
        "33 jobs ended in 10 s (3.3/s): email: 1 retried, 31 succeeded; resize: 1 failed"
    )
    assert [r.getMessage() for r in caplog.records] == [result.line]
    # the next period starts empty, and an empty period logs nothing
    caplog.clear()
    assert not summary.due(115.0)
    assert summary.run_once(120.0).line is None
    assert caplog.records == []


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        ActivitySummary(0.0, now=0.0)


def _line(*ended: tuple[str, str, int], seconds: float = 10.0) -> str | None:
    summary = ActivitySummary(seconds, now=0.0)
    summary.record(ended)
    return summary.run_once(seconds).line


def test_one_job_is_one_job_and_a_slow_rate_is_not_zero() -> None:
    assert _line(("email", "succeeded", 1)) == "1 job ended in 10 s (0.1/s): email: 1 succeeded"
    assert _line(("email", "succeeded", 1204)) == (
        "1,204 jobs ended in 10 s (120/s): email: 1,204 succeeded"
    )


def test_a_workflow_pause_is_no_snooze_and_no_job_ended() -> None:
    line = _line(("onboard", "succeeded", 1), ("onboard", "suspended", 2), ("nap", "snoozed", 1))
    assert line == (
        "2 jobs ended in 10 s (0.2/s): nap: 1 snoozed; onboard: 1 succeeded;"
        " 2 workflow pauses (a sleep, a wait or a step's retry): onboard: 2"
    )
    assert _line(("onboard", "suspended", 1)) == (
        "no job ended in 10 s; 1 workflow pause (a sleep, a wait or a step's retry): onboard: 1"
    )
