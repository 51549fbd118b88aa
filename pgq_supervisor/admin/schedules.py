"""`schedules`: the periodic schedules supervisors declared, when each runs next, and the last
tick enqueued. With `--app`, the registry's schedules too: one in the code that no supervisor
declared yet shows as "not declared", one in the database the code no longer has as "not in
code" (it does not fire; its row is kept for its history). Registered by admin.add_commands;
an invalid schedule in the app is a ConfigError (exit 2).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from pgq_supervisor import db
from pgq_supervisor.connect import open_db
from pgq_supervisor.db.rows import ScheduleRecord
from pgq_supervisor.jobs import JobId, JsonValue
from pgq_supervisor.periodic import Schedule
from pgq_supervisor.registry import load_registry
from pgq_supervisor.settings import Settings

Parser = TypeVar("Parser", bound=argparse.ArgumentParser)


def add_command(sub: argparse._SubParsersAction[Parser], parents: list[Parser]) -> None:
    p = sub.add_parser("schedules", parents=parents, help="periodic schedules and their last run")
    p.add_argument("--app", help="also read the schedules of this registry (module:attribute)")
    p.set_defaults(handler=cmd_schedules)


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    type: str
    when: str
    timezone: str
    next_run: datetime | None  # None: it does not fire (not in the code)
    last_tick: datetime | None
    last_job_id: JobId | None
    status: str  # "ok", "not in code", "not declared"; "" without --app

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "name": self.name,
            "type": self.type,
            "when": self.when,
            "timezone": self.timezone,
            "next_run": _iso(self.next_run),
            "last_tick": _iso(self.last_tick),
            "last_job_id": None if self.last_job_id is None else str(self.last_job_id),
            "status": self.status or None,
        }

    def cells(self) -> list[str]:
        return [
            self.name,
            self.when,
            self.type,
            self.timezone,
            _iso(self.next_run) or "-",
            _iso(self.last_tick) or "-",
            str(self.last_job_id or "-"),
            self.status,
        ]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds")


def entries(
    stored: Sequence[ScheduleRecord], code: Mapping[str, Schedule] | None, now: datetime
) -> list[Entry]:
    """One entry per schedule, stored or in `code` (None: the registry was not given)."""
    out: dict[str, Entry] = {}
    for row in stored:
        schedule = code.get(row.name) if code is not None else None
        if schedule is None and code is None:
            schedule = Schedule.make(
                row.name, type=row.type, cron=row.cron, every=row.every, timezone=row.timezone
            )
        status = "" if code is None else ("ok" if schedule is not None else "not in code")
        out[row.name] = Entry(
            name=row.name,
            type=schedule.type if schedule else row.type,
            when=schedule.when if schedule else (row.cron or f"every {row.every}"),
            timezone=schedule.timezone if schedule else row.timezone,
            next_run=None if schedule is None else schedule.next_tick(max(now, row.created_at)),
            last_tick=row.last_tick,
            last_job_id=row.last_job_id,
            status=status,
        )
    for name, schedule in (code or {}).items():
        if name not in out:
            out[name] = Entry(
                name, schedule.type, schedule.when, schedule.timezone,
                schedule.next_tick(now), None, None, "not declared",
            )  # fmt: skip
    return [out[name] for name in sorted(out)]


def cmd_schedules(args: argparse.Namespace, settings: Settings) -> int:
    app: str | None = args.app
    code = load_registry(app).schedules if app else None
    _, conn = open_db(settings)
    with conn:
        stored = db.list_schedules(conn, settings.db_schema)
        now = db.db_now(conn, settings.db_schema)
    found = entries(stored, code, now)
    if args.json:
        print(json.dumps({"schedules": [e.to_json() for e in found]}))
        return 0
    if not found:
        print("no schedules")
        return 0
    headers = ["NAME", "WHEN", "TYPE", "TIMEZONE", "NEXT RUN", "LAST TICK", "LAST JOB", "STATUS"]
    table = [headers, *(e.cells() for e in found)]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0
