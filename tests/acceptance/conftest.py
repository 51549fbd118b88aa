"""Fixtures shared by the process tests."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.acceptance.apps.pgq_test_app import EFFECTS_DDL
from tests.acceptance.dashboard import Dashboard
from tests.support.processes import Supervisor

Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def db(dsn: str) -> Iterator[Conn]:
    """An autocommit connection to the test's database, with the test app's effects table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
        yield conn


@pytest.fixture
def sups() -> Iterator[list[Supervisor]]:
    """Supervisors a test starts; whatever is left running is killed at the end."""
    started: list[Supervisor] = []
    yield started
    for s in started:
        s.close()


@pytest.fixture
def started() -> Iterator[list[Dashboard]]:
    """The real dashboard commands a test starts (append them): each closed after it."""
    out: list[Dashboard] = []
    yield out
    for dash in out:
        dash.close()
