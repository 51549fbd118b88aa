"""Test database: PGQ_TEST_DSN, else PostgreSQL on 127.0.0.1:5432, else an embedded server.

A template database is migrated once per session; every test gets a fresh copy of it.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from psycopg.conninfo import make_conninfo

import pgq_supervisor as pgq
from pgq_supervisor.db import Conn

settings.register_profile(
    "ci",
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "deep",
    max_examples=2000,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

LOCAL_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=2"


def _server_dsn(tmp_root: Path) -> str:
    if dsn := os.environ.get("PGQ_TEST_DSN"):
        return dsn
    # PGQ_TEST_EMBEDDED=1 runs the suite on the embedded server even where a local one answers
    if not os.environ.get("PGQ_TEST_EMBEDDED"):
        try:
            psycopg.connect(LOCAL_DSN).close()
            return LOCAL_DSN
        except psycopg.OperationalError:
            pass
    from pgq_supervisor.embedded import start_embedded

    return start_embedded(tmp_root / "pgdata")


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    # a short root: the embedded server's socket path must stay under 108 bytes
    root = Path(tempfile.mkdtemp(prefix="pgqt"))
    return _server_dsn(root)


def _admin(server_dsn: str) -> Conn:
    return psycopg.connect(server_dsn, autocommit=True)


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    name = f"pgq_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with _admin(server_dsn) as admin:
        admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    with psycopg.connect(make_conninfo(server_dsn, dbname=name), autocommit=True) as conn:
        pgq.migrate(conn)
    yield name
    with _admin(server_dsn) as admin:
        admin.execute(
            psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                psycopg.sql.Identifier(name)
            )
        )


@contextmanager
def _migrated_copy(server_dsn: str, template_db: str) -> Iterator[str]:
    name = f"pgq_t_{uuid.uuid4().hex[:12]}"
    ident = psycopg.sql.Identifier(name)
    with _admin(server_dsn) as admin:
        admin.execute(
            psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                ident, psycopg.sql.Identifier(template_db)
            )
        )
    yield make_conninfo(server_dsn, dbname=name)
    with _admin(server_dsn) as admin:
        admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


@pytest.fixture
def dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test alone."""
    with _migrated_copy(server_dsn, template_db) as fresh:
        yield fresh


@pytest.fixture(scope="module")
def module_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one module, whose tests empty what they wrote (for
    modules of many small cases, where a database per test would cost most of their time)."""
    with _migrated_copy(server_dsn, template_db) as fresh:
        yield fresh


@pytest.fixture
def conn(dsn: str) -> Iterator[Conn]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    name = f"pgq_e_{uuid.uuid4().hex[:12]}"
    ident = psycopg.sql.Identifier(name)
    with _admin(server_dsn) as admin:
        admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(ident))
    yield make_conninfo(server_dsn, dbname=name)
    with _admin(server_dsn) as admin:
        admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
