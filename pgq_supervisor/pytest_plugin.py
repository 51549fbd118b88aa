"""A pytest plugin for users' own suites (loaded through the `pytest11` entry point).

Fixtures only: no autouse fixture, no hook that changes collection or reporting.
- `pgq_dsn` (session): the database the fixtures use, from `$PGQ_TEST_DSN`, else the
  `pgq_dsn` ini option, else `$PGQ_DSN` (the application's own database: the fixtures only
  create and drop schemas of their own in it).
- `pgq_schema`: a fresh schema with the queue migrated into it, for this test alone; the test
  runs with `$PGQ_SCHEMA` naming it (so every call without `schema=` uses it, and so does a
  supervisor started from the test), and it is dropped after.
- `pgq_conn`: an autocommit psycopg connection to `pgq_dsn`, with `pgq_schema` ready.

Run the jobs a test enqueued with `pgq_supervisor.testing.drain` (or `drain_async` inside an
event loop: pytest-asyncio, anyio).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from pgq_supervisor import db
from pgq_supervisor import schema as migrations

DSN_ENV = "PGQ_TEST_DSN"
INI = "pgq_dsn"
APP_DSN_ENV = "PGQ_DSN"  # the fallback: what the application and the supervisor use


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        INI, f"DSN of the database the pgq_* fixtures use (${DSN_ENV} wins; else ${APP_DSN_ENV})"
    )


@pytest.fixture(scope="session")
def pgq_dsn(pytestconfig: pytest.Config) -> str:
    """The DSN of the database the pgq fixtures use: $PGQ_TEST_DSN, the ini option, $PGQ_DSN."""
    ini = pytestconfig.getini(INI)
    dsn = (
        os.environ.get(DSN_ENV)
        or (ini if isinstance(ini, str) else "")
        or os.environ.get(APP_DSN_ENV)
    )
    if not dsn:
        pytest.fail(
            f"the pgq fixtures need a database: set ${DSN_ENV}, the {INI} ini option"
            f" or ${APP_DSN_ENV}",
            pytrace=False,
        )
    return dsn


@pytest.fixture
def pgq_schema(pgq_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, migrated schema for this test; $PGQ_SCHEMA names it during the test."""
    name = f"pgq_test_{uuid.uuid4().hex[:12]}"
    with db.connect(pgq_dsn, application_name="pgq_pytest") as conn:
        migrations.migrate(conn, name)
    monkeypatch.setenv("PGQ_SCHEMA", name)
    try:
        yield name
    finally:
        with db.connect(pgq_dsn, application_name="pgq_pytest") as conn:
            migrations.drop(conn, name)


@pytest.fixture
def pgq_conn(pgq_dsn: str, pgq_schema: str) -> Iterator[db.Conn]:
    """An autocommit connection to `pgq_dsn`; the queue's calls on it use `pgq_schema`."""
    with db.connect(pgq_dsn, application_name="pgq_pytest") as conn:
        yield conn
