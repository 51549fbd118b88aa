"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict


@pytest.fixture
def gate(server_dsn: str, dsn: str) -> Iterator[Callable[[bool], None]]:
    """gate(False): the test database refuses new connections and the sessions of the queue's
    processes (application_name pgq-*: a worker's job and heartbeat connections) are ended, as
    in a restart that lasts; gate(True) lets connections in again (and so does the teardown)."""
    dbname = str(conninfo_to_dict(dsn)["dbname"])

    def set_open(open_: bool) -> None:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                    sql.Identifier(dbname), sql.SQL("true" if open_ else "false")
                )
            )
            if not open_:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND application_name LIKE 'pgq-%%'",
                    (dbname,),
                )

    yield set_open
    set_open(True)
