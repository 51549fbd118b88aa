"""`show ID`: one job in full (payload, result, progress, timestamps, every attempt; a running
job its worker holds without having started it says so). Registered by admin.add_commands;
errors as there (an unknown id is JobNotFound: one line, exit 1)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import datetime

from pgq_supervisor import db
from pgq_supervisor.connect import open_db
from pgq_supervisor.coverage import coverage
from pgq_supervisor.db import workflows
from pgq_supervisor.display import (
    NotStarted,
    current_pause,
    held_back,
    not_started,
    progress_cell,
    step_line,
)
from pgq_supervisor.display import shown as clipped
from pgq_supervisor.jobs import JobId, JobRecord, JobState, JsonValue, stale_after
from pgq_supervisor.settings import Settings
from pgq_supervisor.steps import StepView

# what `show` cuts at display.SHOWN_CHARS unless --full (--json prints everything whole)
CUT = ("payload", "result", "error_data")


def _plain(value: object) -> JsonValue:
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float | str | list | dict):
        return value  # JSON already, as the database gave it
    return str(value)  # ids, the state


def record_json(record: JobRecord) -> dict[str, JsonValue]:
    """Every field of the record, as JSON (times in ISO 8601)."""
    return {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def _text(
    record: JobRecord,
    held: NotStarted | None = None,
    steps: list[StepView] | None = None,
    unserved: str | None = None,
    full: bool = False,
) -> str:
    doc = record_json(record)
    lines = []
    order = [
        "id", "type", "state", "priority", "progress", "current_retry_count", "max_retry_count",
        "snoozes", "origin", "bundle_id", "unique_key", "debounce_key", "ordered_key", "tenant",
        "timeout", "worker_id",
        "created_at", "start_at", "started_at", "worker_alive_at", "stopped_at", "updated_at",
        "payload", "result", "error_msg", "error_data",
    ]  # fmt: skip
    width = max(len(k) for k in order)
    for key in order:
        value = doc[key]
        if value is None or (key == "snoozes" and value == 0):
            continue
        trace = value.get("traceback") if key == "error_data" and isinstance(value, dict) else None
        if isinstance(trace, str) and isinstance(value, dict):  # as lines, not one JSON string
            value = {k: v for k, v in value.items() if k != "traceback"}
        shown = value if isinstance(value, str) else json.dumps(value)
        if key == "progress":
            shown = f"{progress_cell(record.progress)}  {json.dumps(value)}"
        if key in CUT and not full and (cut := clipped(shown)).cut:
            shown = f"{cut.text}\n{''.ljust(width)}  ... {cut.note()} (show {record.id} --full)"
        lines.append(f"{key.ljust(width)}  {shown}")
        if isinstance(trace, str):
            lines.append(f"{''.ljust(width)}  traceback:")
            lines += [f"{''.ljust(width)}    {line}" for line in trace.rstrip().splitlines()]
        if key == "state" and held is not None:
            lines.append(f"{''.ljust(width)}  {held.text()}")
        if key == "state" and unserved is not None:
            lines.append(f"{''.ljust(width)}  {unserved}")
        if key == "state" and (reason := held_back(record)) is not None:
            lines.append(f"{''.ljust(width)}  held back: {reason}")
        pause = current_pause(steps or []) if record.state is JobState.PENDING else None
        if key == "state" and pause is not None:
            lines.append(f"{''.ljust(width)}  workflow: {pause}")
        if key == "state":  # numbered from 1, as Job.attempt and the dashboard number it
            budget = "" if record.max_retry_count is None else f" of {record.max_retry_count + 1}"
            lines.append(f"{'attempt'.ljust(width)}  {record.attempt}{budget}")
    snoozes = sum(1 for a in record.attempts if isinstance(a, dict) and a.get("kind") == "snoozed")
    failed = f"{len(record.attempts) - snoozes} failed" + (
        f", {snoozes} snoozed" if snoozes else ""
    )
    lines.append(f"attempts ({failed})" + (":" if record.attempts else ""))
    for attempt in record.attempts:
        a = attempt if isinstance(attempt, dict) else {}
        error = str(a.get("error") or "").strip().splitlines()
        lines.append(
            f"  #{a.get('attempt')}  {a.get('kind', '-')}  at {a.get('at')}"
            f"  worker {a.get('worker') or '-'}  {error[0] if error else ''}".rstrip()
        )
    if steps:
        lines.append(f"workflow steps ({len(steps)}):")
        for step in map(step_line, steps):
            lines.append(
                f"  #{step.seq}  {step.kind}  {step.name!r}  {step.state}  {step.took}"
                f"  {step.detail}"
            )
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    job_id: JobId = args.id
    _, conn = open_db(settings)
    with conn:
        record = db.get_job(conn, settings.db_schema, job_id)
        held = None
        cover = None
        if record.state is JobState.RUNNING:
            held = not_started(db.list_supervisors(conn, settings.db_schema), record)
        elif record.state is JobState.PENDING:
            supervisors = db.list_supervisors(conn, settings.db_schema)
            window = stale_after(settings.heartbeat_interval)
            cover = coverage({record.type: 1}, supervisors, window)
        steps = workflows.steps(conn, settings.db_schema, job_id)
    gap = cover.unserved[0] if cover is not None and cover.unserved else None
    if args.json:
        shown = None if held is None else held.to_json()
        listed = [{k: _plain(v) for k, v in dataclasses.asdict(s).items()} for s in steps]
        doc = {"job": record_json(record), "not_started": shown, "steps": listed}
        unserved: JsonValue = None
        if cover is not None and gap is not None:
            unserved = {
                "live_supervisors": cover.live,
                "did_you_mean": gap.like,
                "served": list(cover.served),
            }
        print(json.dumps({**doc, "unserved": unserved}))
    else:
        said = None
        if cover is not None and gap is not None:
            said = (
                "unserved: no live supervisor is registered: it waits for one"
                if not cover.live
                else f"unserved: no live supervisor serves type {gap.type!r}"
                + (f" (did you mean {gap.like!r}?)" if gap.like else "")
                + f"; served: {cover.served_text()}"
            )
        print(_text(record, held, steps, said, full=args.full))
    return 0
