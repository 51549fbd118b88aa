"""A worker cut off from its database: it backs off, reconnects when it can, loses nothing, and
a Stop from the supervisor wakes it from a backoff sleep.

The Worker runs on a thread of the test process, with a real pipe and a real database; the
database refuses new connections (ALLOW_CONNECTIONS false) while its sessions are cut.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection

import pytest

import pgq_supervisor as pgq
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.db import Conn
from pgq_supervisor.ipc import Idle, JobSlot, Ready, Stop, Wake
from pgq_supervisor.worker.main import connect_retrying
from pgq_supervisor.worker.sync import Worker
from tests.support.db import count_rows
from tests.support.specs import child_spec
from tests.support.waiting import DEADLINE, until

registry = pgq.Registry()


@registry.handler("t")
def noop(payload: dict[str, int]) -> None:
    return None


def _expect(pipe: Connection, kind: type) -> None:
    assert pipe.poll(DEADLINE), f"no {kind.__name__} from the worker"
    msg = pipe.recv()
    assert isinstance(msg, kind), msg


@contextmanager
def _worker(dsn: str, **backoffs: Backoff) -> Iterator[tuple[Connection, threading.Thread]]:
    ours, theirs = multiprocessing.Pipe()
    conn, heartbeat_conn = connect_retrying(dsn, 5.0, synchronous_commit=False)
    worker = Worker(
        child_spec(dsn), registry, theirs, JobSlot(), conn,
        error_backoff=backoffs.get("error_backoff"),
        connect_backoff=backoffs.get("connect_backoff"),
        heartbeat_conn=heartbeat_conn,
    )  # fmt: skip
    thread = threading.Thread(target=worker.run, name="test-worker", daemon=True)
    thread.start()
    try:
        _expect(ours, Ready)
        _expect(ours, Idle)  # nothing to do yet
        yield ours, thread
    finally:
        if thread.is_alive():
            ours.send(Stop())
            thread.join(DEADLINE)
        ours.close()


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in r.getMessage() for r in list(caplog.records))


def test_worker_reconnects_after_an_outage_and_runs_every_job_once(
    conn: Conn, dsn: str, gate: Callable[[bool], None], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with _worker(dsn) as (pipe, _):
        gate(False)
        pgq.enqueue_many(conn, [pgq.NewJob("t", {"n": n}) for n in range(50)])
        pipe.send(Wake(time.monotonic()))
        until(lambda: _logged(caplog, "cannot connect, next try in"), "a failed reconnect")
        assert count_rows(conn, where="state = 'pending'") == 50
        gate(True)
        until(lambda: count_rows(conn, where="state = 'succeeded'") == 50, "every job done")
        assert _logged(caplog, "reconnected")
        assert count_rows(conn, where="attempts <> '[]'") == 0  # each ran once


def test_stop_wakes_a_worker_from_its_reconnect_backoff(
    dsn: str, gate: Callable[[bool], None], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    long_wait = Backoff(initial=60.0, maximum=60.0)
    with _worker(dsn, connect_backoff=long_wait) as (pipe, thread):
        gate(False)
        pipe.send(Wake(time.monotonic()))
        until(lambda: _logged(caplog, "next try in"), "a failed reconnect")
        stopped_at = time.monotonic()
        pipe.send(Stop())
        thread.join(DEADLINE)
        assert not thread.is_alive()
        assert time.monotonic() - stopped_at < 10  # not the 60 s backoff
