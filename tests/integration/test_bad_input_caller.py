"""Bad scalar arguments to the public calls (issue 38 items 6 to 8) are an InvalidInput naming
the argument, raised before the first statement: inside the caller's own transaction nothing
is written and the transaction is still usable (a good enqueue after it commits)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime

import psycopg
import pytest
from psycopg import sql

import pgq_supervisor as pgq
from pgq_supervisor.db import AsyncConn, Conn
from tests.integration.caller_states import SYNC_STATES

Call = Callable[[Conn], object]


@pytest.fixture
def dsn(module_dsn: str) -> Iterator[str]:
    yield module_dsn
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE pgq.job, pgq.job_bundle, pgq.workflow_signal CASCADE"))


def _enqueue(**options: object) -> Call:
    return lambda conn: pgq.enqueue(conn, "t", {}, **options)  # type: ignore[arg-type]


BAD: list[tuple[str, Call, str]] = [
    ("priority-true", _enqueue(priority=True), "priority must be an integer, got bool"),
    ("priority-str", _enqueue(priority="1"), "priority must be an integer"),
    ("priority-2**31", _enqueue(priority=2**31), "priority must be from"),
    ("max_retry_count-true", _enqueue(max_retry_count=True), "max_retry_count must be an"),
    ("max_retry_count-negative", _enqueue(max_retry_count=-1), "max_retry_count must be from"),
    ("unique_key-1e6-chars", _enqueue(unique_key="k" * 1_000_000), "unique_key must be at most"),
    ("unique_key-wide-utf8", _enqueue(unique_key="日" * 400), "unique_key must be at most 1024"),
    ("unique_key-nul", _enqueue(unique_key="a\x00b"), "unique_key contains a NUL"),
    ("unique_key-surrogate", _enqueue(unique_key="a\ud800"), "unique_key contains a lone"),
    ("unique_key-int", _enqueue(unique_key=5), "unique_key must be a string, got int"),
    ("origin-nul", _enqueue(origin="a\x00b"), "origin contains a NUL"),
    ("origin-surrogate", _enqueue(origin="\udfff"), "origin contains a lone surrogate"),
    ("origin-huge", _enqueue(origin="o" * 1001), "origin must be at most 1000 characters"),
    ("start_at-date", _enqueue(start_at=date(2024, 1, 1)), "start_at must be a timezone-aware"),
    ("start_at-str", _enqueue(start_at="2024-01-01T00:00:00Z"), "start_at must be a"),
    ("start_at-naive", _enqueue(start_at=datetime(2024, 1, 1)), "start_at must be timezone"),
    ("timeout-str", _enqueue(timeout="5"), "timeout must be a number of seconds"),
    ("timeout-nan", _enqueue(timeout=float("nan")), "timeout must be > 0"),
    ("timeout-true", _enqueue(timeout=True), "timeout must be a number of seconds"),
    ("type-surrogate", lambda c: pgq.enqueue(c, "t\ud800", {}), "invalid job type"),
    ("type-control", lambda c: pgq.enqueue(c, "t\x07", {}), "invalid job type"),
    (
        "concurrency_key-surrogate",
        _enqueue(concurrency_key="\ud800"),
        "concurrency_key contains a lone",
    ),
    ("tenant-surrogate", _enqueue(tenant="\ud800"), "tenant contains a lone"),
    (
        "many-one-bad",
        lambda c: pgq.enqueue_many(c, [pgq.NewJob("t"), pgq.NewJob("t", priority=False)]),
        "priority must be an integer",
    ),
    (
        "bundle-origin-nul",
        lambda c: pgq.enqueue_bundle(c, "t", [pgq.NewJob("t")], origin="\x00"),
        "origin contains a NUL",
    ),
    (
        "signal-not-a-uuid",
        lambda c: pgq.signal(c, "zz", "go"),
        "is not a job id",
    ),
    (
        "signal-int-id",
        lambda c: pgq.signal(c, 5, "go"),  # type: ignore[arg-type]
        "is not a job id",
    ),
    (
        "signal-name-nul",
        lambda c: pgq.signal(c, pgq.JobId(uuid.uuid4()), "go\x00"),
        "signal name contains a NUL",
    ),
    (
        "signal-name-surrogate",
        lambda c: pgq.signal(c, pgq.JobId(uuid.uuid4()), "\ud800"),
        "signal name contains a lone",
    ),
]


@pytest.mark.parametrize("state", ["autocommit", "after_statement", "in_transaction"])
@pytest.mark.parametrize(("call", "says"), [(c, s) for _, c, s in BAD], ids=[n for n, _, _ in BAD])
def test_bad_input_is_invalid_input_and_the_callers_transaction_goes_on(
    dsn: str, state: str, call: Call, says: str
) -> None:
    with SYNC_STATES[state](dsn, True) as conn:
        with pytest.raises(pgq.InvalidInput) as info:
            call(conn)
        assert says in str(info.value)
        assert isinstance(info.value, pgq.PgqError)
        # the transaction is not aborted: a statement and a good enqueue go on, and commit
        assert conn.execute("SELECT 1").fetchone() == (1,)
        good = pgq.enqueue(conn, "good", {})
    with psycopg.connect(dsn) as check:
        rows = check.execute("SELECT id, type FROM pgq.job").fetchall()
        assert rows == [(good, "good")]  # the bad call wrote nothing
        assert check.execute("SELECT count(*) FROM pgq.job_bundle").fetchone() == (0,)


def test_signal_async_checks_the_same(dsn: str) -> None:
    async def run() -> None:
        aconn: AsyncConn = await psycopg.AsyncConnection.connect(dsn)
        async with aconn:
            await aconn.execute("SELECT 1")
            with pytest.raises(pgq.InvalidInput, match="is not a job id"):
                await pgq.signal_async(aconn, "zz", "go")
            assert await (await aconn.execute("SELECT 1")).fetchone() == (1,)
            when = datetime(2030, 1, 1, tzinfo=UTC)
            with pytest.raises(pgq.InvalidInput, match="priority must be an integer"):
                await pgq.enqueue_async(aconn, "t", {}, priority=True, start_at=when)
            assert await (await aconn.execute("SELECT 1")).fetchone() == (1,)

    asyncio.run(run())
