"""pgq.wait / wait_many: woken by pgq_job_stopped from every path that ends a job, never by a
poll (the safety re-read is pushed out of reach), a job already finished at once, a timeout,
an unknown id, a connection in a transaction; async twins and Producer.enqueue_and_wait."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import pgq_supervisor as pgq
from pgq_supervisor import db, testing, waiting
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobId, JobRecord, JobState
from tests.support.db import SCHEMA, age_heartbeat, claim, claim_one, in_threads
from tests.support.waiting import DEADLINE, until

WAITER_APP = "pgq-test-waiter"
StartWaiter = Callable[[list[JobId]], "Background"]


@pytest.fixture(autouse=True)
def no_safety_reread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a notification can wake a waiter in these tests: a lost one fails the test."""
    monkeypatch.setattr(waiting, "SAFETY_RECHECK", 1000.0)


def _registry() -> pgq.Registry:
    registry = pgq.Registry()

    @registry.handler("t")
    def t(payload: dict[str, int]) -> dict[str, int]:
        return {"double": payload.get("n", 0) * 2}

    return registry


def _waiters_asleep(conn: Conn, n: int = 1) -> bool:
    """`n` waiter connections have read the states and sit idle on their LISTEN."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state = 'idle'"
        " AND query LIKE 'SELECT id, state FROM%%'",
        (WAITER_APP,),
    ).fetchone()
    return row is not None and row[0] >= n


class Background:
    """`wait` on its own connection, in a thread; `result()` joins it."""

    def __init__(self, dsn: str, target: Callable[[Conn], object]) -> None:
        self.value: object = None
        self.error: BaseException | None = None

        def run() -> None:
            with psycopg.connect(dsn, autocommit=True, application_name=WAITER_APP) as conn:
                try:
                    self.value = target(conn)
                except BaseException as exc:  # handed to the test thread
                    self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self) -> object:
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "the waiter never returned"
        if self.error is not None:
            raise self.error
        return self.value


@pytest.fixture
def waiting_on(dsn: str, conn: Conn) -> Iterator[Callable[[list[JobId]], Background]]:
    started: list[Background] = []

    def start(ids: list[JobId]) -> Background:
        bg = Background(dsn, lambda c: pgq.wait_many(c, ids, timeout=DEADLINE))
        started.append(bg)
        until(lambda: _waiters_asleep(conn) or not bg.thread.is_alive())
        return bg

    yield start
    for bg in started:
        bg.thread.join(DEADLINE)


def _records(bg: Background) -> list[JobRecord]:
    value = bg.result()
    assert isinstance(value, list)
    return value


def test_a_job_already_finished_returns_at_once(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t", {"n": 2})
    testing.drain(conn, _registry())
    record = pgq.wait(conn, job_id, timeout=0)
    assert record.state is JobState.SUCCEEDED and record.result == {"double": 4}


def test_a_job_that_succeeds_later_wakes_its_waiter(conn: Conn, waiting_on: StartWaiter) -> None:
    job_id = pgq.enqueue(conn, "t", {"n": 21})
    bg = waiting_on([job_id])
    assert bg.thread.is_alive()
    testing.drain(conn, _registry())
    (record,) = _records(bg)
    assert record.state is JobState.SUCCEEDED and record.result == {"double": 42}


def test_failed_cancelled_and_rescued_jobs_wake_their_waiters(
    conn: Conn, waiting_on: StartWaiter
) -> None:
    failing, cancelled, dead = (pgq.enqueue(conn, "f", max_retry_count=0) for _ in range(3))
    bg = waiting_on([failing, cancelled, dead])
    job = claim_one(conn, "f")
    db.end_attempt(
        conn, SCHEMA, [job.id], lease=job.lease, error="boom", error_data=None,
        kind=AttemptKind.ERROR, allow_retry=True, delay=0.0,
    )  # fmt: skip
    pgq.cancel_job(conn, cancelled)
    rescued = claim_one(conn, "f")
    age_heartbeat(conn, rescued.id, 3600)
    assert [e.job_id for e in db.rescue(conn, SCHEMA, dead_after=60)] == [rescued.id]
    records = _records(bg)
    assert [r.id for r in records] == [failing, cancelled, dead]
    assert {r.id: r.state for r in records} == {
        job.id: JobState.FAILED,
        cancelled: JobState.CANCELLED,
        rescued.id: JobState.FAILED,
    }


def test_a_timeout_raises_timeout_error(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"1 job still unfinished after 0\.3 s"):
        pgq.wait(conn, job_id, timeout=0.3)
    assert time.monotonic() - started >= 0.3
    # the connection is left as it was found, listening to nothing
    assert conn.autocommit
    assert conn.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)


def _supervisor(conn: Conn, id_: str, types: list[str], seen_ago: float = 0.0) -> None:
    """A supervisor's row as one writes it (schema/0010), last refreshed `seen_ago` s ago."""
    db.register_supervisor(
        conn, SCHEMA, id=id_, host="h", pid=1, procs=1, types=types,
        started_at=db.db_now(conn, SCHEMA), children=[],
    )  # fmt: skip
    conn.execute(
        "UPDATE pgq.supervisor SET seen_at = now() - make_interval(secs => %s) WHERE id = %s",
        (seen_ago, id_),
    )


