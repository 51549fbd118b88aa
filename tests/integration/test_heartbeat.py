"""The heartbeat thread's beats and its reconnects: after a failure it backs off, with jitter."""

from __future__ import annotations

import random
import time

import psycopg
from psycopg.conninfo import make_conninfo

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.db import Conn
from pgq_supervisor.worker.heartbeat import Heartbeat
from tests.support.db import age_heartbeat, claim_one, get
from tests.support.waiting import wait_for

S = "pgq"
APP = "pgq-heartbeat-test"


def _alive_at_age(conn: Conn, job: pgq.Job) -> float:
    row = conn.execute(
        "SELECT extract(epoch FROM now() - pgq.job_alive_at(state, worker_alive_at, worker_id))"
        "::float8 FROM pgq.job WHERE id = %s",
        (job.id,),
    ).fetchone()
    assert row is not None
    return float(row[0])


def test_beats_keep_held_jobs_alive_and_stop_at_drop(conn: Conn, dsn: str) -> None:
    pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    age_heartbeat(conn, job.id, 60)
    hb = Heartbeat(lambda: db.connect(dsn, application_name=APP), S, 5.0, "worker-1")
    try:
        hb.hold(job.lease, [job.id])
        assert hb.tick() == 5.0
        assert _alive_at_age(conn, job) < 30
        hb.drop(job.lease, [job.id])
        age_heartbeat(conn, job.id, 60)
        assert hb.beat_once() == 0
        assert _alive_at_age(conn, job) >= 60
    finally:
        hb.stop()


def test_unreachable_server_backs_off_with_jitter_then_beats_again(conn: Conn, dsn: str) -> None:
    pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    age_heartbeat(conn, job.id, 60)
    unreachable = make_conninfo(dsn, host="127.0.0.1", port=1)  # nothing listens: refused
    attempts: list[str] = []

    def connect() -> Conn:
        target = unreachable if len(attempts) < 3 else dsn
        attempts.append(target)
        return db.connect(target, application_name=APP)

    backoff = Backoff(initial=0.5, maximum=5.0, jitter=0.25, rng=random.Random(7))
    hb = Heartbeat(connect, S, 5.0, "worker-1", backoff=backoff)
    try:
        hb.hold(job.lease, [job.id])
        delays = [hb.tick() for _ in range(3)]
        for delay, nominal in zip(delays, [0.5, 1.0, 2.0], strict=True):
            assert nominal * 0.75 <= delay <= nominal * 1.25
        assert _alive_at_age(conn, job) >= 60  # nothing was written meanwhile
        assert hb.tick() == 5.0  # connected: back to the interval
        assert _alive_at_age(conn, job) < 30
        assert hb.tick() == 5.0
        assert len(attempts) == 4  # one connection, kept while it works
    finally:
        hb.stop()


def test_default_backoff_never_waits_longer_than_a_beat(conn: Conn, dsn: str) -> None:
    pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    unreachable = make_conninfo(dsn, host="127.0.0.1", port=1)
    hb = Heartbeat(lambda: db.connect(unreachable), S, 2.0, "worker-1")
    try:
        hb.hold(job.lease, [job.id])
        delays = [hb.tick() for _ in range(8)]
        assert delays[0] < 1.0 and all(0 < d <= 2.0 for d in delays)
        assert len({round(d, 9) for d in delays}) > 1
    finally:
        hb.stop()


def test_a_connection_lost_between_beats_is_made_again(conn: Conn, dsn: str) -> None:
    pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    hb = Heartbeat(lambda: db.connect(dsn, application_name=APP), S, 5.0, "worker-1")
    try:
        hb.hold(job.lease, [job.id])
        assert hb.tick() == 5.0
        with psycopg.connect(dsn, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (APP,),
            ).fetchall()
        assert killed == [(True,)]
        assert hb.tick() < 5.0  # the beat failed: a short, jittered wait
        age_heartbeat(conn, job.id, 60)
        assert hb.tick() == 5.0
        assert _alive_at_age(conn, job) < 30
        assert get(conn, job.id).state is pgq.JobState.RUNNING
    finally:
        hb.stop()


def test_jobs_no_beat_reaches_are_given_up_before_dead_after(conn: Conn, dsn: str) -> None:
    """Issue 27: the heartbeat cannot reconnect (no slot left): once its held jobs have gone
    `give_up_after` without a beat, it says so, once; a beat that lands puts that off."""
    pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    reachable = [True]
    unreachable = make_conninfo(dsn, host="127.0.0.1", port=1)
    given_up: list[float] = []

    def connect() -> Conn:
        return db.connect(dsn if reachable[0] else unreachable, application_name=APP)

    hb = Heartbeat(
        connect, S, 0.1, "worker-1", give_up_after=0.6,
        on_give_up=lambda: given_up.append(time.monotonic()),
    )  # fmt: skip
    hb.hold(job.lease, [job.id])
    held_at = time.monotonic()
    hb.start()
    try:
        # held past give_up_after, with beats landing all along: nothing is given up
        wait_for(
            "held past give_up_after, kept fresh",
            lambda: time.monotonic() - held_at > 1.0 and hb.stale_for(time.monotonic()) < 0.5,
        )
        assert given_up == [] and _alive_at_age(conn, job) < 0.5
        reachable[0] = False
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (APP,),
            )
        lost_at = time.monotonic()
        wait_for("given up", lambda: given_up, timeout=5)
        assert not hb.up and hb.given_up
        # no sooner than give_up_after after the last beat that landed (before the kill)
        assert given_up[0] - lost_at < 0.6 + 0.5 and given_up[0] - held_at > 0.6
    finally:
        hb.stop()
    assert len(given_up) == 1
