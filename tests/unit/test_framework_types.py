"""User code that passes framework connections to the queue type-checks under mypy --strict
with no cast; passing the wrong kind (an async session to a sync call) does not."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from mypy import api

GOOD = """
from typing import Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session, scoped_session

import pgq_supervisor as pgq
from pgq_supervisor.testing import drain, drain_async


class DjangoWrapper:  # the shape of django.db.connection (Django ships no annotations)
    connection: Any = None

    def ensure_connection(self) -> None: ...


def sync(s: Session, c: Connection, sc: scoped_session[Session], registry: pgq.Registry) -> None:
    job_id = pgq.enqueue(s, "t", {"a": 1})
    pgq.enqueue(c, "t")
    pgq.enqueue(sc, "t")
    pgq.enqueue(DjangoWrapper(), "t")
    with psycopg.connect("", row_factory=dict_row) as d:
        pgq.enqueue(d, "t")
    record: pgq.JobRecord = pgq.wait(s, job_id, 1.0)
    pgq.get_job(c, record.id)
    drain(s, registry)


async def asynchronous(s: AsyncSession, c: AsyncConnection, registry: pgq.Registry) -> None:
    job_id = await pgq.enqueue_async(s, "t")
    await pgq.enqueue_async(c, "t")
    await pgq.wait_async(s, job_id)
    await drain_async(DjangoWrapper(), registry)
"""

BAD = """
from sqlalchemy.ext.asyncio import AsyncSession

import pgq_supervisor as pgq


def wrong(s: AsyncSession) -> None:
    pgq.enqueue(s, "t")
"""


@pytest.mark.slow
def test_user_code_type_checks_without_a_cast(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(textwrap.dedent(GOOD))
    (tmp_path / "bad.py").write_text(textwrap.dedent(BAD))
    out, err, _ = api.run(
        [
            "--strict",
            "--config-file=",
            f"--cache-dir={tmp_path / 'cache'}",
            "--warn-unused-ignores",
            str(tmp_path / "good.py"),
            str(tmp_path / "bad.py"),
        ]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert [e for e in errors if "good.py" in e] == [], out + err
    bad = [e for e in errors if "bad.py" in e]
    assert len(bad) == 1 and "arg-type" in bad[0], out + err
