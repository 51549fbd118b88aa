"""Vacuum health: from what db/health.py reads, the findings that need someone to act, each
naming its cause and what to do. `doctor` prints them (admin/doctor.py), the supervisor
exports them as gauges, the dashboard shows them as a banner. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass

from pgq_supervisor.db.health import Backend, Health, JobTable, Prepared, Slot

# 5 minutes: the held snapshot took claim p99 from 22 ms to 450 ms in that time
MAX_TRANSACTION_AGE = 300.0
# transactions an active slot's xmin (a standby's hot_standby_feedback) may lag before it counts:
# PostgreSQL cannot tell when an xid began, and a healthy standby's feedback always holds some
# xmin, a few transactions behind; about the 5 minutes above at ~300 transactions/s
MAX_XMIN_AGE = 100_000
# dead row versions past which the job table needs a vacuum: autovacuum's own default trigger
# (20 % of the live rows) with a floor, so a small table is not flagged for a few hundred
DEAD_FLOOR = 10_000
DEAD_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class Finding:
    what: str  # the cause, named
    action: str  # what to do about it


def diagnose(
    health: Health,
    schema: str,
    *,
    max_age: float = MAX_TRANSACTION_AGE,
    max_xmin_age: int = MAX_XMIN_AGE,
) -> list[Finding]:
    """What needs action: sessions and prepared transactions older than `max_age` seconds that
    hold the horizon; replication slots that sit inactive, and active slots and walsenders whose
    xmin is `max_xmin_age` transactions behind or more; a job table whose dead tuples outgrew
    what autovacuum lets pass; autovacuum turned off."""
    found = [_backend(b) for b in health.backends if _backend_holds(b, max_age, max_xmin_age)]
    found += [_slot(s) for s in health.slots if _slot_holds(s, max_xmin_age)]
    found += [_prepared(p) for p in health.prepared if p.age >= max_age]
    settings = {s.name: s.value for s in health.settings}
    if settings.get("autovacuum") == "off":
        found.append(
            Finding(
                "autovacuum is off on this server",
                "turn it on (ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf())",
            )
        )
    table = health.table
    if table is not None and table.dead_tuples > max(DEAD_FLOOR, DEAD_SHARE * table.live_tuples):
        held = "; first end what holds the horizon (above)" if found else ""
        found.append(
            Finding(
                f"the job table has {table.dead_tuples:,} dead row versions"
                f" ({table.live_tuples:,} live, {mib(table.total_bytes)} with its indexes),"
                f" last vacuumed {_when(table)}",
                f"VACUUM (VERBOSE) {schema}.job{held}; if autovacuum falls behind again,"
                f" ALTER TABLE {schema}.job SET (autovacuum_vacuum_cost_delay = 0)",
            )
        )
    return found


def oldest_transaction(health: Health) -> float:
    """Seconds the oldest horizon-holding transaction has been open (0: none)."""
    ages = [b.transaction_age for b in health.backends if b.transaction_age is not None]
    ages += [p.age for p in health.prepared]
    return max(ages, default=0.0)


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _backend_holds(b: Backend, max_age: float, max_xmin_age: int) -> bool:
    """A transaction counts by how long it has been open; an xmin held outside any (a
    walsender's hot_standby_feedback without a slot) by how far behind it is, as a slot's."""
    if b.transaction_age is None:
        return b.xmin_age >= max_xmin_age
    return b.transaction_age >= max_age


def _backend(b: Backend) -> Finding:
    if b.transaction_age is None:
        return Finding(
            f"{b.backend_type or 'backend'} pid {b.pid} (user {b.user_name or '?'}, application"
            f" {b.application_name or '-'!r}) holds the xmin horizon {b.xmin_age:,} transactions"
            " behind, outside any transaction: a standby's hot_standby_feedback (no slot)"
            " for queries it runs",
            "end the standby's long queries (or bound them with statement_timeout there), or turn"
            " hot_standby_feedback off on it; terminating this walsender only lasts until the"
            " standby reconnects",
        )
    query = " ".join(b.query.split())
    return Finding(
        f"session pid {b.pid} (user {b.user_name or '?'},"
        f" application {b.application_name or '-'!r}, {b.state or 'unknown state'}) has held"
        f" a transaction open for {duration(b.transaction_age)} ({b.xmin_age:,} transactions"
        f" behind): vacuum keeps every row version it might see; its query: {query[:120]!r}",
        f"end it: SELECT pg_terminate_backend({b.pid}); and bound such sessions with"
        " idle_in_transaction_session_timeout (and a statement timeout for reports)",
    )


def _slot_holds(s: Slot, max_xmin_age: int) -> bool:
    """An inactive slot keeps WAL (and any xmin) for a consumer that may never come back; an
    active one only when its consumer holds the horizon far behind."""
    return not s.active or (s.xmin_age is not None and s.xmin_age >= max_xmin_age)


def _slot(s: Slot) -> Finding:
    holds = []
    if s.xmin_age is not None:
        holds.append(f"the xmin horizon of every database ({s.xmin_age:,} transactions)")
    if s.catalog_xmin_age is not None:
        holds.append(f"the catalogs' horizon ({s.catalog_xmin_age:,} transactions)")
    if s.retained_bytes is not None:
        holds.append(f"{mib(s.retained_bytes)} of WAL")
    state = "active" if s.active else "inactive"
    return Finding(
        f"replication slot {s.name!r} ({s.slot_type}, {state}) holds"
        f" {', '.join(holds) or 'WAL from its restart point'}",
        f"if its standby or consumer is gone: SELECT pg_drop_replication_slot({s.name!r})"
        + ("" if s.active else "; else bring that consumer back"),
    )


def _prepared(p: Prepared) -> Finding:
    return Finding(
        f"prepared transaction {p.gid!r} (owner {p.owner}, database {p.database}) has waited"
        f" {duration(p.age)} ({p.xmin_age:,} transactions behind)",
        f"finish it: COMMIT PREPARED {p.gid!r} or ROLLBACK PREPARED {p.gid!r}",
    )


def _when(table: JobTable) -> str:
    last = max((t for t in (table.last_vacuum, table.last_autovacuum) if t), default=None)
    return "never" if last is None else last.isoformat(timespec="seconds")
