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
        "33 jobs ended in 10 s (3/s): email: 1 retried, 31 succeeded; resize: 1 failed"
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
