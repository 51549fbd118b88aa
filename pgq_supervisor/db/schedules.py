"""Periodic schedules: declare them, read where they stand, enqueue a tick exactly once."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from psycopg.rows import scalar_row

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.params import (
    NoParams,
    ScheduleDeclareParams,
    ScheduleEnqueueParams,
    ScheduleNamesParams,
    dump_json,
    new_id,
)
from pgq_supervisor.jobs import JobId
from pgq_supervisor.periodic import Schedule


def declare_schedules(
    conn: Conn, schema: str, schedules: Sequence[Schedule]
) -> list[rows.ScheduleState]:
    """Insert or update the rows of `schedules`; returns where each stands."""
    ordered = sorted(schedules, key=lambda s: s.name)
    params: ScheduleDeclareParams = {
        "names": [s.name for s in ordered],
        "types": [s.type for s in ordered],
        "crons": [s.cron for s in ordered],
        "everys": [s.every for s in ordered],
        "timezones": [s.timezone for s in ordered],
        "priorities": [s.priority for s in ordered],
        "catch_ups": [s.catch_up for s in ordered],
        "payloads": [dump_json(s.payload) for s in ordered],
    }
    with wrapped(), cursor(conn, rows.SCHEDULE_STATE) as cur:
        return cur.execute(statement("schedule_declare", schema), params).fetchall()


def schedule_states(conn: Conn, schema: str, names: Sequence[str]) -> list[rows.ScheduleState]:
    params: ScheduleNamesParams = {"names": list(names)}
    with wrapped(), cursor(conn, rows.SCHEDULE_STATE) as cur:
        return cur.execute(statement("schedule_states", schema), params).fetchall()


def tick_key(name: str, tick: datetime) -> str:
    """The unique_key of a schedule's job for `tick`: `periodic:NAME@2026-05-01T03:00:00+00:00`."""
    return f"periodic:{name}@{tick.astimezone(UTC).isoformat()}"


def enqueue_tick(conn: Conn, schema: str, schedule: Schedule, tick: datetime) -> JobId | None:
    """Enqueue `schedule`'s job for `tick`; None when that tick (or a later one) already was
    (or, never expected, an unfinished job holds the tick's unique_key)."""
    params: ScheduleEnqueueParams = {
        "name": schedule.name,
        "tick": tick,
        "id": new_id(),
        "type": schedule.type,
        "payload": dump_json(schedule.payload),
        "priority": schedule.priority,
        "unique_key": tick_key(schedule.name, tick),
    }
    with wrapped(), cursor(conn, scalar_row) as cur:
        inserted: uuid.UUID | None = cur.execute(
            statement("schedule_enqueue", schema), params
        ).fetchone()
    return None if inserted is None else JobId(inserted)


def list_schedules(conn: Conn, schema: str) -> list[rows.ScheduleRecord]:
    params: NoParams = {}
    with wrapped(), cursor(conn, rows.SCHEDULE_RECORD) as cur:
        return cur.execute(statement("schedules_list", schema), params).fetchall()
