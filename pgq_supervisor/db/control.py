"""Pauses, rates, concurrency limits and tenant weights of job types: what the claim
(schema/0007, 0008, 0020) reads to hold jobs back or share them out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from psycopg.rows import scalar_row, tuple_row

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.params import (
    PauseParams,
    SyncLimitsParams,
    SyncRatesParams,
    TenantWeightParams,
    TypeParams,
    TypesParams,
)
from pgq_supervisor.db.plans import Plan, Twin, execute, fetch_one


@Twin
def pause(
    schema: str, type_: str, *, paused_by: str | None, reason: str | None
) -> Plan[datetime | None]:
    """Pause `type_`; returns when, or None if it was paused already (then nothing changes)."""
    params: PauseParams = {"type": type_, "paused_by": paused_by, "reason": reason}
    with wrapped():
        paused_at: datetime | None = yield from fetch_one(
            statement("pause_type", schema), params, scalar_row
        )
    return paused_at


@Twin
def set_tenant_weight(schema: str, type_: str, tenant: str, weight: int) -> Plan[None]:
    params: TenantWeightParams = {"type": type_, "tenant": tenant, "weight": weight}
    with wrapped():
        yield from execute(statement("set_tenant_weight", schema), params)


@Twin
def resume(schema: str, type_: str) -> Plan[bool]:
    """Resume `type_` and wake its workers (on commit); False if it was not paused."""
    params: TypeParams = {"type": type_}
    with wrapped():
        row = yield from fetch_one(statement("resume_type", schema), params, tuple_row)
    return row is not None


def type_controls(conn: Conn, schema: str) -> list[rows.TypeControl]:
    """Every paused or rate-limited type, by name."""
    with wrapped(), cursor(conn, rows.TYPE_CONTROL) as cur:
        return cur.execute(statement("type_controls", schema)).fetchall()


def sync_rates(
    conn: Conn, schema: str, served: Sequence[str], rates: Mapping[str, tuple[int, float]]
) -> None:
    """Store the rates (type -> (max starts, period in seconds)) of the `served` types; a
    served type without one loses the rate it had."""
    rated = sorted(rates)
    params: SyncRatesParams = {
        "served": list(served),
        "rated": rated,
        "max_starts": [rates[t][0] for t in rated],
        "periods": [rates[t][1] for t in rated],
    }
    with wrapped():
        conn.execute(statement("sync_rates", schema), params)


def rate_next_due(conn: Conn, schema: str, types: Sequence[str]) -> float | None:
    """Seconds until a start frees up for a rated type of `types` whose window is full now
    (None: no such type)."""
    params: TypesParams = {"types": list(types)}
    with wrapped(), cursor(conn, scalar_row) as cur:
        seconds: float | None = cur.execute(statement("rate_next_due", schema), params).fetchone()
    return None if seconds is None else float(seconds)


def sync_limits(
    conn: Conn,
    schema: str,
    served: Sequence[str],
    limits: Mapping[str, tuple[int | None, int | None]],
) -> None:
    """Store the concurrency limits (type -> (global, per key), None: no such limit) of the
    `served` types; a served type without one loses the limits it had."""
    limited = sorted(limits)
    params: SyncLimitsParams = {
        "served": list(served),
        "limited": limited,
        "global_concurrencies": [limits[t][0] for t in limited],
        "key_concurrencies": [limits[t][1] for t in limited],
    }
    with wrapped():
        conn.execute(statement("sync_limits", schema), params)


def type_limits(conn: Conn, schema: str) -> list[rows.TypeLimit]:
    """Every type with a concurrency limit, by name, with its running and held-back jobs."""
    with wrapped(), cursor(conn, rows.TYPE_LIMIT) as cur:
        return cur.execute(statement("type_limits", schema)).fetchall()