def test_a_timeout_names_the_pending_types_no_supervisor_serves(dsn: str, conn: Conn) -> None:
    """Issue 36: a misspelt type ("gret") waits forever; the timeout says why."""
    typo, served = pgq.enqueue(conn, "gret"), pgq.enqueue(conn, "greet")
    with pytest.raises(TimeoutError, match=r"serves type 'gret'; no supervisor is live$"):
        pgq.wait(conn, typo, timeout=0.05)
    _supervisor(conn, "live", ["greet", "resize"])
    _supervisor(conn, "gone", ["gret"], seen_ago=3600)  # not seen lately: serves nothing
    hint = (
        r"; no supervisor seen in the last 3 s serves type 'gret' \(did you mean 'greet'\?\)"
        r"; served: 'greet', 'resize'$"
    )
    with pytest.raises(TimeoutError, match=r"^2 jobs still unfinished after 0\.05 s .*" + hint):
        pgq.wait_many(conn, [typo, served], timeout=0.05)

    async def waits_async() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            with pytest.raises(TimeoutError, match=hint):
                await pgq.wait_async(aconn, typo, timeout=0.05)

    asyncio.run(waits_async())
    with pytest.raises(TimeoutError, match=r"\)$"):  # every type is served: no hint
        pgq.wait(conn, served, timeout=0.05)
    _supervisor(conn, "gone", ["gret"])  # back
    with pytest.raises(TimeoutError, match=r"\)$"):
        pgq.wait(conn, typo, timeout=0.05)


def test_an_unknown_job_is_not_found(conn: Conn) -> None:
    known = pgq.enqueue(conn, "t")
    with pytest.raises(pgq.JobNotFound, match="no job with id"):
        pgq.wait_many(conn, [known, JobId(db.params.new_id())], timeout=1)


