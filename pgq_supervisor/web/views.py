"""What each dashboard page shows, read from the database into plain values for its template,
and what each action does. No HTTP here: app.py calls these in Starlette's thread pool."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pgq_supervisor import db
from pgq_supervisor.db import workflows
from pgq_supervisor.db.rows import JobListed, ThroughputMinute
from pgq_supervisor.display import (
    children_of,
    current_pause,
    not_started,
    progress_cell,
    step_line,
)
from pgq_supervisor.errors import JobNotFound
from pgq_supervisor.jobs import JobId, JobState, JsonValue, check_type_name

CHART_MINUTES = 60
MAX_DEPENDENTS = 100
MAX_BUNDLES = 100
Data = dict[str, object]


@dataclass(frozen=True, slots=True)
class Flash:
    ok: bool
    message: str


# ---- template filters ----


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


def pretty(value: JsonValue) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def progress(value: JsonValue) -> str:
    return progress_cell(value)


# ---- overview ----


@dataclass
class TypeRow:
    """One job type's counts; `delayed`: pending, not yet due, not waiting on dependencies."""

    type: str
    ready: int = 0
    delayed: int = 0
    waiting: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    oldest_ready_age: float | None = None
    paused_at: datetime | None = None
    paused_by: str | None = None
    reason: str | None = None
    rate: str | None = None
    free_starts: int | None = None


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    height: float
    kind: str  # "succeeded" | "failed"
    title: str


@dataclass
class Chart:
    """The throughput chart as SVG geometry: a stacked bar per minute, the newest rightmost."""

    width: int = 720
    height: int = 160
    bars: list[Bar] = field(default_factory=list)
    top: int = 0
    bar_width: float = 0.0


def overview(conn: db.Conn, schema: str) -> Data:
    types: dict[str, TypeRow] = {}
    for s in db.queue_stats(conn, schema):
        row = types.setdefault(s.type, TypeRow(s.type))
        match s.state:
            case JobState.PENDING:
                row.ready += s.ready
                row.waiting += s.waiting
                row.delayed += s.count - s.ready - s.waiting
                if s.oldest_ready_age is not None:
                    row.oldest_ready_age = s.oldest_ready_age
            case JobState.RUNNING:
                row.running += s.count
            case JobState.SUCCEEDED:
                row.succeeded += s.count
            case JobState.FAILED:
                row.failed += s.count
            case JobState.CANCELLED:
                row.cancelled += s.count
    for c in db.type_controls(conn, schema):
        row = types.setdefault(c.type, TypeRow(c.type))
        row.paused_at, row.paused_by, row.reason = c.paused_at, c.paused_by, c.reason
        if c.max_starts is not None and c.period is not None:
            row.rate = f"{c.max_starts} per {c.period:g} s"
            row.free_starts = c.free_starts
    minutes = db.throughput(conn, schema, CHART_MINUTES)
    succeeded = sum(m.succeeded for m in minutes)
    failed = sum(m.failed for m in minutes)
    ended = succeeded + failed
    return {
        "types": sorted(types.values(), key=lambda r: r.type),
        "chart": chart(minutes, db.db_now(conn, schema)),
        "hour_succeeded": succeeded,
        "hour_failed": failed,
        "failure_rate": None if ended == 0 else failed / ended,
        "supervisors": len(db.list_supervisors(conn, schema)),
    }


def chart(minutes: list[ThroughputMinute], now: datetime) -> Chart:
    """Bars for the last CHART_MINUTES minutes up to `now` (the database's clock)."""
    c = Chart()
    current = now.replace(second=0, microsecond=0)
    by_minute = {m.minute.astimezone(UTC): m for m in minutes}
    c.top = max((m.succeeded + m.failed for m in minutes), default=0)
    c.bar_width = c.width / CHART_MINUTES
    plot = c.height - 20  # room for the axis labels
    scale = plot / c.top if c.top else 0.0
    for i in range(CHART_MINUTES):
        minute = current - timedelta(minutes=CHART_MINUTES - 1 - i)
        m = by_minute.get(minute.astimezone(UTC))
        if m is None:
            continue
        x = i * c.bar_width
        label = f"{minute.astimezone(UTC):%H:%M} UTC: {m.succeeded} succeeded, {m.failed} failed"
        ok_h, bad_h = m.succeeded * scale, m.failed * scale
        if m.succeeded:
            c.bars.append(Bar(x, plot - ok_h, ok_h, "succeeded", label))
        if m.failed:
            c.bars.append(Bar(x, plot - ok_h - bad_h, bad_h, "failed", label))
    return c


# ---- jobs ----


def _moment(text: str, what: str) -> datetime | None:
    """An ISO date-time from a form (datetime-local has no zone: UTC)."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"invalid {what}: {text[:40]!r} is not a date and time") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class JobsQuery:
    """The jobs page's filters and keyset, from its query string."""

    state: JobState | None = None
    type: str | None = None
    search: str = ""
    since: datetime | None = None
    until: datetime | None = None
    before: tuple[datetime, JobId] | None = None
    raw: Mapping[str, str] = field(default_factory=dict)

    @property
    def job_id(self) -> JobId | None:
        """The search, when it reads as a job id."""
        try:
            return JobId(uuid.UUID(self.search)) if self.search else None
        except ValueError:
            return None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> JobsQuery:
        """Raises ValueError naming the bad parameter."""
        raw = {k: params.get(k, "") for k in ("state", "type", "q", "since", "until")}
        state = None
        if raw["state"]:
            try:
                state = JobState(raw["state"])
            except ValueError:
                raise ValueError(f"invalid state: {raw['state'][:40]!r}") from None
        type_ = check_type_name(raw["type"]) if raw["type"] else None
        before = None
        if params.get("before"):
            at, _, id_text = params["before"].partition(",")
            try:
                before = (datetime.fromisoformat(at), JobId(uuid.UUID(id_text)))
            except ValueError:
                raise ValueError("invalid before: not a page of this list") from None
        return cls(
            state=state,
            type=type_,
            search=raw["q"].strip(),
            since=_moment(raw["since"], "since"),
            until=_moment(raw["until"], "until"),
            before=before,
            raw=raw,
        )


