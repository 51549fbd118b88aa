"""connection_limits on the real server, read by a role that is not a superuser: it sees its
own limit and counts other sessions it may not look into (supervisor/budget.py judges them)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgq_supervisor import db
from pgq_supervisor.db import Conn


@pytest.fixture
def limited_role(conn: Conn) -> Iterator[str]:
    name = f"pgq_r_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 7").format(sql.Identifier(name)))
    yield name
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_role_sees_its_limit_and_every_session_but_its_own(
    conn: Conn, dsn: str, limited_role: str
) -> None:
    as_role = make_conninfo(dsn, user=limited_role)
    with psycopg.connect(as_role) as a, psycopg.connect(as_role) as b, db.connect(as_role) as me:
        limits = db.connection_limits(me, "pgq")
        assert (limits.role, limits.superuser, limits.role_limit) == (limited_role, False, 7)
        assert limits.role_used == 2  # a and b; not this session
        # the test's own superuser session is another role's: counted though its kind is hidden
        assert limits.database_used >= 3 and limits.server_used >= limits.database_used
        row = conn.execute(
            "SELECT current_setting('max_connections')::int,"
            " current_setting('superuser_reserved_connections')::int,"
            " coalesce(current_setting('reserved_connections', true)::int, 0)"
        ).fetchone()
        assert row == (limits.max_connections, limits.superuser_reserved, limits.reserved)
        assert a.closed is b.closed is False
    mine = db.connection_limits(conn, "pgq")
    assert mine.superuser and mine.database_limit == -1
