"""`workers`: each registered supervisor (host, pid, procs, started, last seen) and each of its
children (state, job in hand, jobs claimed but not started, jobs done), from the supervisor
table (schema/0010). A row not refreshed for three heartbeats (jobs.stale_after) is marked
stale: its supervisor was killed or cannot reach the database. `not_started` tells, from the
same rows, whether a running job was claimed but not started when its worker was last seen
(`show`, the dashboard's job page). And `dashboard-indexes`: the dashboard Jobs page's opt-in
indexes (schema/0010). Registered by admin.add_commands."""

from __future__ import annotations

import argparse
import json
from typing import TypeVar

from pgq_supervisor import db, jobs
from pgq_supervisor.connect import open_db
from pgq_supervisor.coverage import is_stale
from pgq_supervisor.db.rows import SupervisorRecord
from pgq_supervisor.display import children_of, count_of, plural
from pgq_supervisor.jobs import JsonValue
from pgq_supervisor.settings import Settings

Parser = TypeVar("Parser", bound=argparse.ArgumentParser)


def add_command(sub: argparse._SubParsersAction[Parser], parents: list[Parser]) -> None:
    p = sub.add_parser("workers", parents=parents, help="live supervisors and their children")
    p.set_defaults(handler=cmd_workers)
    p = sub.add_parser(
        "dashboard-indexes",
        parents=parents,
        help="create the dashboard Jobs page's opt-in indexes (CONCURRENTLY; docs/dashboard.md)",
    )
    p.add_argument(
        "--payload",
        action="store_true",
        help="also the payload search's GIN index (job_payload_idx): it costs every enqueue",
    )
    p.set_defaults(handler=cmd_dashboard_indexes)


def cmd_dashboard_indexes(args: argparse.Namespace, settings: Settings) -> int:
    _, conn = open_db(settings)
    with conn:
        db.create_dashboard_indexes(conn, settings.db_schema, payload=args.payload)
    created = [*db.DASHBOARD_INDEXES, *([db.PAYLOAD_INDEX] if args.payload else [])]
    names = ", ".join(created)
    if args.json:
        print(json.dumps({"created": created}))
    else:
        print(f"dashboard indexes present: {names}")
    return 0


def in_hand(child: dict[str, JsonValue]) -> str:
    """A child's jobs as the `workers` command and the dashboard show them."""
    job = f"{child.get('job_type')} {child.get('job_id')}" if child.get("job_id") else "-"
    more = count_of(child.get("in_flight")) - 1
    if more > 0:
        job += f" (+{more} more in flight)"
    held = count_of(child.get("held"))
    if held > 0:
        job += f" (+{held} claimed, not started)"
    return job


def record_json(record: SupervisorRecord, stale_after: float) -> dict[str, JsonValue]:
    return {
        "id": record.id,
        "host": record.host,
        "pid": record.pid,
        "procs": record.procs,
        "types": list(record.types),
        "started_at": record.started_at.isoformat(),
        "seen_at": record.seen_at.isoformat(),
        "seen_ago": round(record.seen_ago, 3),
        "stale": is_stale(record, stale_after),
        "children": list(children_of(record)),
    }


def cmd_workers(args: argparse.Namespace, settings: Settings) -> int:
    _, conn = open_db(settings)
    with conn:
        records = db.list_supervisors(conn, settings.db_schema)
    window = jobs.stale_after(settings.heartbeat_interval)
    if args.json:
        print(json.dumps({"supervisors": [record_json(r, window) for r in records]}))
        return 0
    if not records:
        print("no supervisor is registered")
        return 0
    for r in records:
        stale = "  STALE" if is_stale(r, window) else ""
        print(
            f"{r.host} pid {r.pid}  {plural(r.procs, 'proc')}  types {','.join(r.types)}"
            f"  started {r.started_at:%Y-%m-%d %H:%M:%S %Z}  seen {r.seen_ago:.0f} s ago{stale}"
        )
        for c in children_of(r):
            print(
                f"  child {c.get('index')}  pid {c.get('pid')}  {c.get('state')}"
                f"  job {in_hand(c)}  done {c.get('jobs_done')}"
            )
    return 0
