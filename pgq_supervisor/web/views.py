"""What each dashboard page shows, read from the database into plain values for its template,
and what each action does. No HTTP here: app.py calls these in Starlette's thread pool."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from pgq_supervisor import db
from pgq_supervisor.coverage import coverage, is_stale
from pgq_supervisor.db import workflows
from pgq_supervisor.db.rows import ScheduleRecord
from pgq_supervisor.db.web_rows import RunningJob
from pgq_supervisor.display import (
    SHOWN_CHARS,
    Shown,
    children_of,
    count_of,
    current_pause,
    held_back,
    not_started,
    shown,
    step_line,
)
from pgq_supervisor.errors import ConfigError, JobNotFound
from pgq_supervisor.jobs import BundleId, JobId, JobRecord, JobState, JsonValue
from pgq_supervisor.periodic import Schedule
from pgq_supervisor.web.charts import CHART_MINUTES, chart

MAX_DEPENDENTS = 100
MAX_BUNDLES = 100
MAX_BUNDLE_JOBS = 500
Data = dict[str, object]


@dataclass(frozen=True, slots=True)
class Flash:
    ok: bool
    message: str


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
    schedules: int = 0


def overview(conn: db.Conn, schema: str, stale_after: float) -> Data:
    """`stale_after`: seconds without a refresh after which a supervisor row serves nothing."""
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
    schedules: dict[str, int] = {}
    for sc in db.list_schedules(conn, schema):
        schedules[sc.type] = schedules.get(sc.type, 0) + 1
    for t in types.values():
        t.schedules = schedules.get(t.type, 0)
    supervisors = db.list_supervisors(conn, schema)
    pending = {t.type: t.ready + t.delayed + t.waiting for t in types.values()}
    cover = coverage(pending, supervisors, stale_after)
    return {
        "types": sorted(types.values(), key=lambda r: r.type),
        "chart": chart(minutes, db.db_now(conn, schema)),
        "hour_succeeded": succeeded,
        "hour_failed": failed,
        "failure_rate": None if ended == 0 else failed / ended,
        "supervisors": len(supervisors),
        "coverage": cover,
        "unserved": {u.type for u in cover.unserved},
    }


# ---- one job ----


# Payloads and results stored (TOAST, maybe compressed) in more bytes than this are not read
# whole for the job page: their start comes from job_body_head, kept by the job's updated_at
# (a payload or a result never changes without it), so a live poll re-reads none of it. Small:
# a compressed value may hold many times its stored size (pglz on repetitive JSON: 100x).
INLINE_BYTES = 2048
_HEADS: OrderedDict[tuple[str, JobId, datetime], db.BodyHead] = OrderedDict()
_HEADS_KEPT = 32
_heads_lock = threading.Lock()


def _head(conn: db.Conn, schema: str, record: JobRecord) -> db.BodyHead | None:
    key = (schema, record.id, record.updated_at)
    with _heads_lock:
        if (head := _HEADS.get(key)) is not None:
            _HEADS.move_to_end(key)
            return head
    head = db.job_body_head(conn, schema, record.id, SHOWN_CHARS)
    if head is not None and head.updated_at == record.updated_at:
        with _heads_lock:
            _HEADS[key] = head
            while len(_HEADS) > _HEADS_KEPT:
                _HEADS.popitem(last=False)
    return head


def _pretty(value: JsonValue) -> Shown:
    return shown(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def bodies(conn: db.Conn, schema: str, record: JobRecord) -> tuple[Shown, Shown | None]:
    """The job page's payload and result (None: no result), each cut at SHOWN_CHARS: pretty
    JSON when read whole (job_page_record), else the start of its JSON text."""
    payload = None if record.payload is None else _pretty(record.payload)
    result = None if record.result is None else _pretty(record.result)
    # payload NOT NULL: None is one stored over INLINE_BYTES; a result None may be one too
    # (only a succeeded job has one)
    if payload is None or (result is None and record.state is JobState.SUCCEEDED):
        head = _head(conn, schema, record)
        if head is not None:
            payload = payload or _from_head(head.payload, head.payload_bytes)
            if head.result is not None and head.result_bytes is not None:
                result = _from_head(head.result, head.result_bytes)
    return payload or shown("null"), result


def _from_head(text: str, size: int) -> Shown:
    """A body read by job_body_head: pretty if it is all there, else its start as stored."""
    cut = shown(text, size)
    if cut.cut:
        return cut
    value: JsonValue = json.loads(text)
    return _pretty(value)


def job(conn: db.Conn, schema: str, job_id: JobId) -> Data:
    record = db.job_page_record(conn, schema, job_id, INLINE_BYTES)
    payload, result = bodies(conn, schema, record)
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
        "held_back": held_back(record),
        "pause": current_pause(steps) if record.state is JobState.PENDING else None,
        "job": record,
        "payload": payload,
        "result": result,
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
        "now": db.db_now(conn, schema),
    }


# ---- bundles, workers, schedules ----


def bundles(conn: db.Conn, schema: str) -> Data:
    return {"bundles": db.bundles_page(conn, schema, MAX_BUNDLES)}


def bundle(conn: db.Conn, schema: str, bundle_id: BundleId) -> Data:
    """A bundle and its jobs (the first MAX_BUNDLE_JOBS, newest first); JobNotFound if gone."""
    record = db.get_bundle(conn, schema, bundle_id)
    jobs = db.jobs_page(conn, schema, bundle_id=bundle_id, limit=MAX_BUNDLE_JOBS + 1)
    states: dict[str, int] = {}
    for j in jobs:
        states[j.state.value] = states.get(j.state.value, 0) + 1
    completion = db.bundle_completion(conn, schema, record)
    return {
        "bundle": record,
        "jobs": jobs[:MAX_BUNDLE_JOBS],
        "more": len(jobs) > MAX_BUNDLE_JOBS,
        "states": sorted(states.items()),
        "completion": completion,
        "now": db.db_now(conn, schema),
    }


def workers(conn: db.Conn, schema: str, stale_after: float) -> Data:
    """Each supervisor and its children; for each child, the jobs it holds (claimed: running
    in the database) that it had not started when its supervisor last wrote."""
    records = db.list_supervisors(conn, schema)
    children = {r.id: children_of(r) for r in records}
    worker_ids = [str(c["worker_id"]) for cs in children.values() for c in cs if c.get("worker_id")]
    held: dict[str, list[RunningJob]] = {}
    for job in db.running_on(conn, schema, worker_ids) if worker_ids else []:
        held.setdefault(job.worker_id, []).append(job)
    shown = []
    for r in records:
        kids = []
        for c in children[r.id]:
            ids = c.get("job_ids")
            started = {str(i) for i in ids} if isinstance(ids, list) else set()
            if c.get("job_id"):
                started.add(str(c.get("job_id")))
            mine = held.get(str(c.get("worker_id")), [])
            waiting = (
                [j for j in mine if str(j.id) not in started] if count_of(c.get("held")) else []
            )
            in_hand = next((j for j in mine if str(j.id) == str(c.get("job_id"))), None)
            kids.append({"child": c, "not_started": waiting, "in_hand": in_hand})
        shown.append({"record": r, "children": kids, "stale": is_stale(r, stale_after)})
    return {"supervisors": shown, "now": db.db_now(conn, schema)}


@dataclass(frozen=True, slots=True)
class ScheduleShown:
    record: ScheduleRecord
    next_run: datetime | None  # None: paused, or its definition no longer parses


def schedule_rows(conn: db.Conn, schema: str, type_: str | None = None) -> list[ScheduleShown]:
    shown = []
    for r in db.list_schedules(conn, schema):
        if type_ is not None and r.type != type_:
            continue
        shown.append(ScheduleShown(r, None if r.paused_at is not None else next_run(r)))
    return shown


def next_run(r: ScheduleRecord) -> datetime | None:
    """When the schedule's next tick falls, by its stored definition and the database's clock."""
    try:
        schedule = Schedule.make(
            r.name, type=r.type, cron=r.cron, every=r.every, timezone=r.timezone
        )
    except ConfigError:  # e.g. a timezone this machine lacks: no next run to show
        return None
    return schedule.next_tick(max(r.last_tick or r.created_at, r.now))


def schedules(conn: db.Conn, schema: str) -> Data:
    return {"schedules": schedule_rows(conn, schema)}


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


def schedule_action(
    conn: db.Conn, schema: str, action: str, name: str, who: str
) -> tuple[bool, str]:
    if action == "run_schedule":
        job_id = db.run_schedule_now(conn, schema, name)
        if job_id is None:
            return False, f"no schedule named {name}"
        return True, f"schedule {name}: job {job_id} enqueued, due now"
    if action == "pause_schedule":
        if not db.pause_schedule(conn, schema, name, who):
            return False, f"schedule {name} is unknown or paused already: nothing changed"
        return True, f"paused schedule {name}: it enqueues nothing until resumed"
    if action == "resume_schedule":
        if not db.resume_schedule(conn, schema, name):
            return False, f"schedule {name} is unknown or not paused: nothing changed"
        return True, f"resumed schedule {name} from its next tick"
    raise ValueError(f"unknown schedule action {action!r}")
