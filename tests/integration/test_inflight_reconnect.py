"""A child with many jobs in flight (inflight.py) cut off from its database: it backs off,
reconnects when it can, and every job still ends once; a Stop ends it during the outage. Its
reconnect policy is the one of base.BaseWorker: retry with the jittered backoff until connected
(or told to stop), nothing else tried meanwhile.

The InFlightWorker runs its loop on a thread of the test process, with a real pipe and a real
database, which refuses new connections (ALLOW_CONNECTIONS false) while its sessions are cut.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import pgq_supervisor as pgq
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.db import Conn
from pgq_supervisor.ipc import Idle, JobSlot, Ready, Stop, Wake
from pgq_supervisor.worker.base import connect_child
from pgq_supervisor.worker.inflight import InFlightWorker
from pgq_supervisor.worker.main import connect_retrying
from tests.support.db import count_rows
from tests.support.specs import child_spec
from tests.support.waiting import DEADLINE, until

registry = pgq.Registry()


@registry.handler("a")
async def nap(payload: dict[str, float]) -> None:
    await asyncio.sleep(payload.get("seconds", 0.01))  # the job's simulated async I/O


def _expect(pipe: Connection, kind: type) -> None:
    assert pipe.poll(DEADLINE), f"no {kind.__name__} from the worker"
    msg = pipe.recv()
    assert isinstance(msg, kind), msg


@contextmanager
def _worker(
    dsn: str,
    error_backoff: Backoff | None = None,
    connect_backoff: Backoff | None = None,
    connect: Callable[[], Conn] | None = None,
) -> Iterator[tuple[Connection, threading.Thread]]:
    ours, theirs = multiprocessing.Pipe()
    conn, heartbeat_conn = connect_retrying(dsn, 5.0, synchronous_commit=False)
    slot = JobSlot(capacity=10)
    worker = InFlightWorker(
        child_spec(dsn, types=("a",), concurrency=10), registry, theirs, slot, conn,
        error_backoff=error_backoff, connect_backoff=connect_backoff, connect=connect,
        heartbeat_conn=heartbeat_conn,
    )  # fmt: skip
    thread = threading.Thread(target=worker.run, name="test-inflight", daemon=True)
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


def test_many_in_flight_reconnects_after_an_outage_and_runs_every_job_once(
    conn: Conn, dsn: str, gate: Callable[[bool], None], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with _worker(dsn) as (pipe, _):
        gate(False)
        pgq.enqueue_many(conn, [pgq.NewJob("a", {"seconds": 0.01}) for _ in range(50)])
        pipe.send(Wake(time.monotonic()))
        until(lambda: _logged(caplog, "cannot connect"), "a failed reconnect")
        assert count_rows(conn, where="state = 'pending'") == 50
        gate(True)
        until(lambda: count_rows(conn, where="state = 'succeeded'") == 50, "every job done")
        assert _logged(caplog, "reconnected")
        assert count_rows(conn, where="attempts <> '[]'") == 0  # each ran once


@pytest.fixture
def refused_dsn(dsn: str) -> Iterator[str]:
    """The test database's DSN on a local port that refuses connections (bound, not listening)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        yield f"{dsn} host=127.0.0.1 port={port} connect_timeout=2"


def _cut_job_connection(server_dsn: str, dsn: str) -> None:
    """End the worker's job connection (not its heartbeat's); new connections stay allowed."""
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND application_name = 'pgq-worker'",
            (str(conninfo_to_dict(dsn)["dbname"]),),
        )


def test_a_lost_connection_is_retried_with_the_backoff_until_it_connects(
    conn: Conn, server_dsn: str, dsn: str, refused_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    attempts: list[str] = []

    def connect() -> Conn:
        """Three real failures (a port that refuses), then the real database."""
        attempts.append("refused" if len(attempts) < 3 else "ok")
        target = refused_dsn if attempts[-1] == "refused" else dsn
        return connect_child(child_spec(target, types=("a",), concurrency=10), "pgq-worker")

    fast = Backoff(initial=0.01, maximum=0.05)
    with _worker(dsn, error_backoff=fast, connect_backoff=fast, connect=connect) as (pipe, _):
        _cut_job_connection(server_dsn, dsn)
        pgq.enqueue_many(conn, [pgq.NewJob("a", {"seconds": 0.01}) for _ in range(20)])
        pipe.send(Wake(time.monotonic()))
        until(lambda: count_rows(conn, where="state = 'succeeded'") == 20, "every job done")
    assert attempts == ["refused", "refused", "refused", "ok"]
    # one database error (the claim on the lost connection), then only the reconnect's
    # backoff: no claim tried on a closed connection between the attempts
    errors = [r for r in caplog.records if "database error" in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert sum("cannot connect, next try in" in r.getMessage() for r in caplog.records) == 3
    assert _logged(caplog, "reconnected")
    assert count_rows(conn, where="attempts <> '[]'") == 0  # each ran once


@pytest.mark.parametrize("long", ["error_backoff", "connect_backoff"])
def test_stop_wakes_a_worker_from_its_backoff(
    long: str, server_dsn: str, dsn: str, refused_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Stop ends the 60 s sleep after a database error, or between reconnect attempts."""
    caplog.set_level(logging.INFO)
    backoffs = {"error_backoff": Backoff(initial=0.01, maximum=0.01)} | {
        long: Backoff(initial=60.0, maximum=60.0)
    }

    def connect() -> Conn:
        return connect_child(child_spec(refused_dsn, types=("a",), concurrency=10), "pgq-worker")

    with _worker(dsn, connect=connect, **backoffs) as (pipe, thread):
        _cut_job_connection(server_dsn, dsn)
        pipe.send(Wake(time.monotonic()))
        waiting = "database error" if long == "error_backoff" else "next try in"
        until(lambda: _logged(caplog, waiting), f"a {long} sleep")
        stopped_at = time.monotonic()
        pipe.send(Stop())
        thread.join(DEADLINE)
        assert not thread.is_alive()
        assert time.monotonic() - stopped_at < 10, f"the 60 s {long} ignored the Stop"
