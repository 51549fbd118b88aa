"""The connection budget's arithmetic (supervisor/budget.py): what a supervisor needs, what the
server, the role and the database leave it, and what each policy does when it does not fit."""

from __future__ import annotations

import dataclasses

import pytest

from pgq_supervisor.db import ConnectionLimits
from pgq_supervisor.errors import ConfigError, ConnectionShortage
from pgq_supervisor.registry import Registry
from pgq_supervisor.supervisor.budget import Fit, Need, fit, need, room

# the server: max_connections = 20, 3 reserved for superusers, the app's role limited
# to 16, nobody else connected
SMALL = ConnectionLimits(
    role="app", database="appdb", max_connections=20, superuser_reserved=3, reserved=0,
    superuser=False, may_use_reserved=False, role_limit=16, database_limit=-1,
    server_used=0, role_used=0, database_used=0,
)  # fmt: skip


def test_a_child_needs_its_job_and_heartbeat_connections_and_its_pools() -> None:
    registry = Registry()

    @registry.handler("plain")
    def plain(payload: dict[str, int]) -> None: ...

    @registry.handler("with_conn", concurrency=3)
    def with_conn(payload: dict[str, int], conn: object) -> None: ...

    @registry.handler("async_conn")
    async def async_conn(payload: dict[str, int], conn: object) -> None: ...

    assert need(registry, ["plain"], 16, 1, None).total == 34  # + LISTEN and control
    # one at a time, a `conn` handler runs on the job connection
    assert need(registry, ["plain", "with_conn"], 1, 1, None).per_child() == 2
    # in flight: an async pool (the child's 8) and a sync one for with_conn (its own cap, 3)
    mixed = need(registry, ["plain", "with_conn", "async_conn"], 2, 8, None)
    assert mixed.pools == (8, 3) and mixed.per_child() == 2 + 8 + 3
    assert need(registry, ["async_conn"], 1, 1, None).per_child() == 2 + 1  # async: the loop
    assert need(registry, ["plain", "with_conn", "async_conn"], 2, 8, 2).per_child() == 2 + 2 + 2


def test_room_is_the_tightest_limit_less_what_is_used_and_the_headroom() -> None:
    assert room(SMALL, 0).free == 16  # the role's limit binds before the server's 17
    busy = dataclasses.replace(SMALL, server_used=6, role_used=2)
    r = room(busy, 4)
    assert (r.free, r.most) == (20 - 3 - 6 - 4, 16 - 4)
    assert "max_connections 20 less 3 reserved" in r.why and "6 in use" in r.why
    # PostgreSQL 16+: reserved_connections too, unless the role may use them
    pg16 = dataclasses.replace(SMALL, reserved=5, role_limit=-1)
    assert room(pg16, 0).free == 12
    assert room(dataclasses.replace(pg16, may_use_reserved=True), 0).free == 17
    # a superuser passes the role's and database's limits and may use every slot
    su = dataclasses.replace(SMALL, superuser=True, database_limit=2, server_used=5)
    assert room(su, 0).free == 15
    db_bound = dataclasses.replace(SMALL, database_limit=8, database_used=3)
    assert (
        room(db_bound, 0).free == 5
        and "database appdb's connection limit 8" in room(db_bound, 0).why
    )


def test_shrink_runs_the_children_that_fit_with_a_warning() -> None:
    fitted = fit(Need(procs=16, pools=()), room(SMALL, 4), "shrink")
    assert fitted.procs == 5  # 16 - 4 headroom - 2 of its own = 10: 5 children
    assert fitted.warning is not None and "16 procs need 34 connections" in fitted.warning
    assert "running 5 procs" in fitted.warning
    assert fit(Need(procs=5, pools=()), room(SMALL, 4), "shrink") == Fit(5, None, None)


def test_shrink_caps_the_pools_before_it_runs_fewer_children() -> None:
    """The pools open on demand: the children's own connections come first."""
    fitted = fit(Need(procs=2, pools=(100, 100)), room(SMALL, 0), "shrink")
    # 16 - 2 = 14 for 2 children: 2 each of their own, 5 for the pools: 2 apiece
    assert (fitted.procs, fitted.pool_size) == (2, 2)
    assert fitted.warning is not None and "capped at 2 connections" in fitted.warning
    assert "running" not in fitted.warning
    # one connection per pool at least: then fewer children
    assert fit(Need(procs=4, pools=(10, 10)), room(SMALL, 0), "shrink").procs == 3
    # the user's own cap stays when it fits
    assert fit(Need(procs=2, pools=(100,), pool_size=3), room(SMALL, 0), "shrink") == Fit(
        2, 3, None
    )


def test_refuse_exits_2_when_the_limits_never_fit_and_1_when_only_usage_is_in_the_way() -> None:
    big = Need(procs=16, pools=())
    with pytest.raises(ConfigError, match=r"^invalid setting procs: 16 procs need 34") as exc:
        fit(big, room(SMALL, 4), "refuse")
    assert "at most 12 fit (role app's connection limit 16, connection_headroom 4)" in str(
        exc.value
    )
    crowded = dataclasses.replace(SMALL, server_used=12, role_used=12)
    with pytest.raises(ConnectionShortage, match="not enough free connections"):
        fit(Need(procs=5, pools=()), room(crowded, 4), "refuse")
    # shrink too, when not one child fits
    with pytest.raises(ConnectionShortage):
        fit(big, room(crowded, 4), "shrink")
    with pytest.raises(ConfigError):
        fit(big, room(SMALL, 13), "shrink")


def test_off_checks_nothing() -> None:
    assert fit(Need(procs=16, pools=()), room(SMALL, 4), "off") == Fit(16, None, None)
