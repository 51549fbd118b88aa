"""Dedup windows (unique_for): a job of the key that finished within the window of its
enqueue, in a counted state, holds the key as an unfinished one does; enforced by the
database under producers that race, in every enqueue path."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from datetime import timedelta

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import testing
from pgq_supervisor.db import Conn
from tests.support.db import count_rows

registry = pgq.Registry()


@registry.handler("t")
def t(payload: object) -> None:
    return None


@registry.handler("boom", max_retry_count=0)
def boom(payload: object) -> None:
    raise RuntimeError("boom")


def _finish(conn: Conn) -> None:
    testing.drain(conn, registry)


def _backdate(conn: Conn, job_id: pgq.JobId, seconds: float) -> None:
    conn.execute(
        "UPDATE pgq.job SET created_at = created_at - make_interval(secs => %s) WHERE id = %s",
        (seconds, job_id),
    )


def test_a_job_that_succeeded_within_the_window_holds_its_key(conn: Conn) -> None:
    first = pgq.enqueue(conn, "t", unique_key="k", unique_for=60)
    assert pgq.enqueue(conn, "t", unique_key="k", unique_for=60) == first  # unfinished
    _finish(conn)
    assert pgq.enqueue(conn, "t", unique_key="k", unique_for=timedelta(minutes=1)) == first
    # without a window, a finished job holds nothing: as before
    other = pgq.enqueue(conn, "t", unique_key="k")
    assert other != first
    assert count_rows(conn, "job") == 2


def test_past_the_window_a_new_job_is_inserted(conn: Conn) -> None:
    first = pgq.enqueue(conn, "t", unique_key="k", unique_for=60)
    _finish(conn)
    _backdate(conn, first, 61)
    second = pgq.enqueue(conn, "t", unique_key="k", unique_for=60)
    assert second != first
    assert pgq.get_job(conn, second).state is pgq.JobState.PENDING


def test_which_finished_states_count_is_the_callers_choice(conn: Conn) -> None:
    failed = pgq.enqueue(conn, "boom", unique_key="k", unique_for=60)
    _finish(conn)
    assert pgq.get_job(conn, failed).state is pgq.JobState.FAILED
    # by default a failed job does not hold the key: the work was not done
    assert pgq.enqueue(conn, "boom", unique_key="k2", unique_for=60) != failed
    counted = ("pending", "running", "succeeded", "failed")
    assert pgq.enqueue(conn, "boom", unique_key="k", unique_for=60, unique_states=counted) == (
        failed
    )
    # "unfinished only": a succeeded job in the window does not count
    done = pgq.enqueue(conn, "t", unique_key="u", unique_for=60)
    _finish(conn)
    assert pgq.enqueue(conn, "t", unique_key="u", unique_for=60, unique_states=counted[:2]) != (
        done
    )


def test_enqueue_many_returns_the_holders_in_input_order(conn: Conn) -> None:
    done = pgq.enqueue(conn, "t", unique_key="a", unique_for=60)
    _finish(conn)
    ids = pgq.enqueue_many(
        conn,
        [
            pgq.NewJob("t", {"n": 0}),
            pgq.NewJob("t", unique_key="a", unique_for=60),
            pgq.NewJob("t", unique_key="b", unique_for=60),
            pgq.NewJob("t", unique_key="a"),  # no window: the finished job holds nothing
        ],
    )
    assert ids[1] == done
    assert len(set(ids)) == 4
    assert count_rows(conn, "job") == 4


def test_the_async_enqueue_has_the_window_too(dsn: str, conn: Conn) -> None:
    done = pgq.enqueue(conn, "t", unique_key="k", unique_for=60)
    _finish(conn)

    async def go() -> pgq.JobId:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await pgq.enqueue_async(aconn, "t", unique_key="k", unique_for=60)

    assert asyncio.run(go()) == done


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_for": 60}, "need a unique_key"),
        ({"unique_key": "k", "unique_for": 0}, "unique_for must be > 0"),
        ({"unique_key": "k", "unique_for": "1m"}, "seconds or a timedelta"),
        ({"unique_key": "k", "unique_states": ["pending", "running"]}, "needs unique_for"),
        ({"unique_key": "k", "unique_for": 5, "unique_states": ["succeeded"]}, "include 'pending'"),
        ({"unique_key": "k", "unique_for": 5, "unique_states": ["pending", "x"]}, "'x' is not"),
    ],
)
def test_bad_window_options_are_refused_with_nothing_written(
    conn: Conn, options: dict[str, object], message: str
) -> None:
    with pytest.raises(pgq.InvalidInput, match=message):
        pgq.enqueue(conn, "t", **options)  # type: ignore[arg-type]
    with pytest.raises(pgq.InvalidInput, match=message):
        pgq.enqueue_many(conn, [pgq.NewJob("t"), pgq.NewJob("t", **options)])  # type: ignore[arg-type]
    assert count_rows(conn, "job") == 0


def test_racing_producers_and_a_fast_worker_leave_one_job_per_key(dsn: str, conn: Conn) -> None:
    """Each producer enqueues the round's key in its own transaction and commits a moment
    later, while a worker finishes jobs as fast as they come: without the database's lock a
    producer that looked before another committed inserts a second job once the first one
    succeeded (no unfinished job holds the key then)."""
    producers, rounds = 6, 30
    stop = threading.Event()
    errors: list[BaseException] = []
    ran = [0]  # the jobs the worker ran while the producers raced

    def worker() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as wconn:
                while not stop.is_set():
                    ran[0] += testing.drain(wconn, registry).succeeded
        except BaseException as exc:
            errors.append(exc)

    def producer(seed: int, barrier: threading.Barrier) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(dsn, autocommit=True) as pconn:
                for r in range(rounds):
                    barrier.wait(timeout=30)
                    with pconn.transaction():
                        pgq.enqueue(pconn, "t", unique_key=f"k{r}", unique_for=3600)
                        time.sleep(rng.uniform(0, 0.01))  # a caller's own work before commit
        except BaseException as exc:
            errors.append(exc)

    barrier = threading.Barrier(producers)
    threads = [threading.Thread(target=worker)] + [
        threading.Thread(target=producer, args=(i, barrier)) for i in range(producers)
    ]
    for th in threads:
        th.start()
    for th in threads[1:]:
        th.join(timeout=120)
    stop.set()
    threads[0].join(timeout=30)
    assert errors == []
    # a worker that ran nothing leaves every key held by a pending job: nothing raced a success
    assert ran[0] > 0
    rows = conn.execute(
        "SELECT unique_key, count(*) FROM pgq.job GROUP BY unique_key HAVING count(*) > 1"
    ).fetchall()
    assert rows == []
    assert count_rows(conn, "job") == rounds
