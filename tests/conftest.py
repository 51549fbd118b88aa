"""Test database: PGQ_TEST_DSN, else PostgreSQL on 127.0.0.1:5432, else an embedded server.

A template database is migrated once per session; every test gets a fresh copy of it.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
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


# Commits in the test databases return before their WAL reaches the disk (a flush measured 0.3 ms
# on this machine idle and 3 ms while another process wrote; the suite commits tens of thousands
# of times). What a commit makes visible, and when, is unchanged; only a crash of the server
# could lose the last ones, and no test crashes the suite's server: the restart and crash tests
# start their own (tests/acceptance/pgserver.py), which keeps PostgreSQL's default. Sessions
# that set synchronous_commit themselves (worker_synchronous_commit) still do.
ASYNC_COMMIT = psycopg.sql.SQL("ALTER DATABASE {} SET synchronous_commit = off")


def _create_copy(admin: Conn, template_db: str) -> str:
    name = f"pgq_t_{uuid.uuid4().hex[:12]}"
    ident = psycopg.sql.Identifier(name)
    admin.execute(
        psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            ident, psycopg.sql.Identifier(template_db)
        )
    )
    admin.execute(ASYNC_COMMIT.format(ident))
    return name


def _drop(admin: Conn, name: str) -> None:
    admin.execute(
        psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            psycopg.sql.Identifier(name)
        )
    )


class _Copies:
    """Fresh migrated copies of the template, each for one test (or module) alone, made one
    ahead by a thread and dropped behind by another: a CREATE DATABASE (about 0.13 s, most of
    it the server writing 8 MB) and a DROP (about 0.05 s) overlap the tests instead of coming
    between them. A copy is never handed out twice, and every one is dropped by the end."""

    def __init__(self, server_dsn: str, template_db: str) -> None:
        self.server_dsn = server_dsn
        self._template = template_db
        self._ready: queue.Queue[str | Exception] = queue.Queue(maxsize=1)
        self._done: queue.Queue[str | None] = queue.Queue()
        self._stop = threading.Event()
        self._failed_drops: list[str] = []
        self._maker = threading.Thread(target=self._make_ahead, name="pgq-test-copies", daemon=True)
        self._dropper = threading.Thread(
            target=self._drop_behind, name="pgq-test-drops", daemon=True
        )
        self._maker.start()
        self._dropper.start()

    def _make_ahead(self) -> None:
        with _admin(self.server_dsn) as admin:
            while not self._stop.is_set():
                made: str | Exception
                try:
                    made = _create_copy(admin, self._template)
                except Exception as exc:  # handed to the test that takes it, which fails
                    made = exc
                while True:
                    try:
                        self._ready.put(made, timeout=0.1)
                        break
                    except queue.Full:
                        if self._stop.is_set():
                            if isinstance(made, str):
                                self._done.put(made)
                            return

    def _drop_behind(self) -> None:
        with _admin(self.server_dsn) as admin:
            while (name := self._done.get()) is not None:
                try:
                    _drop(admin, name)
                except Exception as exc:  # said at the end of the session
                    self._failed_drops.append(f"{name}: {exc}")

    def take(self) -> str:
        """The name of a copy no one else has had."""
        made = self._ready.get(timeout=120)
        if isinstance(made, Exception):
            raise made
        return made

    def give_back(self, name: str) -> None:
        self._done.put(name)

    def close(self) -> None:
        self._stop.set()
        self._maker.join(timeout=120)
        while True:
            try:
                left = self._ready.get_nowait()
            except queue.Empty:
                break
            if isinstance(left, str):
                self._done.put(left)
        self._done.put(None)
        self._dropper.join(timeout=120)
        assert not self._failed_drops, f"test databases not dropped: {self._failed_drops}"


@pytest.fixture(scope="session")
def _copies(server_dsn: str, template_db: str) -> Iterator[_Copies]:
    copies = _Copies(server_dsn, template_db)
    yield copies
    copies.close()


@contextmanager
def _migrated_copy(copies: _Copies) -> Iterator[str]:
    name = copies.take()
    try:
        yield make_conninfo(copies.server_dsn, dbname=name)
    finally:
        copies.give_back(name)


@pytest.fixture
def dsn(_copies: _Copies) -> Iterator[str]:
    """A fresh, migrated database for this test alone."""
    with _migrated_copy(_copies) as fresh:
        yield fresh


@pytest.fixture(scope="module")
def module_dsn(_copies: _Copies) -> Iterator[str]:
    """A fresh, migrated database for one module, whose tests empty what they wrote (for
    modules of many small cases, where a database per test would cost most of their time)."""
    with _migrated_copy(_copies) as fresh:
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
