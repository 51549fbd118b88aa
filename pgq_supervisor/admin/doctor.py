"""`doctor`: what keeps vacuum from cleaning the job table, and what to do (vacuum.py).

Prints the job table's dead tuples, size and last vacuums, the server's autovacuum settings,
then one finding per cause: a session whose transaction has been open longer than
--max-transaction-age (pid, user, application, state, age, query), a replication slot, a
prepared transaction, a table vacuum cannot keep up with; then which job types the live
supervisors serve, and one finding per type with pending jobs that none serves (a misspelt type
waits forever otherwise; coverage.py). Exit 0 when nothing needs action, 1
when something does (so a cron job or a readiness check can alert on it), 2 on bad usage.
Registered by admin.add_commands."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TypeVar

from pgq_supervisor.connect import open_db
from pgq_supervisor.coverage import Coverage, read_coverage
from pgq_supervisor.db.health import Health, read_health
from pgq_supervisor.display import plural
from pgq_supervisor.errors import InvalidInput
from pgq_supervisor.jobs import stale_after
from pgq_supervisor.settings import Settings, parse_duration
from pgq_supervisor.vacuum import MAX_TRANSACTION_AGE, MAX_XMIN_AGE, Finding, diagnose, mib

Parser = TypeVar("Parser", bound=argparse.ArgumentParser)
NEEDS_ACTION = 1


def add_command(sub: argparse._SubParsersAction[Parser], parents: list[Parser]) -> None:
    p = sub.add_parser(
        "doctor",
        parents=parents,
        help="vacuum health: what holds the xmin horizon back, the job table's dead tuples;"
        " pending job types no live supervisor serves (exit 1 when something needs action)",
    )
    p.add_argument(
        "--max-transaction-age",
        default=f"{MAX_TRANSACTION_AGE:g}s",
        help="a transaction open longer than this holds vacuum back (default 5m; 30s, 2h, ...)",
    )
    p.add_argument(
        "--max-xmin-age",
        type=int,
        default=MAX_XMIN_AGE,
        help="an active replication slot (a standby's hot_standby_feedback) counts once its xmin"
        f" is this many transactions behind (default {MAX_XMIN_AGE:,}); an inactive one always",
    )
    p.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    max_age = parse_duration(str(args.max_transaction_age))
    if max_age <= 0:
        raise InvalidInput("invalid --max-transaction-age: must be > 0")
    if args.max_xmin_age <= 0:
        raise InvalidInput("invalid --max-xmin-age: must be > 0 (transactions)")
    schema = settings.db_schema
    _, conn = open_db(settings)
    with conn:
        health = read_health(conn, schema, older_than=max_age)
        cover = read_coverage(conn, schema, stale_after(settings.heartbeat_interval))
    findings = diagnose(health, schema, max_age=max_age, max_xmin_age=args.max_xmin_age)
    findings += cover.findings()
    if args.json:
        doc = {**_json(health, findings), "coverage": cover.to_json()}
        print(json.dumps(doc, default=str))
    else:
        print("\n".join(_lines(health, findings, schema, cover)))
    return NEEDS_ACTION if findings else 0


def _served_line(cover: Coverage) -> str:
    if not cover.live:
        return "supervisors: none live"
    return f"supervisors: serving {cover.served_text()}"


def _lines(health: Health, findings: list[Finding], schema: str, cover: Coverage) -> list[str]:
    t = health.table
    out = []
    if t is None:
        out.append(f"no job table in schema {schema}")
    else:
        last = t.last_autovacuum.isoformat(timespec="seconds") if t.last_autovacuum else "never"
        manual = t.last_vacuum.isoformat(timespec="seconds") if t.last_vacuum else "never"
        out += [
            f"job table {schema}.job: {t.live_tuples:,} live, {t.dead_tuples:,} dead row"
            f" versions; {mib(t.total_bytes)} with indexes ({mib(t.table_bytes)} heap)"
            + (f", in {plural(t.partitions, 'partition')}" if t.partitions > 1 else ""),
            f"  last autovacuum {last} ({t.autovacuum_count} in all), last VACUUM {manual}",
            f"  table options: {', '.join(t.options) or 'none (the server defaults)'}",
        ]
    out.append("server: " + ", ".join(f"{s.name}={s.value}" for s in health.settings))
    out.append(_served_line(cover))
    if not findings:
        out.append("ok: nothing holds vacuum back; every pending job type is served")
    for i, f in enumerate(findings, 1):
        out += [f"{i}. {f.what}", f"   what to do: {f.action}"]
    return out


def _json(health: Health, findings: list[Finding]) -> dict[str, object]:
    return {
        "ok": not findings,
        "findings": [dataclasses.asdict(f) for f in findings],
        **dataclasses.asdict(health),
    }
