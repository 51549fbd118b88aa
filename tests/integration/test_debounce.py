"""Debounce (replace=True): a new enqueue replaces the payload, start_at and priority of the
pending job holding the key; a running holder is never touched, and the new job waits behind
it or is dropped, as the caller chose. Racing producers replace one job, never insert two."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import testing
from pgq_supervisor.db import Conn
from pgq_supervisor.display import held_back
from tests.support.db import claim_one, count_rows, get, in_threads

registry = pgq.Registry()


@registry.handler("t")
def t(payload: object) -> object:
    return payload


def test_a_pending_job_takes_the_new_payload_start_at_and_priority(conn: Conn) -> None:
    first = pgq.enqueue(conn, "t", {"v": 1}, unique_key="k", replace=True)
    later = datetime.now(UTC) + timedelta(minutes=5)
    again = pgq.enqueue(conn, "t", {"v": 2}, unique_key="k", replace=True, start_at=later,
                        priority=7)  # fmt: skip
    assert again == first
    rec = get(conn, first)
    assert (rec.payload, rec.priority, rec.state) == ({"v": 2}, 7, pgq.JobState.PENDING)
    assert abs((rec.start_at - later).total_seconds()) < 0.01
    assert count_rows(conn, "job") == 1
    # without replace, the key's holder is kept as it is (as before)
    assert pgq.enqueue(conn, "t", {"v": 3}, unique_key="k") == first
    assert get(conn, first).payload == {"v": 2}


def test_a_running_holder_is_untouched_and_the_new_job_waits_behind_it(conn: Conn) -> None:
    running_id = pgq.enqueue(conn, "t", {"v": 1}, unique_key="k", replace=True)
    running = claim_one(conn, "t", worker_id="w")
    behind = pgq.enqueue(conn, "t", {"v": 2}, unique_key="k", replace=True)
    assert behind != running_id
    # later enqueues replace the one that waits, never the running one
    assert pgq.enqueue(conn, "t", {"v": 3}, unique_key="k", replace=True) == behind
    assert get(conn, running_id).payload == {"v": 1}
    waiting = get(conn, behind)
    assert (waiting.payload, waiting.waiting_on, waiting.debounce_key) == ({"v": 3}, 1, "k")
    assert "waits behind running job" in str(held_back(waiting))
    assert testing.drain(conn, registry).outcomes == []  # it cannot run yet
    pgq.cancel_job(conn, running.id)  # however the running one ends, the waiting one runs
    assert testing.drain(conn, registry).succeeded == 1
    assert get(conn, behind).result == {"v": 3}


def test_with_drop_a_running_holder_swallows_the_new_job(conn: Conn) -> None:
    running_id = pgq.enqueue(conn, "t", {"v": 1}, unique_key="k", replace=True)
    claim_one(conn, "t", worker_id="w")
    dropped = pgq.enqueue(conn, "t", {"v": 2}, unique_key="k", replace=True,
                          replace_running="drop")  # fmt: skip
    assert dropped == running_id
    assert count_rows(conn, "job") == 1
    assert get(conn, running_id).payload == {"v": 1}


def test_the_async_enqueue_debounces_too(dsn: str, conn: Conn) -> None:
    first = pgq.enqueue(conn, "t", {"v": 1}, unique_key="k", replace=True)

    async def go() -> pgq.JobId:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await pgq.enqueue_async(aconn, "t", {"v": 2}, unique_key="k", replace=True)

    assert asyncio.run(go()) == first
    assert get(conn, first).payload == {"v": 2}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replace": True}, "needs a unique_key"),
        ({"replace": True, "unique_key": "k", "unique_for": 5}, "cannot be combined"),
        ({"replace": True, "unique_key": "k", "replace_running": "x"}, "'wait' or 'drop'"),
    ],
)
def test_bad_debounce_options_are_refused(
    conn: Conn, options: dict[str, object], message: str
) -> None:
    with pytest.raises(pgq.InvalidInput, match=message):
        pgq.enqueue(conn, "t", **options)  # type: ignore[arg-type]
    with pytest.raises(pgq.InvalidInput, match="not enqueue_many"):
        pgq.enqueue_many(conn, [pgq.NewJob("t", unique_key="k", replace=True)])
    assert count_rows(conn, "job") == 0


def test_racing_producers_and_a_claiming_worker_keep_one_job_per_key_state(
    dsn: str, conn: Conn
) -> None:
    """Producers debounce one key while a worker claims and finishes jobs: at no time are
    there two pending jobs for the key (without the key's lock, two producers that both find
    the holder running both insert a job to wait behind it), and every job ends run."""
    stop = threading.Event()
    # the helper threads hand back what they saw and any error: one that died early would
    # leave the checks below with nothing to check
    pending: list[int] = []  # every count of the key's pending jobs the watcher read
    ran = [0]  # the jobs the worker ran
    errors: list[BaseException] = []

    def watch() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as w:
                while not stop.is_set():
                    row = w.execute(
                        "SELECT count(*) FROM pgq.job"
                        " WHERE state = 'pending' AND coalesce(unique_key, debounce_key) = 'k'"
                    ).fetchone()
                    assert row is not None
                    pending.append(row[0])
        except BaseException as exc:
            errors.append(exc)

    def work() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as w:
                while not stop.is_set():
                    ran[0] += testing.drain(w, registry, batch=1).succeeded
        except BaseException as exc:
            errors.append(exc)

    def produce(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as p:
            for n in range(40):
                pgq.enqueue(p, "t", {"p": i, "n": n}, unique_key="k", replace=True)

    helpers = [threading.Thread(target=watch), threading.Thread(target=work)]
    for h in helpers:
        h.start()
    try:
        in_threads(4, produce)
    finally:
        stop.set()
        for h in helpers:
            h.join(timeout=30)
    assert errors == []
    assert len(pending) > 10 and max(pending) <= 1, pending
    assert ran[0] > 0, "the worker never ran a job while the producers raced"
    testing.drain(conn, registry)
    rows = conn.execute("SELECT count(*) FROM pgq.job WHERE state <> 'succeeded'").fetchone()
    assert rows is not None and rows[0] == 0
