"""The admin commands' output shaping and the package's dependency direction (no database)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from pgq_supervisor import admin
from pgq_supervisor.jobs import JobId, JobRecord, JobState, JsonValue, TypeStats
from pgq_supervisor.settings import parse_duration

NOW = datetime(2030, 1, 1, tzinfo=UTC)
RECORD = JobRecord(
    id=JobId(uuid.uuid4()),
    bundle_id=None,
    type="t",
    payload={},
    priority=0,
    origin=None,
    state=JobState.PENDING,
    max_retry_count=3,
    current_retry_count=0,
    start_at=NOW,
    started_at=None,
    stopped_at=None,
    worker_alive_at=None,
    worker_id=None,
    timeout=None,
    unique_key=None,
    result=None,
    error_msg=None,
    error_data=None,
    attempts=[],
    progress=None,
    created_at=NOW,
    updated_at=NOW,
)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.04, "0.0s"),
        (9.96, "10.0s"),
        (12.7, "12s"),
        (59.9, "59s"),
        (60, "1m00s"),
        (312, "5m12s"),
        (3 * 3600 + 4 * 60 + 59, "3h04m"),
        (2 * 86400 + 3 * 3600, "2d03h"),
    ],
)
def test_ages_are_short(seconds: float, shown: str) -> None:
    assert admin._age(seconds) == shown


def test_attempts_made_counts_history_and_the_attempt_in_hand() -> None:
    failed_twice: list[JsonValue] = [{"attempt": 1}, {"attempt": 2}]
    assert admin.attempts_made(RECORD) == 0
    assert admin.attempts_made(replace(RECORD, state=JobState.RUNNING)) == 1
    assert admin.attempts_made(replace(RECORD, attempts=list(failed_twice))) == 2
    running_third = replace(RECORD, state=JobState.RUNNING, attempts=list(failed_twice))
    assert admin.attempts_made(running_third) == 3
    assert admin.attempts_made(replace(RECORD, state=JobState.SUCCEEDED)) == 1
    assert admin.attempts_made(replace(RECORD, state=JobState.FAILED, attempts=[{}])) == 1


def test_table_aligns_numbers_right_and_text_left() -> None:
    out = admin._table(["TYPE", "N", "NOTE"], [["a", "7", "x"], ["long-type", "1234", ""]], left=1)
    assert out.splitlines() == [
        "TYPE          N  NOTE",
        "a             7  x",
        "long-type  1234",
    ]


def test_status_rows_merge_states_of_a_type_and_keep_the_oldest_age() -> None:
    stats = [
        TypeStats("b", JobState.PENDING, 5, 3, 12.0),
        TypeStats("a", JobState.FAILED, 2, 0, None),
        TypeStats("a", JobState.PENDING, 1, 1, 4.0),
    ]
    rows = admin._status_rows(stats)
    assert [r.type for r in rows] == ["a", "b"]
    a, b = rows
    assert (a.counts[JobState.FAILED], a.ready, a.delayed, a.oldest_ready_age) == (2, 1, 0, 4.0)
    assert (b.ready, b.delayed) == (3, 2)
    assert b.cells() == ["b", "3", "2", "0", "0", "0", "0", "0", "12s"]


def test_status_rows_count_waiting_jobs_apart_from_delayed_ones() -> None:
    (row,) = admin._status_rows([TypeStats("a", JobState.PENDING, 6, 1, 2.0, waiting=4)])
    assert (row.ready, row.delayed, row.waiting) == (1, 1, 4)
    assert row.cells()[:4] == ["a", "1", "1", "4"]
    assert row.to_json()["waiting"] == 4


def test_one_line_keeps_the_first_line_and_cuts_long_ones() -> None:
    assert admin._one_line("  first\nsecond", 80) == "first"
    assert admin._one_line("x" * 100, 10) == "xxxxxxx..."
    assert admin._one_line("", 10) == ""


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0), ("7d", 604800.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "7x", "-1d", "nan", "inf", "seven days"])
def test_bad_durations_are_invalid_input(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_admin_does_not_import_the_cli() -> None:
    """Dependencies point one way: cli imports admin, never the reverse."""
    code = "import sys, pgq_supervisor.admin; print('pgq_supervisor.cli' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
