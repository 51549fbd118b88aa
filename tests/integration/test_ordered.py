"""Strict order per key (ordered_key): the jobs of a key run one at a time in enqueue order; a
failed one blocks the key until it is reset or deleted; jobs without a key are untouched."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import testing
from pgq_supervisor.db import Conn
from pgq_supervisor.display import held_back
from tests.support.db import count_rows, get, in_threads

registry = pgq.Registry()
ran: list[tuple[str, int]] = []
failing: set[int] = set()
lock = threading.Lock()
running: dict[str, int] = {}  # a key's jobs in their handler now
most: dict[str, int] = {}  # and the most there ever were at once


@registry.handler("step", max_retry_count=0)
def step(payload: dict[str, int | str]) -> None:
    n, key = int(payload["n"]), str(payload["k"])
    with lock:
        ran.append((key, n))
        running[key] = running.get(key, 0) + 1
        most[key] = max(most.get(key, 0), running[key])
    try:
        if n in failing:
            raise RuntimeError(f"step {n} failed")
        time.sleep(0.001)  # a job that takes a moment: another of its key would overlap it
    finally:
        with lock:
            running[key] -= 1


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()
    failing.clear()
    running.clear()
    most.clear()


def _steps(conn: Conn, key: str, ns: range) -> list[pgq.JobId]:
    return [pgq.enqueue(conn, "step", {"k": key, "n": n}, ordered_key=key) for n in ns]


def test_the_jobs_of_a_key_run_one_at_a_time_in_enqueue_order(conn: Conn) -> None:
    ids = _steps(conn, "a", range(3))
    waiting = [get(conn, i).waiting_on for i in ids]
    assert waiting == [0, 1, 1]  # only the head can be claimed
    assert "ordered" in str(held_back(get(conn, ids[1])))
    pgq.enqueue_many(
        conn, [pgq.NewJob("step", {"k": "a", "n": n}, ordered_key="a") for n in (3, 4)]
    )
    pgq.enqueue(conn, "step", {"k": "free", "n": 0})
    assert testing.drain(conn, registry, batch=10).succeeded == 6
    assert [n for k, n in ran if k == "a"] == [0, 1, 2, 3, 4]


def test_a_failed_job_blocks_its_key_until_it_is_reset(conn: Conn) -> None:
    ids = _steps(conn, "a", range(3))
    _steps(conn, "b", range(2))
    failing.add(0)
    drained = testing.drain(conn, registry)
    assert (drained.failed, drained.succeeded) == (2, 0)  # a0 and b0: both keys blocked
    assert get(conn, ids[1]).state is pgq.JobState.PENDING
    assert testing.drain(conn, registry).outcomes == []
    failing.clear()
    pgq.reset_job(conn, ids[0])
    assert testing.drain(conn, registry).succeeded == 3
    assert [n for k, n in ran if k == "a"] == [0, 0, 1, 2]
    # deleting the failed head of b unblocks it too
    conn.execute("DELETE FROM pgq.job WHERE state = 'failed'")
    assert testing.drain(conn, registry).succeeded == 1


def test_cancelling_the_head_releases_the_next_and_a_waiting_one_releases_nothing(
    conn: Conn,
) -> None:
    ids = _steps(conn, "a", range(4))
    pgq.cancel_job(conn, ids[2])  # waiting: nothing is released
    assert [get(conn, i).waiting_on for i in (ids[1], ids[3])] == [1, 1]
    pgq.cancel_job(conn, ids[0])  # the head: the next one is
    assert get(conn, ids[1]).waiting_on == 0
    assert testing.drain(conn, registry).succeeded == 2
    assert ran == [("a", 1), ("a", 3)]


def test_bad_ordered_key_options_are_refused(conn: Conn) -> None:
    with pytest.raises(pgq.InvalidInput, match="ordered_key must be a string"):
        pgq.enqueue(conn, "step", ordered_key="")
    with pytest.raises(pgq.InvalidInput, match="cannot be combined"):
        pgq.enqueue(conn, "step", ordered_key="a", unique_key="u")
    assert count_rows(conn, "job") == 0


def test_racing_producers_and_workers_keep_each_key_in_order(dsn: str, conn: Conn) -> None:
    """Four producers enqueue into two keys while two workers drain: no job of a key starts
    before the one enqueued before it finished, and none is left waiting."""
    stop = threading.Event()
    errors: list[BaseException] = []
    ran_by_workers = [0]  # the main thread's drains below would run anything they did not

    def work() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as w:
                while not stop.is_set():
                    done = testing.drain(w, registry, batch=5).succeeded
                    with lock:
                        ran_by_workers[0] += done
        except BaseException as exc:
            errors.append(exc)

    def produce(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as p:
            for n in range(25):
                key = f"k{n % 2}"
                pgq.enqueue(p, "step", {"k": key, "n": 100 * i + n}, ordered_key=key)

    workers = [threading.Thread(target=work) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        in_threads(4, produce)
        testing.drain(conn, registry)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=30)
    assert errors == [] and ran_by_workers[0] > 0
    testing.drain(conn, registry)
    row = conn.execute("SELECT count(*) FROM pgq.job WHERE state <> 'succeeded'").fetchone()
    assert row == (0,)
    # the order they ran in is the order they were enqueued in, per key
    for key in ("k0", "k1"):
        enqueued = [
            r[0]
            for r in conn.execute(
                "SELECT (payload ->> 'n')::int FROM pgq.job WHERE ordered_key = %s"
                " ORDER BY ordered_seq",
                (key,),
            )
        ]
        assert [n for k, n in ran if k == key] == enqueued
        # one producer's jobs of a key run in the order it enqueued them
        for i in range(4):
            mine = [n for k, n in ran if k == key and n // 100 == i]
            assert mine == sorted(mine), (key, i, mine)
        # one at a time, by the handlers' own count (the rows' started_at is the claim
        # statement's start, which may precede the commit that made the job ready)
        assert most[key] == 1, (key, most)
