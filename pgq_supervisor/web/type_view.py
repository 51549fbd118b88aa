"""A job type's page: its counts now, its throughput and failures over a chosen window, its
run time percentiles, its limits (rate, global and per-key concurrency), pause and schedules.

What it reads: pending and running counts from the partial indexes that hold them
(type_active); the window's finished jobs, of every type, on job_finished_idx (state,
stopped_at), for the chart and the percentiles: the window bounds the rows read, 7 days of a
busy queue being the most (docs/dashboard.md has its cost)."""

from __future__ import annotations

from pgq_supervisor import db
from pgq_supervisor.coverage import coverage, is_stale
from pgq_supervisor.db.rows import TypeControl
from pgq_supervisor.db.web_rows import Durations, TypeActive
from pgq_supervisor.web.charts import WINDOWS, Window, bars
from pgq_supervisor.web.views import Data, schedule_rows


def window_of(name: str) -> Window:
    """ValueError naming the choices when `name` is not a window."""
    try:
        return WINDOWS[name or "1h"]
    except KeyError:
        choices = ", ".join(WINDOWS)
        raise ValueError(f"invalid window: {name[:20]!r} (one of {choices})") from None


def type_page(conn: db.Conn, schema: str, type_: str, window: Window, stale_after: float) -> Data:
    """`stale_after`: seconds without a refresh after which a supervisor row serves nothing."""
    active: TypeActive = db.type_active(conn, schema, type_)
    control: TypeControl | None = next(
        (c for c in db.type_controls(conn, schema) if c.type == type_), None
    )
    buckets = db.type_throughput(conn, schema, type_, window.seconds, window.bucket)
    durations: Durations = db.type_durations(conn, schema, type_, window.seconds)
    succeeded = sum(b.succeeded for b in buckets)
    failed = sum(b.failed for b in buckets)
    supervisors = db.list_supervisors(conn, schema)
    pending = active.ready + active.delayed + active.waiting
    cover = coverage({type_: pending}, supervisors, stale_after)
    served_by = [
        f"{r.host} pid {r.pid}"
        for r in supervisors
        if type_ in r.types and not is_stale(r, stale_after)
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
        "schedules": schedule_rows(conn, schema, type_),
        "served_by": served_by,
        "coverage": cover,
        "unserved": cover.unserved[0] if cover.unserved else None,
    }
