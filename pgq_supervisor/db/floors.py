"""Claim floors (schema/0022): while vacuum's horizon is held back, claims start past the
entries of the jobs claimed since, which no scan can skip cheaply then. The supervisor's
`claim-floor` service (supervisor/maintenance/floors.py) keeps them; claim_pick_rows reads them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from psycopg.rows import scalar_row

from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped


class NoFloorParams(TypedDict):
    pass


class FloorTypesParams(TypedDict):
    types: list[str]


class FloorRefreshParams(TypedDict):
    types: list[str]
    full: bool


FLOOR_PARAMS: dict[str, type] = {
    "horizon_held": NoFloorParams,
    "claim_floor_refresh": FloorRefreshParams,
    "claim_floor_clear": FloorTypesParams,
}


def horizon_held(conn: Conn, schema: str) -> float:
    """Seconds the oldest snapshot of another session of this database has been held (0:
    none)."""
    params: NoFloorParams = {}
    with wrapped(), cursor(conn, scalar_row) as cur:
        row = cur.execute(statement("horizon_held", schema), params).fetchone()
    return float(row) if isinstance(row, float | int) else 0.0


def refresh_floors(conn: Conn, schema: str, types: Sequence[str], *, full: bool) -> int:
    """Walk the types' claim order past their dead prefix and record where each level's first
    ready job is; `full`: from the start of the index. Returns the types walked."""
    params: FloorRefreshParams = {"types": list(types), "full": full}
    with wrapped(), cursor(conn, scalar_row) as cur:
        row = cur.execute(statement("claim_floor_refresh", schema), params).fetchone()
    return row if isinstance(row, int) else 0


def clear_floors(conn: Conn, schema: str, types: Sequence[str]) -> int:
    """Drop the types' floors; returns how many there were."""
    params: FloorTypesParams = {"types": list(types)}
    with wrapped(), cursor(conn, scalar_row) as cur:
        row = cur.execute(statement("claim_floor_clear", schema), params).fetchone()
    return row if isinstance(row, int) else 0
