"""A pytest plugin for users' own suites (loaded through the `pytest11` entry point).

Fixtures only: no autouse fixture, no hook that changes collection or reporting.
- `pgq_dsn` (session): the database the fixtures use, from `$PGQ_TEST_DSN` or the `pgq_dsn`
  ini option.
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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI, f"DSN of the database the pgq_* fixtures use (or ${DSN_ENV})")


@pytest.fixture(scope="session")
def pgq_dsn(pytestconfig: pytest.Config) -> str:
    """The DSN of the database the pgq fixtures use."""
    ini = pytestconfig.getini(INI)
    dsn = os.environ.get(DSN_ENV) or (ini if isinstance(ini, str) else "")
    if not dsn:
        pytest.fail(
            f"the pgq fixtures need a database: set ${DSN_ENV} or the {INI} ini option",
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
