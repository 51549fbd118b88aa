"""pgq.Snooze: the job goes back to pending after the delay, no attempt counted, each snooze
in its history; past the type's max_snoozes it fails. Through the one completer, in drain (the
sync path), an async handler, and a `conn` handler's transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db, testing
from pgq_supervisor.db import Conn
from pgq_supervisor.display import held_back
from pgq_supervisor.errors import ConfigError
from tests.support.db import get, make_due

S = "pgq"


def _kinds(rec: pgq.JobRecord) -> list[object]:
    return [a.get("kind") if isinstance(a, dict) else a for a in rec.attempts]


def _snoozing(max_snoozes: int = 3, *, returned: bool = False) -> pgq.Registry:
    registry = pgq.Registry()

    @registry.handler("poll", max_snoozes=max_snoozes, max_retry_count=1)
    def poll(payload: dict[str, int], job: pgq.Job) -> object:
        if payload.get("ready"):
            return {"attempt": job.attempt}
        if returned:
            return pgq.Snooze(60)
        raise pgq.Snooze(60)

    return registry


@pytest.mark.parametrize("returned", [False, True], ids=["raised", "returned"])
def test_a_snooze_puts_the_job_back_later_without_counting_an_attempt(
    conn: Conn, returned: bool
) -> None:
    job_id = pgq.enqueue(conn, "poll", {})
    drained = testing.drain(conn, _snoozing(returned=returned))
    assert drained.snoozed == 1 and [o.kind for o in drained.outcomes] == ["snoozed"]
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.PENDING
    assert rec.start_at > db.db_now(conn, S) + timedelta(seconds=50)
    assert (rec.current_retry_count, rec.snoozes) == (0, 1)
    assert (rec.started_at, rec.worker_id, rec.worker_alive_at, rec.error_msg) == (None,) * 4
    assert _kinds(rec) == ["snoozed"]
    entry = rec.attempts[0]
    assert isinstance(entry, dict) and (entry["attempt"], entry["delay"]) == (1, 60)
    assert held_back(rec) is not None and "snoozed" in str(held_back(rec))


def test_each_snooze_is_in_the_history_and_the_run_after_is_still_attempt_one(
    conn: Conn,
) -> None:
    job_id = pgq.enqueue(conn, "poll", {})
    registry = _snoozing()
    for _ in range(2):
        assert testing.drain(conn, registry).snoozed == 1
        make_due(conn, job_id)
    conn.execute("UPDATE pgq.job SET payload = '{\"ready\": 1}' WHERE id = %s", (job_id,))
    assert testing.drain(conn, registry).succeeded == 1
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.SUCCEEDED
    assert rec.result == {"attempt": 1}
    assert _kinds(rec) == ["snoozed", "snoozed"]
    assert [a.get("snooze") for a in rec.attempts if isinstance(a, dict)] == [1, 2]


def test_past_max_snoozes_the_job_fails_with_a_clear_error(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "poll", {})
    registry = _snoozing(max_snoozes=2)
    outcomes = []
    for _ in range(3):
        outcomes += [o.kind for o in testing.drain(conn, registry).outcomes]
        make_due(conn, job_id)
    assert outcomes == ["snoozed", "snoozed", "failed"]
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert rec.error_msg == (
        "Snooze: snoozed more than max_snoozes=2 times (the last asked for 60 s more)"
    )
    assert _kinds(rec) == ["snoozed", "snoozed", "permanent"]
    # a reset gives a fresh snooze budget along with the fresh retry budget
    pgq.reset_job(conn, job_id)
    assert get(conn, job_id).snoozes == 0
    assert testing.drain(conn, registry).snoozed == 1


def test_a_snooze_of_zero_seconds_is_due_at_once_and_max_snoozes_zero_fails_it(
    conn: Conn,
) -> None:
    registry = pgq.Registry()

    @registry.handler("again", max_snoozes=0)
    def again(payload: object) -> None:
        raise pgq.Snooze(0)

    job_id = pgq.enqueue(conn, "again")
    assert [o.kind for o in testing.drain(conn, registry).outcomes] == ["failed"]
    assert get(conn, job_id).current_retry_count == 0


def test_an_async_handler_snoozes_too(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("later")
    async def later(payload: object) -> None:
        raise pgq.Snooze(30)

    job_id = pgq.enqueue(conn, "later")
    assert testing.drain(conn, registry).snoozed == 1
    assert get(conn, job_id).snoozes == 1


def test_a_conn_handler_that_snoozes_has_its_writes_rolled_back(conn: Conn) -> None:
    conn.execute("CREATE TABLE side (n int)")
    registry = pgq.Registry()

    @registry.handler("writes")
    def writes(payload: object, conn: Conn) -> None:
        conn.execute("INSERT INTO side VALUES (1)")
        raise pgq.Snooze(30)

    job_id = pgq.enqueue(conn, "writes")
    assert testing.drain(conn, registry).snoozed == 1
    assert get(conn, job_id).state is pgq.JobState.PENDING
    row = conn.execute("SELECT count(*) FROM side").fetchone()
    assert row is not None and row[0] == 0


def test_a_snooze_whose_lease_was_lost_writes_nothing(conn: Conn) -> None:
    from tests.support.db import claim_one

    job_id = pgq.enqueue(conn, "t")
    job = claim_one(conn, "t", worker_id="w")
    pgq.reset_job(conn, job_id, force=True)
    assert db.snooze(conn, S, job_id, lease=job.lease, delay=5, max_snoozes=3, error="x") == []
    assert get(conn, job_id).snoozes == 0


@pytest.mark.parametrize("bad", [-1, float("nan"), "5", True])
def test_snooze_refuses_what_is_not_a_duration(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="Snooze"):
        pgq.Snooze(bad)  # type: ignore[arg-type]


def test_max_snoozes_must_be_a_count() -> None:
    with pytest.raises(ConfigError, match="max_snoozes must be an integer >= 0"):
        pgq.Registry().handler("x", max_snoozes=-1)
