"""The server's connection limits as this session's role sees them, for the supervisor's
connection budget at start (supervisor/budget.py judges them)."""

from __future__ import annotations

import dataclasses

from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.rows import NamedRow


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What bounds the connections this role may open here, and how many are in use (this
    session left out). A limit of -1 is none (rolconnlimit, datconnlimit)."""

    role: str
    database: str
    max_connections: int
    superuser_reserved: int  # superuser_reserved_connections
    reserved: int  # reserved_connections (PostgreSQL 16+; 0 before)
    superuser: bool
    may_use_reserved: bool  # a member of pg_use_reserved_connections
    role_limit: int
    database_limit: int
    server_used: int
    role_used: int
    database_used: int


CONNECTION_LIMITS = NamedRow(ConnectionLimits)


def connection_limits(conn: Conn, schema: str) -> ConnectionLimits:
    with wrapped(), cursor(conn, CONNECTION_LIMITS) as cur:
        row = cur.execute(statement("connection_limits", schema)).fetchone()
    if row is None:  # current_user is always a role and current_database() a database
        raise AssertionError("connection_limits returned no row")
    return row
