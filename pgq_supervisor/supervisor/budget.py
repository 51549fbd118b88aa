"""The connection budget, judged once at start, before any child is spawned.

A supervisor opens 2 connections of its own (LISTEN and control) and, per child, its job
connection and its heartbeat's, plus the pools of a child that runs many jobs at once and
serves handlers that take `conn` (worker/inflight.py). Each is counted against what the
database lets this role open now: max_connections less the slots reserved from it, the role's
and the database's connection limits, less what is in use, less `connection_headroom` (the
slots the application must find free). What does not fit fails later, and badly: children
that cannot open their heartbeat connection, a control connection that cannot settle a dead
child's jobs, the application's own connections refused (issue 27).

When it does not fit, `connection_budget` decides: `shrink` (the default) caps the pools (to
one connection each at least), then runs as many children as fit, with a WARNING; `refuse`
exits; `off` checks nothing (behind PgBouncer, whose pool is the budget). Exits are one line:
2 (a configuration error) when the limits could never hold it, whoever else is connected; 1
when only the connections in use now leave too little (as for a database that cannot be
reached: trying later may work). Nothing here
does I/O: the limits are read by db.connection_limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pgq_supervisor.db import ConnectionLimits
from pgq_supervisor.display import plural
from pgq_supervisor.errors import ConfigError, ConnectionShortage
from pgq_supervisor.registry import Registry
from pgq_supervisor.worker.inflight import pool_size

SUPERVISOR_OWN = 2  # its LISTEN connection and its control connection
Policy = Literal["shrink", "refuse", "off"]


def need(
    registry: Registry, types: Sequence[str], procs: int, concurrency: int, pool_cap: int | None
) -> Need:
    """What `procs` children serving `types` open at most: each its job and heartbeat
    connections, and, in the in-flight loop, a pool per kind of handler that takes `conn`
    (async, or sync in threads), `pool_cap` connections at most each."""
    uses_loop = concurrency > 1 or any(
        (h := registry.handlers.get(t)) is not None and h.is_async for t in types
    )
    pools = (
        [pool_size(registry, types, concurrency, a) for a in (True, False)] if uses_loop else []
    )  # without the loop a `conn` handler runs on the job connection
    return Need(procs, tuple(p for p in pools if p), pool_cap)


@dataclass(frozen=True, slots=True)
class Need:
    procs: int
    pools: tuple[int, ...]  # a child's pools' sizes, uncapped
    pool_size: int | None = None  # the cap of each (child_pool_size)

    def per_child(self, cap: int | None = None) -> int:
        cap = cap or self.pool_size
        return 2 + sum(p if cap is None else min(p, cap) for p in self.pools)

    def of(self, procs: int, cap: int | None = None) -> int:
        return SUPERVISOR_OWN + procs * self.per_child(cap)

    @property
    def total(self) -> int:
        return self.of(self.procs)

    def describe(self) -> str:
        return (
            f"{plural(self.procs, 'proc')} need {plural(self.total, 'connection')}"
            f" ({SUPERVISOR_OWN} + {self.per_child()} per child)"
        )


@dataclass(frozen=True, slots=True)
class Fit:
    procs: int
    pool_size: int | None  # each pool's cap (child_pool_size), lowered if need be
    warning: str | None  # what was cut, for a WARNING


@dataclass(frozen=True, slots=True)
class Room:
    """Connections this supervisor may open, headroom left: `free` now, `most` if nobody else
    were connected; `why` and `most_why` name the limit that binds for each."""

    free: int
    most: int
    why: str
    most_why: str


def room(limits: ConnectionLimits, headroom: int) -> Room:
    """The tightest of the server's, the role's and the database's limits (a superuser passes
    the last two and may use the reserved slots)."""
    lim = limits
    reserved = 0
    if not lim.superuser:
        reserved = lim.superuser_reserved + (0 if lim.may_use_reserved else lim.reserved)
    server = f"max_connections {lim.max_connections}"
    if reserved:
        server += f" less {reserved} reserved"
    # (limit, in use, what it is)
    bounds = [(lim.max_connections - reserved, lim.server_used, server)]
    if not lim.superuser and lim.role_limit >= 0:
        bounds.append((lim.role_limit, lim.role_used, f"role {lim.role}'s connection limit"))
    if not lim.superuser and lim.database_limit >= 0:
        bounds.append(
            (lim.database_limit, lim.database_used, f"database {lim.database}'s connection limit")
        )

    def named(limit: int, what: str) -> str:
        return f"{what} {limit}" if "limit" in what else what

    limit, used, what = min(bounds, key=lambda b: b[0] - b[1])
    most, _, most_what = min(bounds, key=lambda b: b[0])
    return Room(
        free=limit - used - headroom,
        most=most - headroom,
        why=f"{named(limit, what)}, {used} in use, connection_headroom {headroom}",
        most_why=f"{named(most, most_what)}, connection_headroom {headroom}",
    )


def fit(need: Need, room: Room, policy: Policy) -> Fit:
    """How many children to run, and each pool's cap, with the WARNING to log if less than
    asked. `shrink` keeps the children first (their job and heartbeat connections are always
    open) and caps the pools (opened on demand; a job beyond them waits for a connection),
    at one connection each at least. Raises ConfigError (exit 2) when the limits could never
    hold even one child, or all that was asked under `refuse`; ConnectionShortage (exit 1)
    when only the connections in use now leave too little."""
    if policy == "off" or need.total <= room.free:
        return Fit(need.procs, need.pool_size, None)
    least = 2 + len(need.pools)  # a child, one connection per pool
    procs = min(need.procs, (room.free - SUPERVISOR_OWN) // least)
    advice = "lower procs or connection_headroom, or raise the limit (docs/connections.md)"
    if policy == "refuse" or procs < 1:
        if (need.total if policy == "refuse" else SUPERVISOR_OWN + least) > room.most:
            raise ConfigError(
                f"invalid setting procs: {need.describe()}, but at most {max(0, room.most)} fit"
                f" ({room.most_why}): {advice}"
            )
        raise ConnectionShortage(
            f"not enough free connections: {need.describe()}, {_are_free(room.free)}"
            f" ({room.why}); connection_budget={policy}"
        )
    cap = need.pool_size
    cut = [] if procs == need.procs else [f"running {plural(procs, 'proc')}"]
    if need.pools:
        for_pools = (room.free - SUPERVISOR_OWN) // procs - 2
        cap = max(p for p in need.pools)
        while need.per_child(cap) - 2 > for_pools:
            cap -= 1
        cap = min(cap, need.pool_size or cap)
        if need.per_child(cap) < need.per_child():
            cut.append(
                f"each pool of a child capped at {plural(cap, 'connection')} (child_pool_size)"
            )
    warning = (
        f"connection budget: {need.describe()}, {_are_free(room.free)} ({room.why}):"
        f" {', '.join(cut)} (connection_budget=refuse would exit instead)"
    )
    return Fit(procs, cap, warning)


def _are_free(n: int) -> str:
    n = max(0, n)
    return f"{n} {'is' if n == 1 else 'are'} free"