def test_a_connection_in_a_transaction_is_refused(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t")
    with conn.transaction(), pytest.raises(pgq.InvalidInput, match="outside a transaction"):
        pgq.wait(conn, job_id, timeout=1)


def test_an_idle_connection_without_autocommit_is_lent_autocommit_and_given_back(
    dsn: str, conn: Conn
) -> None:
    job_id = pgq.enqueue(conn, "t")
    testing.drain(conn, _registry())
    with psycopg.connect(dsn, autocommit=False) as other:
        assert pgq.wait(other, job_id, timeout=1).state is JobState.SUCCEEDED
        assert not other.autocommit


def test_a_hundred_jobs_and_waiters_all_return(dsn: str, conn: Conn) -> None:
    ids = pgq.enqueue_many(conn, [pgq.NewJob("t", {"n": i}) for i in range(100)])
    testing.drain(conn, _registry(), max_jobs=10)  # some are done before anyone waits
    groups = [ids[i::10] for i in range(10)]

    def waiter(group: list[JobId]) -> Background:
        return Background(dsn, lambda c: pgq.wait_many(c, group, timeout=DEADLINE))

    waiters = [waiter(g) for g in groups]
    whole = Background(dsn, lambda c: pgq.wait_many(c, ids, timeout=DEADLINE))
    until(lambda: _waiters_asleep(conn, 11))
    testing.drain(conn, _registry())
    for group, bg in zip(groups, waiters, strict=True):
        assert [r.id for r in _records(bg)] == group
    records = _records(whole)
    assert [r.id for r in records] == ids
    assert all(r.state is JobState.SUCCEEDED for r in records)
    assert [r.result for r in records] == [{"double": 2 * i} for i in range(100)]


def test_one_thread_per_job_each_waiting(dsn: str, conn: Conn) -> None:
    ids = pgq.enqueue_many(conn, [pgq.NewJob("t", {"n": i}) for i in range(20)])
    done = threading.Event()

    def complete() -> None:
        with psycopg.connect(dsn, autocommit=True) as other:
            until(lambda: _waiters_asleep(other, 20))
            testing.drain(other, _registry())
        done.set()

    threading.Thread(target=complete, daemon=True).start()

    def wait_one(i: int) -> JobRecord:
        with psycopg.connect(dsn, autocommit=True, application_name=WAITER_APP) as c:
            return pgq.wait(c, ids[i], timeout=DEADLINE)

    records = in_threads(20, wait_one)
    assert done.wait(DEADLINE)
    assert [r.id for r in records] == ids and all(r.state is JobState.SUCCEEDED for r in records)


def test_on_progress_follows_the_job(conn: Conn, dsn: str) -> None:
    job_id = pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    seen: list[object] = []

    def follow(c: Conn) -> JobRecord:
        return pgq.wait(c, job_id, timeout=DEADLINE, on_progress=lambda r: seen.append(r.progress))

    bg = Background(dsn, follow)
    until(lambda: _waiters_asleep(conn))
    assert db.set_progress(conn, SCHEMA, [(job_id, job.lease, "0.5")]) == {job_id}
    until(lambda: seen == [0.5])
    db.succeed(conn, SCHEMA, job.lease, [(job_id, None)])
    record = bg.result()
    assert isinstance(record, JobRecord) and record.progress == 0.5


def test_wait_async(dsn: str, conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t", {"n": 1})

    def complete_when_waited_on() -> None:
        with psycopg.connect(dsn, autocommit=True) as other:
            until(lambda: _waiters_asleep(other))
            testing.drain(other, _registry())

    async def scenario() -> JobRecord:
        conn = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, application_name=WAITER_APP
        )
        async with conn:
            with pytest.raises(TimeoutError):
                await pgq.wait_async(conn, job_id, timeout=0.05)
            threading.Thread(target=complete_when_waited_on, daemon=True).start()
            (record,) = await pgq.wait_many_async(conn, [job_id], timeout=DEADLINE)
            return record

    record = asyncio.run(scenario())
    assert record.state is JobState.SUCCEEDED and record.result == {"double": 2}


def test_producer_enqueue_and_wait(dsn: str, conn: Conn) -> None:
    stop = threading.Event()

    def worker() -> None:
        with psycopg.connect(dsn, autocommit=True) as other:
            while not stop.is_set():
                if not testing.drain(other, _registry()).outcomes:
                    time.sleep(0.01)  # an idle worker between claims, until told to stop

    threading.Thread(target=worker, daemon=True).start()
    try:
        with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
            record = pgq.Producer(pool).enqueue_and_wait("t", {"n": 5}, wait_timeout=DEADLINE)
        assert record.state is JobState.SUCCEEDED and record.result == {"double": 10}

        async def scenario() -> JobRecord:
            async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool:
                producer = pgq.Producer(pool)
                return await producer.enqueue_and_wait_async("t", {"n": 6}, wait_timeout=DEADLINE)

        record = asyncio.run(scenario())
        assert record.result == {"double": 12}
    finally:
        stop.set()


def test_a_job_not_finished_in_a_claimed_batch_keeps_its_waiter(conn: Conn) -> None:
    """The other jobs of a completion statement do not wake a waiter on an unfinished one."""
    ids = pgq.enqueue_many(conn, [pgq.NewJob("t") for _ in range(2)])
    batch = claim(conn, ["t"], limit=2)
    db.succeed(conn, SCHEMA, batch[0].lease, [(batch[0].id, None)])
    unfinished = batch[1].id
    assert unfinished in ids
    with pytest.raises(TimeoutError):
        pgq.wait(conn, unfinished, timeout=0.2)


def test_bundled_jobs_and_their_completion_job_wake_their_waiters(
    conn: Conn, waiting_on: StartWaiter
) -> None:
    registry = _registry()

    @registry.handler("done")
    def done(payload: dict[str, str]) -> str:
        return payload["bundle_id"]

    bundle = pgq.enqueue_bundle(conn, "b", [pgq.NewJob("t", {"n": i}) for i in range(2)],
                                on_complete="done")  # fmt: skip
    ids = [r[0] for r in conn.execute("SELECT id FROM pgq.job ORDER BY created_at").fetchall()]
    bg = waiting_on(ids)
    testing.drain(conn, registry, ignore=["done"])
    assert [r.state for r in _records(bg)] == [JobState.SUCCEEDED] * 2
    (completion,) = conn.execute("SELECT id FROM pgq.job WHERE type = 'done'").fetchall()
    bg = waiting_on([completion[0]])
    testing.drain(conn, registry)
    (record,) = _records(bg)
    assert record.result == str(bundle.id)


def test_a_lost_notification_is_made_up_by_the_safety_reread(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting, "SAFETY_RECHECK", 0.2)
    job_id = pgq.enqueue(conn, "t")
    bg = Background(dsn, lambda c: pgq.wait(c, job_id, timeout=DEADLINE))
    until(lambda: _waiters_asleep(conn))
    # ended behind the queue's back: no notification is sent
    conn.execute(
        "UPDATE pgq.job SET state = 'cancelled', stopped_at = now() WHERE id = %s", (job_id,)
    )
    record = bg.result()
    assert isinstance(record, JobRecord) and record.state is JobState.CANCELLED
