"""pgq_job_due (schema/0026): every statement that makes jobs pending with a start_at in the
future says so, once per type, with the seconds until the earliest of them; nothing else
does. The supervisor's side (waking a child then) is tests/acceptance/test_due_wake.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind
from pgq_supervisor.supervisor.listener import DUE, parse_due
from tests.support.db import claim_one, make_due

S = "pgq"


@pytest.fixture
def due(dsn: str) -> Iterator[Conn]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"LISTEN {DUE}")
        yield conn


def heard(listener: Conn) -> list[tuple[float, str]]:
    """What was notified on pgq_job_due so far (all of it: a sentinel on the same channel,
    sent last, marks the end; notifications are delivered in commit order)."""
    listener.execute("SELECT pg_notify(%s, '0 sentinel')", (DUE,))
    out: list[tuple[float, str]] = []
    for note in listener.notifies(timeout=10.0):
        parsed = parse_due(note.payload)
        assert parsed is not None, note.payload
        if parsed[1] == "sentinel":
            return out
        out.append(parsed)
    raise AssertionError("the sentinel did not come back")


def test_enqueues_with_a_start_at_say_when_the_earliest_of_each_type_comes_due(
    conn: Conn, due: Conn
) -> None:
    now = db.db_now(conn, S)
    pgq.enqueue_many(
        conn,
        [
            pgq.NewJob("a", start_at=now + timedelta(seconds=30)),
            pgq.NewJob("a", start_at=now + timedelta(seconds=5)),
            pgq.NewJob("b", start_at=now + timedelta(seconds=60)),
            pgq.NewJob("c"),  # ready now: pgq_job_available's, not this channel's
        ],
    )
    got = sorted(heard(due), key=lambda d: d[1])
    assert [t for _, t in got] == ["a", "b"]
    assert 3 < got[0][0] <= 5 and 58 < got[1][0] <= 60
    pgq.enqueue(conn, "c")
    assert heard(due) == []


def test_a_retry_and_a_snooze_written_by_a_worker_say_so_and_a_drain_says_nothing(
    conn: Conn, due: Conn
) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("r"), pgq.NewJob("s"), pgq.NewJob("ok")])
    ok = claim_one(conn, "ok")
    db.succeed(conn, S, ok.lease, [(ok.id, None)])
    assert heard(due) == []  # a claim and a success: no delayed job

    retried = claim_one(conn, "r")
    db.end_attempt(conn, S, [retried.id], error="e", kind=AttemptKind.ERROR, lease=retried.lease,
                   delay=2.0)  # fmt: skip
    ((seconds, type_),) = heard(due)
    assert type_ == "r" and 1.0 < seconds <= 2.0

    snoozed = claim_one(conn, "s")
    db.snooze(conn, S, snoozed.id, lease=snoozed.lease, delay=0.5, max_snoozes=5, error="x")
    ((seconds, type_),) = heard(due)
    assert type_ == "s" and 0.0 <= seconds <= 0.5

    # a retry with no backoff is ready at once: nothing to announce
    make_due(conn, retried.id)  # (and an update that makes a job due announces nothing)
    again = claim_one(conn, "r")
    db.end_attempt(conn, S, [again.id], error="e", kind=AttemptKind.ERROR, lease=again.lease)
    assert heard(due) == []
