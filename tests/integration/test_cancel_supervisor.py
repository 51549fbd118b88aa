"""The real Supervisor loop stops the child whose job was cancelled: by the notification, by
the poll when the notification was missed; a death that counts no attempt."""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable

import pytest

import pgq_supervisor as pgq
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobState
from pgq_supervisor.registry import RetryPolicy
from pgq_supervisor.settings import load_settings
from pgq_supervisor.supervisor.children import CANCELLED, KILL_GRACE, ChildState
from pgq_supervisor.supervisor.loop import Supervisor
from tests.support.db import claim, get
from tests.support.fakes import FakeChild, FakeClock, FakeSpawner, make_supervisor
from tests.support.waiting import DEADLINE


def _supervisor(dsn: str, spawner: FakeSpawner, clock: FakeClock) -> Supervisor:
    reg = pgq.Registry()

    @reg.handler("t", retry=RetryPolicy(base=0.0))
    def t(payload: object) -> None:
        return None

    # the poll never comes round on the fake clock unless a test moves it
    settings = load_settings(dsn=dsn, app="x:registry", procs=1, poll_interval=1000.0)
    sup = make_supervisor(settings, reg, spawner, clock)
    sup.run_once(0)
    assert sup.listener.connected
    return sup


def _turn_until(sup: Supervisor, what: str, done: Callable[[], bool]) -> None:
    """Turn the loop (real waits on the LISTEN socket) until `done()` is true."""
    end = time.monotonic() + DEADLINE
    while not done():
        assert time.monotonic() < end, f"never: {what}"
        sup.run_once(0.02)


def _sigterm_then_reaped(sup: Supervisor, spawner: FakeSpawner, clock: FakeClock) -> FakeChild:
    child = spawner.live()[0]
    _turn_until(sup, "SIGTERM", lambda: child.proc.signals == [signal.SIGTERM])
    assert sup.children[0].state is ChildState.TERMINATING
    assert sup.children[0].kill_reason == CANCELLED
    clock.now += KILL_GRACE + 0.1  # this fake ignores SIGTERM, as a hung child may
    sup.run_once(0)
    assert child.proc.signals == [signal.SIGTERM, signal.SIGKILL]
    sup.run_once(0)  # reaped and, as the death was asked for, respawned at once
    assert spawner.live()[0] is not child
    return child


def test_the_notification_stops_the_child_and_its_other_jobs_go_back_without_an_attempt(
    dsn: str, conn: Conn
) -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = _supervisor(dsn, spawner, clock)
    child = spawner.live()[0]
    first, second, third = pgq.enqueue_many(conn, [pgq.NewJob("t") for _ in range(3)])
    claim(conn, ["t"], worker_id=child.spec.worker_id, limit=3)
    child.start_job(first, "t", started=clock.now)

    assert pgq.cancel_job(conn, first) is JobState.RUNNING
    _sigterm_then_reaped(sup, spawner, clock)

    rec = get(conn, first)
    assert rec.state is JobState.CANCELLED and rec.current_retry_count == 0
    assert [a["kind"] for a in rec.attempts if isinstance(a, dict)] == ["cancelled"]
    for other in (second, third):
        released = get(conn, other)
        assert (released.state, released.attempts, released.current_retry_count) == (
            JobState.PENDING,
            [],
            0,
        )
    assert sup.metrics.registry.get_sample_value("pgq_worker_deaths_total", {"type": "t"}) is None
    sup.close()


def test_a_job_cancelled_before_it_starts_stops_the_child_only_when_it_starts(
    dsn: str, conn: Conn
) -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = _supervisor(dsn, spawner, clock)
    child = spawner.live()[0]
    first, second = pgq.enqueue_many(conn, [pgq.NewJob("t") for _ in range(2)])
    claim(conn, ["t"], worker_id=child.spec.worker_id, limit=2)
    child.start_job(first, "t", started=clock.now)

    pgq.cancel_job(conn, second)
    _turn_until(sup, "the cancel is marked", lambda: second in sup.children[0].cancelled)
    sup.run_once(0)
    assert child.proc.signals == []  # the job in hand is not the cancelled one
    child.start_job(second, "t", started=clock.now)
    _sigterm_then_reaped(sup, spawner, clock)
    assert get(conn, second).state is JobState.CANCELLED
    assert get(conn, first).state is JobState.PENDING  # in hand when killed: released
    sup.close()


def test_a_cancel_sent_while_the_listen_connection_is_down_is_found_on_reconnect(
    dsn: str, conn: Conn
) -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = _supervisor(dsn, spawner, clock)
    child = spawner.live()[0]
    job_id = pgq.enqueue(conn, "t")
    claim(conn, ["t"], worker_id=child.spec.worker_id)
    child.start_job(job_id, "t", started=clock.now)
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'pgq-supervisor-listen' AND datname = current_database()"
    )
    pgq.cancel_job(conn, job_id)  # its notification goes nowhere
    _sigterm_then_reaped(sup, spawner, clock)
    sup.close()


def test_the_poll_finds_a_cancel_whose_notification_never_came(dsn: str, conn: Conn) -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = _supervisor(dsn, spawner, clock)
    child = spawner.live()[0]
    job_id = pgq.enqueue(conn, "t")
    claim(conn, ["t"], worker_id=child.spec.worker_id)
    child.start_job(job_id, "t", started=clock.now)
    # the cancel's writes without its notification
    conn.execute(
        "UPDATE pgq.job SET state = 'cancelled', stopped_at = now(), worker_alive_at = NULL,"
        " lease = NULL WHERE id = %s",
        (job_id,),
    )
    for _ in range(5):
        sup.run_once(0.02)
    assert child.proc.signals == []  # nothing told it yet
    clock.now += 1000.0 * 1.2  # the poll interval, jitter included
    _sigterm_then_reaped(sup, spawner, clock)
    sup.close()


def test_a_cancel_notification_for_a_job_not_cancelled_stops_nothing(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """A notification is a hint anyone may send: the job must be cancelled in the database."""
    spawner, clock = FakeSpawner(), FakeClock()
    sup = _supervisor(dsn, spawner, clock)
    child = spawner.live()[0]
    job_id = pgq.enqueue(conn, "t")
    claim(conn, ["t"], worker_id=child.spec.worker_id)
    child.start_job(job_id, "t", started=clock.now)
    payload = json.dumps({"job_id": str(job_id), "worker_id": child.spec.worker_id})
    caplog.set_level(logging.DEBUG, logger="pgq_supervisor.supervisor.cancels")
    conn.execute("SELECT pg_notify('pgq_job_cancel', %s)", (payload,))
    _turn_until(sup, "the notification read", lambda: f"job id={job_id}: not" in caplog.text)
    sup.run_once(0)
    assert child.proc.signals == [] and job_id not in sup.children[0].cancelled
    assert get(conn, job_id).state is JobState.RUNNING
    pgq.cancel_job(conn, job_id)  # the real one, with the same payload
    _sigterm_then_reaped(sup, spawner, clock)
    sup.close()
