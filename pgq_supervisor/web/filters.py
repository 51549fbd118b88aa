"""The templates' filters: times, ages, durations, JSON, progress. Pure functions of values."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pgq_supervisor.display import progress_cell
from pgq_supervisor.jobs import JsonValue

# an id in a list is shown by its last group, 12 hex digits (the whole one on hover, and
# copied): job ids are time-ordered (schema/0012), so those made in one millisecond share their
# first 12 digits, and the ids of one enqueue_many share all but their last 8 (a counter, under
# 16 random bits of the batch)
SHORT_ID = 12


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def when_text(value: object) -> str:
    """An ISO 8601 time as stored in JSON (an attempt's), shown as `when` shows one."""
    if not isinstance(value, str):
        return "-"
    try:
        return when(datetime.fromisoformat(value))
    except ValueError:
        return value


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.0f} d"


def seconds(value: float | None) -> str:
    """A run time: milliseconds below a second, then seconds, minutes, hours."""
    if value is None:
        return "-"
    s = max(0.0, value)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def duration(started: datetime | None, stopped: datetime | None, now: datetime) -> str:
    """How long a job ran (stopped) or has been running (not stopped): its last attempt."""
    if started is None:
        return "-"
    return seconds(((stopped or now) - started).total_seconds())


def short(value: object) -> str:
    return "…" + str(value)[-SHORT_ID:]


def pretty(value: JsonValue) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def progress(value: JsonValue) -> str:
    return progress_cell(value)


FILTERS = {
    "when": when,
    "when_text": when_text,
    "ago": ago,
    "seconds": seconds,
    "short": short,
    "pretty": pretty,
    "progress": progress,
}