def empty_jobs(error: str) -> Data:
    return {
        "rows": [], "next": None, "filters": {}, "error": error, "states": list(JobState),
        "paged": False,
    }  # fmt: skip


def jobs(conn: db.Conn, schema: str, query: JobsQuery, limit: int) -> Data:
    rows: list[JobListed] = db.jobs_page(
        conn,
        schema,
        state=query.state,
        type_=query.type,
        unique_key=query.search or None,
        since=query.since,
        until=query.until,
        before=query.before,
        limit=limit + 1,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    next_page = None
    if more:
        last = rows[-1]
        next_page = {**{k: v for k, v in query.raw.items() if v}}
        next_page["before"] = f"{last.created_at.isoformat()},{last.id}"
    return {
        "rows": rows,
        "next": next_page,
        "filters": query.raw,
        "error": None,
        "states": list(JobState),
        "paged": query.before is not None,
    }


# ---- one job ----


def job(conn: db.Conn, schema: str, job_id: JobId) -> Data:
    record = db.get_job(conn, schema, job_id)
    bundle = None
    if record.bundle_id is not None:
        try:
            bundle = db.get_bundle(conn, schema, record.bundle_id)
        except JobNotFound:
            bundle = None
    error_data = record.error_data if isinstance(record.error_data, dict) else {}
    attempts = [a for a in record.attempts if isinstance(a, dict)]
    steps = workflows.steps(conn, schema, job_id)
    return {
        "steps": [step_line(s) for s in steps],
        "pause": current_pause(steps) if record.state is JobState.PENDING else None,
        "job": record,
        "bundle": bundle,
        "attempts": attempts,
        "last_traceback": error_data.get("traceback"),
        "dependencies": db.job_dependencies(conn, schema, job_id),
        "dependents": db.job_dependents(conn, schema, job_id, MAX_DEPENDENTS),
        "finished": record.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED),
        # a running job its worker held without having started it (admin_workers.not_started)
        "not_started": not_started(db.list_supervisors(conn, schema), record)
        if record.state is JobState.RUNNING
        else None,
        "cancellable": record.state in (JobState.PENDING, JobState.RUNNING),
    }


def job_action(conn: db.Conn, schema: str, action: str, job_id: JobId) -> tuple[bool, str]:
    """Run `action` on one job; (done, what to tell the user)."""
    if action == "retry":
        refused = db.reset(conn, schema, job_id, force=False)
        if refused is not None:
            return False, f"not retried: job {job_id} is {refused.value}, not finished"
        return True, f"job {job_id} is pending again"
    if action == "cancel":
        result = db.cancel(conn, schema, job_id)
        if not result.cancelled:
            return False, f"not cancelled: job {job_id} is {result.state.value} already"
        if result.state is JobState.RUNNING:
            return True, f"job {job_id} cancelled; its worker is being stopped"
        return True, f"job {job_id} cancelled"
    if action == "delete":
        if db.delete_job(conn, schema, job_id):
            return True, f"job {job_id} deleted"
        db.get_job(conn, schema, job_id)  # JobNotFound when it is unknown
        return False, f"not deleted: job {job_id} is not finished (cancel it first)"
    raise ValueError(f"unknown job action {action!r}")


def type_action(conn: db.Conn, schema: str, action: str, type_: str, who: str) -> tuple[bool, str]:
    if action == "retry_failed":
        n = db.retry_failed(conn, schema, type_)
        if n == 0:
            return False, f"no failed job of type {type_} to retry"
        return True, f"{n} failed job{'s' if n != 1 else ''} of type {type_} pending again"
    if action == "pause":
        if db.pause(conn, schema, type_, paused_by=who, reason=None) is None:
            return False, f"{type_} was already paused: nothing changed"
        return True, f"paused {type_}: no supervisor starts its jobs until it is resumed"
    if action == "resume":
        if not db.resume(conn, schema, type_):
            return False, f"{type_} was not paused: nothing to resume"
        return True, f"resumed {type_}"
    raise ValueError(f"unknown type action {action!r}")


# ---- bundles, workers, schedules ----


def bundles(conn: db.Conn, schema: str) -> Data:
    return {"bundles": db.bundles_page(conn, schema, MAX_BUNDLES)}


def workers(conn: db.Conn, schema: str, stale_after: float) -> Data:
    return {
        "supervisors": [
            {"record": r, "children": children_of(r), "stale": r.seen_ago > stale_after}
            for r in db.list_supervisors(conn, schema)
        ]
    }


def schedules(conn: db.Conn, schema: str) -> Data:
    return {"schedules": db.list_schedules(conn, schema)}
