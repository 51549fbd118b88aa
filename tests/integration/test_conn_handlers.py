"""Handlers that take `conn`: their writes and the job's completion commit together, or neither."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import testing
from pgq_supervisor.db import Conn
from tests.support.db import count_rows, get, raw_row


@pytest.fixture
def side_table(conn: Conn) -> Iterator[None]:
    conn.execute("CREATE TABLE public.side_effect (job_id uuid NOT NULL, note text NOT NULL)")
    yield


def _write(conn: Conn, job: pgq.Job, note: str) -> None:
    conn.execute("INSERT INTO public.side_effect VALUES (%s, %s)", (job.id, note))


def _side_rows(conn: Conn) -> list[tuple[object, ...]]:
    return [tuple(r) for r in conn.execute("SELECT * FROM public.side_effect").fetchall()]


@pytest.mark.usefixtures("side_table")
def test_handler_writes_commit_with_the_completion(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("book")
    def book(payload: dict[str, str], job: pgq.Job, conn: Conn) -> dict[str, str]:
        _write(conn, job, payload["seat"])
        return {"booked": payload["seat"]}

    job_id = pgq.enqueue(conn, "book", {"seat": "12A"})
    assert testing.drain(conn, registry).succeeded == 1
    assert _side_rows(conn) == [(job_id, "12A")]
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.SUCCEEDED
    assert rec.result == {"booked": "12A"}


@pytest.mark.usefixtures("side_table")
def test_handler_that_raises_has_its_writes_rolled_back(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("book", max_retry_count=1)
    def book(payload: dict[str, str], job: pgq.Job, conn: Conn) -> None:
        _write(conn, job, f"attempt {job.attempt}")
        raise RuntimeError("payment service down")

    job_id = pgq.enqueue(conn, "book", {"seat": "12A"})
    assert testing.drain(conn, registry).retried == 1
    assert _side_rows(conn) == []
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.PENDING
    assert rec.error_msg == "RuntimeError: payment service down"


@pytest.mark.usefixtures("side_table")
def test_handler_that_returns_a_non_json_result_has_its_writes_rolled_back(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("book", max_retry_count=3)
    def book(payload: dict[str, str], job: pgq.Job, conn: Conn) -> object:
        _write(conn, job, "x")
        return {"at": object()}

    job_id = pgq.enqueue(conn, "book", {})
    assert testing.drain(conn, registry).failed == 1
    assert _side_rows(conn) == []
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert rec.error_msg is not None and "not JSON-serializable" in rec.error_msg


@pytest.mark.usefixtures("side_table")
def test_lost_lease_drops_both_the_writes_and_the_completion(
    conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = pgq.Registry()
    after_reset: list[tuple[object, ...]] = []

    @registry.handler("book")
    def book(payload: dict[str, str], job: pgq.Job, conn: Conn) -> str:
        _write(conn, job, "should vanish")
        # an operator takes the job back while the handler is still busy
        with psycopg.connect(dsn, autocommit=True) as admin:
            pgq.reset_job(admin, job.id, force=True)
            after_reset.append(raw_row(admin, job.id))
        return "done"

    job_id = pgq.enqueue(conn, "book", {})
    result = testing.drain(conn, registry, max_jobs=1)
    assert [o.kind for o in result.outcomes] == ["lost"]
    assert any(
        r.levelno == logging.WARNING
        and "lease lost" in r.getMessage()
        and str(job_id) in r.getMessage()
        for r in caplog.records
    ), "the worker must say it lost the job"
    assert _side_rows(conn) == []
    assert raw_row(conn, job_id) == after_reset[0]
    assert get(conn, job_id).state is pgq.JobState.PENDING
    assert count_rows(conn) == 1
