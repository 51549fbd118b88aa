"""A supervisor's session lock (schema/0016): when its session ends, another supervisor's
rescuer takes back the running jobs of its children once their heartbeat has gone quiet too
(`quiet`: 1.5 heartbeat intervals), without waiting for dead_after; while anyone holds the
lock, or the row never said it held one, or the children still beat, nothing is taken."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import EndedAttempt, JobId
from pgq_supervisor.supervisor.listener import Listener
from pgq_supervisor.supervisor.maintenance.rescuer import Rescuer
from tests.support.db import claim_one, get, raw_row
from tests.support.waiting import wait_for

S = "pgq"
DEAD = "pod-a:1:0000aaaa"  # the supervisor that dies
# quiet: the heartbeats of jobs claimed a moment ago are old enough almost at once
RESCUER = Rescuer(S, dead_after=30, quiet=0.05)


def register(conn: Conn, id_: str, *, locked_on: str | None) -> None:
    db.register_supervisor(
        conn, S, id=id_, host="pod", pid=1, procs=2, types=["t"],
        started_at=datetime.now(UTC), children=[], locked_on=locked_on,
    )  # fmt: skip


def epoch(conn: Conn) -> str:
    row = conn.execute("SELECT pgq.server_epoch()").fetchone()
    assert row is not None and isinstance(row[0], str)
    return row[0]


def running_under(conn: Conn, worker_id: str) -> JobId:
    job_id = pgq.enqueue(conn, "t")
    assert claim_one(conn, "t", worker_id=worker_id).id == job_id
    return job_id


@pytest.fixture
def session(dsn: str) -> Iterator[Conn]:
    """The dead-to-be supervisor's LISTEN session, holding its lock."""
    with psycopg.connect(dsn, autocommit=True) as c:
        assert db.take_supervisor_lock(c, S, DEAD) == epoch(c)
        yield c


def test_a_freed_lock_gives_back_the_running_jobs_of_that_supervisor_only(
    conn: Conn, session: Conn
) -> None:
    register(conn, DEAD, locked_on=epoch(conn))
    register(conn, "pod-b:1:0000bbbb", locked_on=None)  # never said it held a lock
    mine = [running_under(conn, f"{DEAD}:{i}:0000000{i}") for i in range(2)]
    # a longer id that starts with the dead one's: another supervisor's child
    other = running_under(conn, f"{DEAD}0:0:00000000")
    pending = pgq.enqueue(conn, "t")
    untouched = {i: raw_row(conn, i) for i in (other, pending)}

    assert RESCUER.run_orphans(conn, me="pod-c:1:0000cccc").ended == ()  # held: alive
    session.close()  # the process died: PostgreSQL ends its session, and frees the lock

    ended: list[EndedAttempt] = []

    def both_taken() -> bool:  # each once its own beat is older than quiet
        ended.extend(RESCUER.run_orphans(conn, me="pod-c:1:0000cccc").ended)
        return len(ended) >= 2

    wait_for("the freed lock", both_taken)
    assert sorted((e.job_id, e.new_state, e.retry_count) for e in ended) == sorted(
        (i, pgq.JobState.PENDING, 1) for i in mine
    )
    for job_id in mine:
        job = get(conn, job_id)
        assert job.state is pgq.JobState.PENDING and job.worker_id is None
        last = job.attempts[-1]
        assert isinstance(last, dict) and last["kind"] == "rescued"
        assert last["error"] == "worker died: its supervisor's database session ended"
    assert {i: raw_row(conn, i) for i in (other, pending)} == untouched
    # its row went with its jobs; the one whose lock was never held stays
    assert [s.id for s in db.list_supervisors(conn, S)] == ["pod-b:1:0000bbbb"]
    assert RESCUER.run_orphans(conn, me="pod-c:1:0000cccc").ended == ()


