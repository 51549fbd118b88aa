"""Every kind of settlement a run comes to (runs.py), as Completer.settle writes it, on a real
database.

A plain success is the executor's Ran, buffered until a claim or flush; a failure is written at
once; a `conn` handler's success is Committed in its own transaction (settle writes nothing
more); a lease found gone is Lost (nothing written); an async job cancelled at its timeout ends
its attempt as a timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import nullcontext

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JsonValue, OutcomeKind
from pgq_supervisor.worker import runs
from pgq_supervisor.worker.completion import Completer
from pgq_supervisor.worker.executor import Executor, Ran
from pgq_supervisor.worker.heartbeat import Heartbeat
from tests.support.db import get, raw_row

S = "pgq"
WORKER = "worker-1"


@pytest.fixture
def heartbeat(dsn: str) -> Iterator[Heartbeat]:
    """Never started: holding() tells how many jobs the completer left in it."""
    hb = Heartbeat(lambda: db.connect(dsn), S, 5.0, WORKER)
    yield hb
    hb.stop()


@pytest.fixture
def completer(heartbeat: Heartbeat) -> Completer:
    return Completer(S, WORKER, heartbeat=heartbeat)


@pytest.fixture
def side_table(conn: Conn) -> Iterator[None]:
    conn.execute("CREATE TABLE public.side_effect (job_id uuid NOT NULL)")
    yield


def _side_rows(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM public.side_effect").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def registry(dsn: str) -> pgq.Registry:
    registry = pgq.Registry()

    @registry.handler("plain", max_retry_count=1, retry=lambda attempt, rng: 0.0)
    def plain(payload: dict[str, bool]) -> str:
        if payload.get("fail"):
            raise RuntimeError("asked to fail")
        return "done"

    @registry.handler("book")
    def book(payload: dict[str, bool], job: pgq.Job, conn: Conn) -> str:
        conn.execute("INSERT INTO public.side_effect VALUES (%s)", (job.id,))
        if payload.get("steal"):  # another worker takes the job while this one runs
            with psycopg.connect(dsn, autocommit=True) as admin:
                pgq.reset_job(admin, job.id, force=True)
        return "booked"

    @registry.handler("slow", max_retry_count=1, retry=lambda attempt, rng: 0.0)
    async def slow(payload: dict[str, bool], conn: psycopg.AsyncConnection[object]) -> None:
        await conn.execute("INSERT INTO public.side_effect VALUES (gen_random_uuid())")
        await asyncio.sleep(30)  # cancelled at its timeout

    @registry.handler("nap", max_retry_count=0)
    async def nap(payload: dict[str, bool]) -> None:
        await asyncio.sleep(30)  # outlives the timeout it is run with: cancelled at it

    return registry


def _claim(
    conn: Conn, completer: Completer, registry: pgq.Registry, type_: str, payload: JsonValue = None
) -> pgq.Job:
    pgq.enqueue(conn, type_, payload if payload is not None else {})
    (job,) = completer.claim(conn, registry.claim_policy([type_]), 1)
    return job


def _kinds(conn: Conn, job_id: pgq.JobId) -> list[str]:
    return [str(a["kind"]) for a in get(conn, job_id).attempts if isinstance(a, dict)]


def test_a_plain_success_is_a_ran_buffered_until_the_flush(
    conn: Conn, dsn: str, heartbeat: Heartbeat, registry: pgq.Registry, completer: Completer
) -> None:
    job = _claim(conn, completer, registry, "plain")
    settlement = runs.run_sync(Executor(registry, WORKER), job, S)
    assert type(settlement) is Ran and settlement.failure is None
    completer.settle(conn, settlement)
    assert get(conn, job.id).state is pgq.JobState.RUNNING  # buffered, still held
    assert (completer.buffered, heartbeat.holding()) == (1, 1)
    completer.flush(conn)
    rec = get(conn, job.id)
    assert (rec.state, rec.result) == (pgq.JobState.SUCCEEDED, "done")
    assert [o.kind for o in completer.take_outcomes()] == [OutcomeKind.SUCCEEDED]
    assert heartbeat.holding() == 0


def test_a_failure_is_written_at_once(
    conn: Conn, heartbeat: Heartbeat, registry: pgq.Registry, completer: Completer
) -> None:
    job = _claim(conn, completer, registry, "plain", {"fail": True})
    completer.settle(conn, runs.run_sync(Executor(registry, WORKER), job, S))
    rec = get(conn, job.id)
    assert rec.state is pgq.JobState.PENDING and _kinds(conn, job.id) == [AttemptKind.ERROR]
    assert rec.error_msg == "RuntimeError: asked to fail"
    assert [o.kind for o in completer.take_outcomes()] == [OutcomeKind.RETRIED]
    assert (completer.buffered, heartbeat.holding()) == (0, 0)


@pytest.mark.usefixtures("side_table")
def test_a_conn_handlers_success_is_committed_with_its_writes_and_settle_adds_nothing(
    conn: Conn, dsn: str, heartbeat: Heartbeat, registry: pgq.Registry, completer: Completer
) -> None:
    job = _claim(conn, completer, registry, "book")
    with db.connect(dsn) as worker_conn:
        settlement = runs.run_sync(
            Executor(registry, WORKER), job, S, lambda: nullcontext(worker_conn)
        )
    assert isinstance(settlement, runs.Committed)
    committed = raw_row(conn, job.id)
    assert get(conn, job.id).state is pgq.JobState.SUCCEEDED and _side_rows(conn) == 1
    completer.settle(conn, settlement)
    assert raw_row(conn, job.id) == committed  # written in the handler's transaction only
    assert [o.kind for o in completer.take_outcomes()] == [OutcomeKind.SUCCEEDED]
    assert (completer.buffered, heartbeat.holding()) == (0, 0)


@pytest.mark.usefixtures("side_table")
def test_a_lost_lease_rolls_the_writes_back_and_settle_writes_nothing(
    conn: Conn, dsn: str, heartbeat: Heartbeat, registry: pgq.Registry, completer: Completer
) -> None:
    job = _claim(conn, completer, registry, "book", {"steal": True})
    settlement = runs.run_in_transaction(
        Executor(registry, WORKER), job, S, db.connect(dsn, autocommit=True)
    )
    assert isinstance(settlement, runs.Lost)
    after_reset = raw_row(conn, job.id)
    completer.settle(conn, settlement)
    assert raw_row(conn, job.id) == after_reset and _side_rows(conn) == 0
    assert get(conn, job.id).state is pgq.JobState.PENDING
    assert [o.kind for o in completer.take_outcomes()] == [OutcomeKind.LOST]
    assert heartbeat.holding() == 0


@pytest.mark.usefixtures("side_table")
def test_an_async_job_past_its_timeout_is_cancelled_its_writes_undone_and_retried(
    conn: Conn, dsn: str, heartbeat: Heartbeat, registry: pgq.Registry, completer: Completer
) -> None:
    job = _claim(conn, completer, registry, "slow")

    async def run() -> runs.Settlement:
        async with AsyncConnectionPool(dsn, kwargs=runs.POOL_KWARGS, open=False) as pool:
            executor = Executor(registry, WORKER)
            return await runs.run_async(executor, job, 0.2, S, pool.connection)

    settlement = asyncio.run(run())
    assert isinstance(settlement, runs.TimedOut) and settlement.timeout == 0.2
    assert settlement.retry_delay == 0.0  # the type's own retry policy
    completer.settle(conn, settlement)
    rec = get(conn, job.id)
    assert rec.state is pgq.JobState.PENDING and rec.error_msg == "timeout after 0.2 s"
    assert _kinds(conn, job.id) == [AttemptKind.TIMEOUT] and _side_rows(conn) == 0
    assert [o.kind for o in completer.take_outcomes()] == [OutcomeKind.RETRIED]
    assert heartbeat.holding() == 0


def test_a_timeout_without_attempts_left_fails_and_one_whose_lease_went_is_lost(
    conn: Conn, dsn: str, heartbeat: Heartbeat, registry: pgq.Registry, completer: Completer
) -> None:
    executor = Executor(registry, WORKER)
    failing = _claim(conn, completer, registry, "nap")
    completer.settle(conn, asyncio.run(runs.run_async(executor, failing, 0.05, S)))
    assert get(conn, failing.id).state is pgq.JobState.FAILED
    stolen = _claim(conn, completer, registry, "nap")
    settlement = asyncio.run(runs.run_async(executor, stolen, 0.05, S))
    pgq.reset_job(conn, stolen.id, force=True)
    after_reset = raw_row(conn, stolen.id)
    completer.settle(conn, settlement)
    assert raw_row(conn, stolen.id) == after_reset
    outcomes = completer.take_outcomes()
    assert [o.kind for o in outcomes] == [OutcomeKind.FAILED, OutcomeKind.LOST]
    assert heartbeat.holding() == 0
