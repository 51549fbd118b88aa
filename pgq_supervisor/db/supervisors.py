"""Registered supervisors (schema/0010): each upserts its row on a timer and deletes it on a
clean exit; the dashboard's Workers page and the `workers` command read them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.params import SupervisorIdParams, SupervisorRegisterParams, dump_json
from pgq_supervisor.jobs import JsonValue


def register_supervisor(
    conn: Conn,
    schema: str,
    *,
    id: str,
    host: str,
    pid: int,
    procs: int,
    types: Sequence[str],
    started_at: datetime,
    children: list[JsonValue],
) -> None:
    """Insert or refresh this supervisor's row (and drop rows unseen for an hour)."""
    params: SupervisorRegisterParams = {
        "id": id,
        "host": host,
        "pid": pid,
        "procs": procs,
        "types": list(types),
        "started_at": started_at,
        "children": dump_json(children, "children"),
    }
    with wrapped():
        conn.execute(statement("supervisor_register", schema), params)


def unregister_supervisor(conn: Conn, schema: str, id: str) -> None:
    params: SupervisorIdParams = {"id": id}
    with wrapped():
        conn.execute(statement("supervisor_unregister", schema), params)


def list_supervisors(conn: Conn, schema: str) -> list[rows.SupervisorRecord]:
    with wrapped(), cursor(conn, rows.SUPERVISOR_RECORD) as cur:
        return cur.execute(statement("supervisors_list", schema)).fetchall()
