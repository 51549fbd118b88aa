"""The `pause TYPE` and `resume TYPE` commands, and the paused types that `status` shows.

Both are idempotent: pausing a paused type or resuming a type that is not paused changes
nothing, says so, and exits 0. An invalid type name exits 2 (argparse, through admin/__init__.py).
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
from collections.abc import Sequence

from pgq_supervisor import db, manage
from pgq_supervisor.connect import open_db
from pgq_supervisor.jobs import JsonValue
from pgq_supervisor.settings import Settings


def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    type_: str = args.type
    _, conn = open_db(settings)
    with conn:
        changed = manage.pause(
            conn, type_, reason=args.reason, by=_who(), schema=settings.db_schema
        )
        control = _control_of(db.type_controls(conn, settings.db_schema), type_)
    since = None if control is None or control.paused_at is None else control.paused_at
    if args.json:
        print(
            json.dumps(
                {
                    "type": type_,
                    "paused": True,
                    "changed": changed,
                    "paused_at": since.isoformat() if since else None,
                }
            )
        )
    elif changed:
        print(f"paused {type_}: no supervisor claims its jobs until `resume {type_}`")
    else:
        when = f" (since {since:%Y-%m-%d %H:%M:%S %Z})" if since else ""
        print(f"{type_} was already paused{when}: nothing changed")
    return 0


def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    type_: str = args.type
    _, conn = open_db(settings)
    with conn:
        changed = manage.resume(conn, type_, schema=settings.db_schema)
    if args.json:
        print(json.dumps({"type": type_, "paused": False, "changed": changed}))
    elif changed:
        print(f"resumed {type_}")
    else:
        print(f"{type_} was not paused: nothing to resume")
    return 0


def paused_json(controls: Sequence[db.TypeControl]) -> list[JsonValue]:
    return [
        {
            "type": c.type,
            "paused_at": c.paused_at.isoformat(),
            "paused_by": c.paused_by,
            "reason": c.reason,
        }
        for c in controls
        if c.paused_at is not None
    ]


def paused_lines(controls: Sequence[db.TypeControl]) -> list[str]:
    """One line per paused type, for `status`."""
    return [
        f"paused: {c.type} since {c.paused_at:%Y-%m-%d %H:%M:%S %Z}"
        + (f" by {c.paused_by}" if c.paused_by else "")
        + (f": {c.reason}" if c.reason else "")
        for c in controls
        if c.paused_at is not None
    ]


def limits_json(limits: Sequence[db.TypeLimit]) -> list[JsonValue]:
    return [
        {
            "type": lim.type,
            "global_concurrency": lim.global_concurrency,
            "key_concurrency": lim.key_concurrency,
            "running": lim.running,
            "held_back": {
                "global_concurrency": lim.held_by_global,
                "key_concurrency": lim.key_held,
            },
        }
        for lim in limits
    ]


def limits_lines(limits: Sequence[db.TypeLimit]) -> list[str]:
    """One line per type with a concurrency limit, for `status`."""
    out = []
    for lim in limits:
        parts = []
        if lim.global_concurrency is not None:
            parts.append(f"global_concurrency={lim.global_concurrency}")
        if lim.key_concurrency is not None:
            parts.append(f"key_concurrency={lim.key_concurrency}")
        held = lim.held_by_global + lim.key_held
        out.append(
            f"limited: {lim.type} {' '.join(parts)}, {lim.running} running"
            + (f", {held} held back" if held else "")
        )
    return out


def _control_of(controls: Sequence[db.TypeControl], type_: str) -> db.TypeControl | None:
    return next((c for c in controls if c.type == type_), None)


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()} (cli)"