def test_a_freed_lock_leaves_the_jobs_whose_heartbeat_is_fresh_and_the_row(
    conn: Conn, session: Conn
) -> None:
    """The pod lives on (its LISTEN session was ended by the server, a proxy or a pooler, or
    only its supervisor process died): its children still beat, so they keep their jobs."""
    register(conn, DEAD, locked_on=epoch(conn))
    job_id = running_under(conn, f"{DEAD}:0:00000000")
    session.close()
    wait_for("the lock freed", lambda: db.supervisors_gone(conn, S, me="x") == [DEAD])
    beating = Rescuer(S, dead_after=30, quiet=3600)  # every beat is younger than that
    assert beating.run_orphans(conn, me="pod-c:1:0000cccc").ended == ()
    assert get(conn, job_id).state is pgq.JobState.RUNNING
    # the row stays, so the next look judges it again once the beats stop
    assert [r.id for r in db.list_supervisors(conn, S)] == [DEAD]
    ended = wait_for("the beat gone quiet", lambda: RESCUER.run_orphans(conn, me="x").ended)
    assert [(e.job_id, e.new_state) for e in ended] == [(job_id, pgq.JobState.PENDING)]
    assert db.list_supervisors(conn, S) == []


def test_a_row_without_a_lock_in_this_epoch_is_left_to_the_heartbeat_timeout(
    conn: Conn,
) -> None:
    job_id = running_under(conn, f"{DEAD}:0:00000000")
    register(conn, DEAD, locked_on=None)  # an older version, or its LISTEN connection was down
    assert RESCUER.run_orphans(conn, me="pod-c:1:0000cccc").ended == ()
    # locked before a restart or a failover freed every lock: until it says it holds it again
    register(conn, DEAD, locked_on="2026-01-01 00:00:00+00 timeline 00000001")
    assert RESCUER.run_orphans(conn, me="pod-c:1:0000cccc").ended == ()
    assert get(conn, job_id).state is pgq.JobState.RUNNING


def test_a_lock_taken_back_by_a_new_session_keeps_the_jobs(conn: Conn, dsn: str) -> None:
    register(conn, DEAD, locked_on=epoch(conn))
    job_id = running_under(conn, f"{DEAD}:0:00000000")
    with psycopg.connect(dsn, autocommit=True) as reconnected:
        assert db.take_supervisor_lock(reconnected, S, DEAD)
        assert db.supervisors_gone(conn, S, me="x") == []
        # even when the look said gone, the rescue checks again in its own statement
        assert db.rescue_orphans(conn, S, [DEAD], quiet=0.0) == []
    assert get(conn, job_id).state is pgq.JobState.RUNNING


def test_nobody_judges_itself(conn: Conn) -> None:
    register(conn, DEAD, locked_on=epoch(conn))  # and nobody holds its lock
    assert db.supervisors_gone(conn, S, me=DEAD) == []
    assert db.supervisors_gone(conn, S, me="x") == [DEAD]


def test_a_second_session_cannot_take_a_held_lock(session: Conn, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as other:
        assert db.take_supervisor_lock(other, S, DEAD) is None
        assert db.take_supervisor_lock(other, S, "pod-b:1:0000bbbb")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_listener_takes_the_lock_again_after_its_connection_is_lost(
    conn: Conn, dsn: str
) -> None:
    clock = Clock()
    listener = Listener(dsn, clock=clock, lock=(S, DEAD))
    try:
        assert listener.connect() and listener.locked_on == epoch(conn)
        assert db.supervisors_gone(conn, S, me="x") == []
        pid = listener_pid(conn)
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))  # an administrator, a blip
        wait_for("the break seen", lambda: (listener.read(), not listener.connected)[1])
        assert listener.locked_on is None  # the row it writes next says so
        assert listener.connect() and listener.locked_on == epoch(conn)
    finally:
        listener.close()


def test_a_lock_an_earlier_session_still_holds_is_taken_once_it_is_free(
    conn: Conn, session: Conn
) -> None:
    clock = Clock()
    listener = Listener(conn.info.dsn, clock=clock, lock=(S, DEAD))
    try:
        assert listener.connect() and listener.locked_on is None  # `session` holds it
        session.close()
        clock.now += 0.5
        listener.connect()  # connected already: tries the lock again, at most once a second
        assert listener.locked_on is None

        def retry() -> str | None:
            clock.now += 1.0  # the ended session's lock is freed as its backend exits
            listener.connect()
            return listener.locked_on

        wait_for("the lock", retry)
        assert listener.locked_on == epoch(conn)
    finally:
        listener.close()


def listener_pid(conn: Conn) -> int:
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgq-supervisor-listen'"
        " AND datname = current_database()"
    ).fetchone()
    assert row is not None and isinstance(row[0], int)
    return row[0]
