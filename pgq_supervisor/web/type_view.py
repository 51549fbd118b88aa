"""A job type's page: its counts now, its throughput and failures over a chosen window, its
run time percentiles, its limits (rate, global and per-key concurrency), pause and schedules.

What it reads: pending and running counts from the partial indexes (queue_stats active_only),
the window's finished jobs on job_finished_idx (state, stopped_at) for the chart and the
percentiles: the window bounds the rows read, 7 days of a busy type being the most."""

from __future__ import annotations

from dataclasses import dataclass

from pgq_supervisor import db
from pgq_supervisor.db.rows import TypeControl, TypeLimit
from pgq_supervisor.db.web_rows import Durations
from pgq_supervisor.jobs import JobState
from pgq_supervisor.web.charts import WINDOWS, Window, bars
from pgq_supervisor.web.views import Data, schedule_rows


@dataclass
class Active:
    """The type's unfinished jobs now."""

    ready: int = 0
    delayed: int = 0
    waiting: int = 0
    running: int = 0
    oldest_ready_age: float | None = None


def window_of(name: str) -> Window:
    """ValueError naming the choices when `name` is not a window."""
    try:
        return WINDOWS[name or "1h"]
    except KeyError:
        choices = ", ".join(WINDOWS)
        raise ValueError(f"invalid window: {name[:20]!r} (one of {choices})") from None


def type_page(conn: db.Conn, schema: str, type_: str, window: Window) -> Data:
    active = Active()
    for s in db.queue_stats(conn, schema, active_only=True):
        if s.type != type_:
            continue
        if s.state is JobState.PENDING:
            active.ready += s.ready
            active.waiting += s.waiting
            active.delayed += s.count - s.ready - s.waiting
            active.oldest_ready_age = s.oldest_ready_age
        elif s.state is JobState.RUNNING:
            active.running += s.count
    control: TypeControl | None = next(
        (c for c in db.type_controls(conn, schema) if c.type == type_), None
    )
    limit: TypeLimit | None = next(
        (lim for lim in db.type_limits(conn, schema) if lim.type == type_), None
    )
    buckets = db.type_throughput(conn, schema, type_, window.seconds, window.bucket)
    durations: Durations = db.type_durations(conn, schema, type_, window.seconds)
    succeeded = sum(b.succeeded for b in buckets)
    failed = sum(b.failed for b in buckets)
    served_by = [
        f"{r.host} pid {r.pid}" for r in db.list_supervisors(conn, schema) if type_ in r.types
    ]
    return {
        "type": type_,
        "window": window,
        "windows": list(WINDOWS.values()),
        "active": active,
        "chart": bars(buckets, db.db_now(conn, schema), window),
        "succeeded": succeeded,
        "failed": failed,
        "failure_rate": None if succeeded + failed == 0 else failed / (succeeded + failed),
        "durations": durations,
        "control": control,
        "limit": limit,
        "schedules": schedule_rows(conn, schema, type_),
        "served_by": served_by,
    }
