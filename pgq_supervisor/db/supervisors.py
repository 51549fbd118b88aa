"""Registered supervisors (schema/0010): each upserts its row on a timer and deletes it on a
clean exit; the dashboard's Workers page and the `workers` command read them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg.rows import scalar_row

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.params import (
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
    locked_on: str | None = None,
) -> None:
    """Insert or refresh this supervisor's row (and drop rows unseen for an hour). `locked_on`:
    the server epoch in which it holds its session lock (take_supervisor_lock), so its death
    can be told at once; None if it holds none."""
    params: SupervisorRegisterParams = {
        "id": id,
        "host": host,
        "pid": pid,
        "procs": procs,
        "types": list(types),
        "started_at": started_at,
        "children": dump_json(children, "children"),
        "locked_on": locked_on,
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


def take_supervisor_lock(conn: Conn, schema: str, id: str) -> str | None:
    """Take supervisor `id`'s session-level lock on `conn` (schema/0016): held until the
    session ends. Returns the server's epoch, None if another session holds the lock."""
    params: SupervisorIdParams = {"id": id}
    with wrapped(), cursor(conn, scalar_row) as cur:
        epoch = cur.execute(statement("supervisor_lock", schema), params).fetchone()
    return None if epoch is None else str(epoch)


def supervisors_gone(conn: Conn, schema: str, *, me: str) -> list[str]:
    """The ids of the other supervisors whose session lock was freed (see queries.sql)."""
    params: SupervisorIdParams = {"id": me}
    with wrapped(), cursor(conn, scalar_row) as cur:
        return [str(i) for i in cur.execute(statement("supervisors_gone", schema), params)]


def rescue_orphans(
    conn: Conn, schema: str, ids: Sequence[str], *, quiet: float
) -> list[EndedAttempt]:
    """End the running jobs of the gone supervisors `ids` whose heartbeat is older than `quiet`
    seconds as worker deaths, and delete the rows of those with no running job left; a
    supervisor that holds its lock again is left alone."""
    params: OrphansParams = {
        "ids": list(ids),
        "error": "worker died: its supervisor's database session ended",
        "quiet": quiet,
    }
    with wrapped(), cursor(conn, rows.ENDED_ATTEMPT) as cur:
        return cur.execute(statement("rescue_orphans", schema), params).fetchall()
