"""Administrative commands: status, depth, jobs, show, retry, cancel, purge, schedules, pause,
resume, workers, dashboard-indexes, schema-dump.

Readable tables by default, one JSON document on stdout with `--json` (for scripts). Errors are
raised as the package's own exceptions and cli.main prints each as one line:
InvalidInput (a bad duration, type, limit or option mix) exits 2, JobNotFound,
InvalidTransition and DatabaseError exit 1. Arguments argparse rejects also exit 2.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from pgq_supervisor import db, ids
from pgq_supervisor.admin import doctor as admin_doctor
from pgq_supervisor.admin import partition as admin_partition
from pgq_supervisor.admin import schedules as admin_schedules
from pgq_supervisor.admin import schema as admin_schema
from pgq_supervisor.admin import workers as admin_workers
from pgq_supervisor.admin.control import (
    cmd_pause,
    cmd_resume,
    limits_json,
    limits_lines,
    paused_json,
    paused_lines,
)
from pgq_supervisor.admin.show import cmd_show
from pgq_supervisor.connect import open_db
from pgq_supervisor.coverage import coverage
from pgq_supervisor.db import partitions as db_partitions
from pgq_supervisor.display import plural, progress_cell
from pgq_supervisor.errors import InvalidInput, InvalidTransition
from pgq_supervisor.jobs import (
    JobId,
    JobRecord,
    JobState,
    JsonValue,
    TypeStats,
    check_type_name,
    stale_after,
)
from pgq_supervisor.settings import Settings, parse_duration

COMMANDS: tuple[str, ...] = (
    "status", "depth", "jobs", "show", "retry", "cancel", "purge", "schedules", "pause",
    "resume", "workers", "dashboard-indexes", "schema-dump", "partition", "doctor",
)  # fmt: skip

Parser = TypeVar("Parser", bound=argparse.ArgumentParser)

MAX_LIST = 10_000
ERROR_WIDTH = 80
# terminal states in the order people read them
FINISHED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def add_commands(sub: argparse._SubParsersAction[Parser], common: Parser) -> None:
    """Register the admin subcommands; each sets `handler(args, settings) -> exit code`."""
    out = type(common)(add_help=False)  # same parser class: its errors exit 2 in one line
    out.add_argument("--json", action="store_true", help="one JSON document for scripts")
    parents = [common, out]

    p = sub.add_parser("status", parents=parents, help="jobs per type and state")
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser(
        "depth", parents=parents, help="jobs a claim could take now (one integer, for autoscalers)"
    )
    p.add_argument("--type", type=_job_type, help="count only this job type")
    p.set_defaults(handler=cmd_depth)

    p = sub.add_parser("jobs", parents=parents, help="list jobs in a state (default: failed)")
    p.add_argument("--state", choices=[s.value for s in JobState], default=JobState.FAILED.value,
                   help="the state to list")  # fmt: skip
    p.add_argument("--type", type=_job_type, help="only this job type")
    p.add_argument("--limit", type=_limit, default=20, help="most recent N")
    p.set_defaults(handler=cmd_jobs)

    p = sub.add_parser("show", parents=parents, help="one job in full, with its attempt history")
    p.add_argument("id", type=_job_id, help="the job's id")
    p.add_argument(
        "--full",
        action="store_true",
        help="print a payload, result or error_data over 64 KiB whole (else cut, with its size)",
    )
    p.set_defaults(handler=cmd_show)

    p = sub.add_parser("retry", parents=parents, help="put a finished job (or all failed) back")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("id", nargs="?", type=_job_id, help="the job to run again")
    which.add_argument("--all-failed", action="store_true", help="every failed job")
    p.add_argument("--type", type=_job_type, help="with --all-failed: only this job type")
    p.add_argument("--force", action="store_true", help="take a running job from its worker")
    p.set_defaults(handler=cmd_retry)

    p = sub.add_parser("cancel", parents=parents, help="cancel a pending or running job")
    p.add_argument("id", type=_job_id, help="the job to cancel")
    p.set_defaults(handler=cmd_cancel)

    p = sub.add_parser("purge", parents=parents, help="delete finished jobs older than a duration")
    p.add_argument("--older-than", required=True, help="e.g. 12h, 7d, 2w")
    p.add_argument(
        "--state",
        action="append",
        choices=[s.value for s in FINISHED],
        help="only this state (repeatable; default: succeeded, failed and cancelled)",
    )
    p.set_defaults(handler=cmd_purge)

    admin_schedules.add_command(sub, parents)

    p = sub.add_parser("pause", parents=parents, help="stop claiming a job type (idempotent)")
    p.add_argument("type", type=_job_type, help="the job type to pause")
    p.add_argument("--reason", help="why, shown by status")
    p.set_defaults(handler=cmd_pause)

    p = sub.add_parser("resume", parents=parents, help="claim a paused job type again")
    p.add_argument("type", type=_job_type, help="the job type to resume")
    p.set_defaults(handler=cmd_resume)

    admin_workers.add_command(sub, parents)
    admin_schema.add_command(sub, [common])  # text only: no --json
    admin_partition.add_command(sub, [common])
    admin_doctor.add_command(sub, parents)


# ---- argument types: argparse turns their errors into a usage error (exit 2) ----


def _job_id(text: str) -> JobId:
    try:
        return ids.job_id(text)
    except InvalidInput:
        raise argparse.ArgumentTypeError(f"not a job id (a UUID): {text!r}") from None


def _job_type(text: str) -> str:
    try:
        return check_type_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _limit(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_LIST:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {MAX_LIST}, got {text!r}")
    return n


# ---- commands ----


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    _, conn = open_db(settings)
    with conn, db.counting_reads(conn):
        stats = db.queue_stats(conn, settings.db_schema)
        controls = db.type_controls(conn, settings.db_schema)
        limits = db.type_limits(conn, settings.db_schema)
        supervisors = db.list_supervisors(conn, settings.db_schema)
    rows = _status_rows(stats)
    pending = {r.type: r.counts[JobState.PENDING] for r in rows}
    served = coverage(pending, supervisors, stale_after(settings.heartbeat_interval))
    total = _StatusRow("TOTAL")
    for r in rows:
        total.add(r)
    if args.json:
        _print_json(
            {
                "types": [r.to_json() for r in rows],
                "total": {k: v for k, v in total.to_json().items() if k != "type"},
                "paused": paused_json(controls),
                "limits": limits_json(limits),
                **served.to_json(),
            }
        )
        return 0
    if not rows:
        print("\n".join(["no jobs", *paused_lines(controls), *limits_lines(limits)]))
        return 0
    headers = ["TYPE", "READY", "DELAYED", "WAITING", "RUNNING"]
    headers += [s.value.upper() for s in FINISHED]
    body = [r.cells() for r in rows]
    if len(rows) > 1:
        body.append(total.cells())
    table = _table([*headers, "OLDEST READY"], body, left=1)
    print("\n".join([table, *served.lines(), *paused_lines(controls), *limits_lines(limits)]))
    return 0


def cmd_depth(args: argparse.Namespace, settings: Settings) -> int:
    type_: str | None = args.type
    _, conn = open_db(settings)
    with conn:
        n = db.depth(conn, settings.db_schema, type_)
    if args.json:
        _print_json({"depth": n, "type": type_})
    else:
        print(n)
    return 0


def cmd_jobs(args: argparse.Namespace, settings: Settings) -> int:
    state = JobState(args.state)
    type_: str | None = args.type
    limit: int = args.limit
    _, conn = open_db(settings)
    with conn:
        jobs = db.list_jobs(conn, settings.db_schema, state, type_, limit)
        now = db.db_now(conn, settings.db_schema)
    if args.json:
        _print_json({"jobs": [_job_json(j) for j in jobs]})
        return 0
    if not jobs:
        print(f"no {state.value} jobs" + (f" of type {type_}" if type_ else ""))
        return 0
    body = [
        [
            str(j.id),
            j.type,
            str(attempts_made(j)),
            progress_cell(j.progress),
            _age(_seconds(now, j.updated_at)) + " ago",
            _one_line(j.error_msg or "", ERROR_WIDTH),
        ]
        for j in jobs
    ]
    headers = ["ID", "TYPE", "ATTEMPTS", "PROGRESS", "UPDATED", "LAST ERROR"]
    print(_table(headers, body, left=2))
    return 0


def cmd_retry(args: argparse.Namespace, settings: Settings) -> int:
    job_id: JobId | None = args.id
    type_: str | None = args.type
    force: bool = args.force
    if job_id is not None and type_ is not None:
        raise InvalidInput("--type goes with --all-failed, not with a job id")
    if job_id is None and force:
        raise InvalidInput("--force goes with a job id, not with --all-failed")
    _, conn = open_db(settings)
    with conn:
        if job_id is None:
            n = db.retry_failed(conn, settings.db_schema, type_)
            what = "failed jobs" + (f" of type {type_}" if type_ else "")
            message = f"retried {n} {what}"
        else:
            blocked_by = db.reset(conn, settings.db_schema, job_id, force)
            if blocked_by is not None:
                raise InvalidTransition(_why_not_retried(job_id, blocked_by))
            n = 1
            message = f"job {job_id} is pending again"
    if args.json:
        _print_json({"retried": n} | ({"id": str(job_id)} if job_id else {}))
    else:
        print(message)
    return 0


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    job_id: JobId = args.id
    _, conn = open_db(settings)
    with conn:
        result = db.cancel(conn, settings.db_schema, job_id)
    if not result.cancelled:
        raise InvalidTransition(
            f"job {job_id} is {result.state.value}; only pending or running jobs can be cancelled"
        )
    if args.json:
        _print_json({"cancelled": str(job_id), "was": result.state.value})
    elif result.state is JobState.RUNNING:
        print(
            f"cancelled job {job_id} (it was running on {result.worker_id}:"
            " its supervisor stops it)"
        )
    else:
        print(f"cancelled job {job_id}")
    return 0


def cmd_purge(args: argparse.Namespace, settings: Settings) -> int:
    older_than = parse_duration(args.older_than)
    chosen: list[str] = args.state or [s.value for s in FINISHED]
    states = [s for s in FINISHED if s.value in chosen]
    _, conn = open_db(settings)
    with conn:
        n = 0
        if len(states) == len(FINISHED):  # whole partitions first, then what is left row by row
            n = db_partitions.expire_old(
                conn,
                settings.db_schema,
                succeeded=older_than,
                failed=older_than,
                max_steps=1000,
                count=True,
            ).jobs
        n += db.delete_finished(conn, settings.db_schema, older_than, states)
    names = [s.value for s in states]
    if args.json:
        _print_json({"purged": n, "states": list(names), "older_than_seconds": older_than})
    else:
        purged = f"purged {plural(n, 'job')} ({', '.join(names)})"
        print(f"{purged} finished more than {args.older_than} ago")
    return 0


# ---- shaping the output ----


def attempts_made(job: JobRecord) -> int:
    """Attempts started so far: every failed one is in the history; a running or succeeded
    job adds the one in progress (or the one that succeeded)."""
    current = job.state in (JobState.RUNNING, JobState.SUCCEEDED)
    return len(job.attempts) + int(current)


def _why_not_retried(job_id: JobId, state: JobState) -> str:
    if state is JobState.RUNNING:
        return f"job {job_id} is running; pass --force to take it from its worker"
    if state is JobState.PENDING:
        return f"job {job_id} is already pending"
    return f"job {job_id} is {state.value}; cannot retry it"


@dataclass
class _StatusRow:
    type: str
    counts: dict[JobState, int] = field(default_factory=lambda: dict.fromkeys(JobState, 0))
    ready: int = 0
    oldest_ready_age: float | None = None
    # pending jobs waiting for their dependencies: neither ready nor delayed
    waiting: int = 0

    def add(self, other: _StatusRow) -> None:
        for state, n in other.counts.items():
            self.counts[state] += n
        self.ready += other.ready
        self.waiting += other.waiting
        if other.oldest_ready_age is not None:
            self.oldest_ready_age = max(self.oldest_ready_age or 0.0, other.oldest_ready_age)

    @property
    def delayed(self) -> int:
        return self.counts[JobState.PENDING] - self.ready - self.waiting

    def cells(self) -> list[str]:
        numbers = [self.ready, self.delayed, self.waiting, self.counts[JobState.RUNNING]]
        numbers += [self.counts[s] for s in FINISHED]
        age = "-" if self.oldest_ready_age is None else _age(self.oldest_ready_age)
        return [self.type, *map(str, numbers), age]

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"type": self.type}
        out |= {s.value: n for s, n in self.counts.items()}
        out |= {"ready": self.ready, "delayed": self.delayed, "waiting": self.waiting}
        out["oldest_ready_age"] = self.oldest_ready_age
        return out


def _status_rows(stats: Sequence[TypeStats]) -> list[_StatusRow]:
    rows: dict[str, _StatusRow] = {}
    for s in stats:
        row = rows.setdefault(s.type, _StatusRow(s.type))
        row.counts[s.state] += s.count
        row.ready += s.ready
        row.waiting += s.waiting
        if s.oldest_ready_age is not None:
            row.oldest_ready_age = max(row.oldest_ready_age or 0.0, s.oldest_ready_age)
    return [rows[t] for t in sorted(rows)]


def _job_json(job: JobRecord) -> dict[str, JsonValue]:
    return {
        "id": str(job.id),
        "type": job.type,
        "state": job.state.value,
        "attempts": attempts_made(job),
        "max_retry_count": job.max_retry_count,
        "error": job.error_msg,
        "priority": job.priority,
        "progress": job.progress,
        "created_at": job.created_at.isoformat(),
        "updated_at": job.updated_at.isoformat(),
        "stopped_at": job.stopped_at.isoformat() if job.stopped_at else None,
    }


def _print_json(doc: dict[str, JsonValue]) -> None:
    print(json.dumps(doc))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int) -> str:
    """Columns padded to fit; the first `left` columns and the last are left-aligned."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    last = len(headers) - 1

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if i < left or i == last else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join(line(r) for r in [headers, *rows])


def _seconds(now: datetime, then: datetime) -> float:
    return max(0.0, (now - then).total_seconds())


def _age(seconds: float) -> str:
    """12s, 5m12s, 3h04m, 2d03h: short and sortable by eye."""
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _one_line(text: str, width: int) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= width else first[: width - 3] + "..."
