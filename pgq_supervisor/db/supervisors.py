"""Registered supervisors (schema/0010): each upserts its row on a timer and deletes it on a
clean exit; the dashboard's Workers page and the `workers` command read them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg.rows import scalar_row

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.params import (
    GoneParams,
    OrphansParams,
    SupervisorIdParams,
    SupervisorRegisterParams,
    dump_json,
)
from pgq_supervisor.jobs import EndedAttempt, JsonValue


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
    locked: bool = False,
) -> None:
    """Insert or refresh this supervisor's row (and drop rows unseen for an hour). `locked`:
    it holds its session lock (take_supervisor_lock), so its death can be told at once."""
    params: SupervisorRegisterParams = {
        "id": id,
        "host": host,
        "pid": pid,
        "procs": procs,
        "types": list(types),
        "started_at": started_at,
        "children": dump_json(children, "children"),
        "locked": locked,
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


def take_supervisor_lock(conn: Conn, schema: str, id: str) -> bool:
    """Take supervisor `id`'s session-level lock on `conn` (schema/0017): held until the
    session ends. False if another session holds it."""
    params: SupervisorIdParams = {"id": id}
    with wrapped(), cursor(conn, scalar_row) as cur:
        taken = cur.execute(statement("supervisor_lock", schema), params).fetchone()
    return bool(taken)


def supervisors_gone(conn: Conn, schema: str, *, me: str, grace: float) -> list[str]:
    """The ids of the other supervisors whose session lock was freed (see queries.sql)."""
    params: GoneParams = {"id": me, "grace": grace}
    with wrapped(), cursor(conn, scalar_row) as cur:
        return [str(i) for i in cur.execute(statement("supervisors_gone", schema), params)]


def rescue_orphans(conn: Conn, schema: str, ids: Sequence[str]) -> list[EndedAttempt]:
    """End the running jobs of the gone supervisors `ids` as worker deaths and delete their
    rows; a supervisor that holds its lock again is left alone."""
    params: OrphansParams = {
        "ids": list(ids),
        "error": "worker died: its supervisor's database session ended",
    }
    with wrapped(), cursor(conn, rows.ENDED_ATTEMPT) as cur:
        return cur.execute(statement("rescue_orphans", schema), params).fetchall()
