"""Failed attempts: retry with backoff, keep every error, fail when exhausted or permanent."""

from __future__ import annotations

import random
from datetime import timedelta

import pydantic

import pgq_supervisor as pgq
from pgq_supervisor import db, testing
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JsonValue
from tests.support.db import claim_one, count_rows, get, listening, make_due

S = "pgq"


def _one_minute(attempt: int, rng: random.Random) -> float:
    return 60.0


def _flaky_registry(max_retry_count: int) -> pgq.Registry:
    registry = pgq.Registry()

    @registry.handler("flaky", max_retry_count=max_retry_count, retry=_one_minute)
    def flaky(payload: dict[str, int], job: pgq.Job) -> None:
        raise RuntimeError(f"boom on attempt {job.attempt}")

    return registry


def _errors(attempts: list[JsonValue]) -> list[str]:
    out = []
    for entry in attempts:
        assert isinstance(entry, dict)
        error = entry["error"]
        assert isinstance(error, str)
        out.append(error)
    return out


def test_retry_goes_back_to_pending_later_and_keeps_every_error(conn: Conn) -> None:
    registry = _flaky_registry(max_retry_count=2)
    job_id = pgq.enqueue(conn, "flaky", {"n": 1})

    drained = testing.drain(conn, registry)
    assert [o.kind for o in drained.outcomes] == ["retried"]
    rec = get(conn, job_id)
    now = db.db_now(conn, S)
    assert rec.state is pgq.JobState.PENDING
    assert rec.start_at > now + timedelta(seconds=50)
    assert rec.current_retry_count == 1
    assert rec.max_retry_count == 2
    assert (rec.started_at, rec.stopped_at, rec.worker_alive_at, rec.worker_id) == (None,) * 4
    assert rec.error_msg == "RuntimeError: boom on attempt 1"
    assert _errors(rec.attempts) == ["RuntimeError: boom on attempt 1"]
    first = rec.attempts[0]
    assert isinstance(first, dict)
    assert (first["attempt"], first["kind"]) == (1, "error")
    assert isinstance(first["worker"], str) and first["worker"].startswith("testing:")
    assert isinstance(rec.error_data, dict) and "traceback" in rec.error_data

    # not due yet: a drain finds nothing to run
    assert testing.drain(conn, registry).outcomes == []
    assert get(conn, job_id).current_retry_count == 1

    make_due(conn, job_id)
    assert [o.kind for o in testing.drain(conn, registry).outcomes] == ["retried"]
    rec = get(conn, job_id)
    assert rec.current_retry_count == 2
    assert _errors(rec.attempts) == [
        "RuntimeError: boom on attempt 1",
        "RuntimeError: boom on attempt 2",
    ]

    make_due(conn, job_id)
    assert [o.kind for o in testing.drain(conn, registry).outcomes] == ["failed"]
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert rec.current_retry_count == 2  # 3 attempts = 1 + max_retry_count
    assert rec.stopped_at is not None and rec.worker_alive_at is None
    assert rec.error_msg == "RuntimeError: boom on attempt 3"
    assert [e["attempt"] for e in rec.attempts if isinstance(e, dict)] == [1, 2, 3]
    assert _errors(rec.attempts)[0] == "RuntimeError: boom on attempt 1"

    make_due(conn, job_id)
    assert testing.drain(conn, registry).outcomes == []  # failed stays failed


def test_no_retries_left_fails_at_once(conn: Conn) -> None:
    registry = _flaky_registry(max_retry_count=0)
    job_id = pgq.enqueue(conn, "flaky")
    assert testing.drain(conn, registry).failed == 1
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert rec.current_retry_count == 0
    assert len(rec.attempts) == 1


def test_jobs_own_retry_budget_beats_the_handler_default(conn: Conn) -> None:
    registry = _flaky_registry(max_retry_count=5)
    job_id = pgq.enqueue(conn, "flaky", max_retry_count=0)
    assert testing.drain(conn, registry).failed == 1
    assert get(conn, job_id).state is pgq.JobState.FAILED


def test_permanent_error_fails_without_retry(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("charge", max_retry_count=5)
    def charge(payload: dict[str, int]) -> None:
        raise pgq.PermanentError("card declined", data={"code": 51})

    job_id = pgq.enqueue(conn, "charge", {"amount": 10})
    assert [o.kind for o in testing.drain(conn, registry).outcomes] == ["failed"]
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert rec.current_retry_count == 0
    assert rec.error_msg == "PermanentError: card declined"
    assert rec.error_data == {"exception": "PermanentError", "data": {"code": 51}}
    assert len(rec.attempts) == 1
    entry = rec.attempts[0]
    assert isinstance(entry, dict) and entry["kind"] == "permanent"


class Resize(pydantic.BaseModel):
    path: str
    width: int


def test_invalid_payload_fails_at_once_naming_the_field(conn: Conn) -> None:
    registry = pgq.Registry()
    calls: list[Resize] = []

    @registry.handler("resize", max_retry_count=5)
    def resize(payload: Resize) -> None:
        calls.append(payload)

    bad = pgq.enqueue(conn, "resize", {"path": "a.png", "width": "wide"})
    good = pgq.enqueue(conn, "resize", {"path": "b.png", "width": 10})
    result = testing.drain(conn, registry)
    assert sorted(o.kind for o in result.outcomes) == ["failed", "succeeded"]
    assert calls == [Resize(path="b.png", width=10)]
    rec = get(conn, bad)
    assert rec.state is pgq.JobState.FAILED
    assert rec.current_retry_count == 0
    assert rec.error_msg is not None
    assert "InvalidInput" in rec.error_msg and "width" in rec.error_msg
    assert get(conn, good).state is pgq.JobState.SUCCEEDED


def test_handler_error_with_empty_message_stores_a_placeholder(conn: Conn) -> None:
    pgq.enqueue(conn, "t")
    job = claim_one(conn, "t", max_retry_count=0)
    ended = db.end_attempt(conn, S, [job.id], error="   ", kind=AttemptKind.ERROR, lease=job.lease)
    assert [(e.job_id, e.new_state) for e in ended] == [(job.id, pgq.JobState.FAILED)]
    rec = get(conn, job.id)
    assert rec.error_msg == "(no error message)"
    assert _errors(rec.attempts) == ["(no error message)"]


def test_direct_end_attempt_retries_then_fails(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t")
    for attempt in (1, 2):
        job = claim_one(conn, "t", max_retry_count=1)
        assert job.attempt == attempt
        ended = db.end_attempt(
            conn,
            S,
            [job.id],
            error=f"e{attempt}",
            kind=AttemptKind.ERROR,
            lease=job.lease,
            delay=30,
        )
        expected = pgq.JobState.PENDING if attempt == 1 else pgq.JobState.FAILED
        assert [(e.new_state, e.retry_count) for e in ended] == [(expected, 1)]
        if attempt == 1:
            rec = get(conn, job_id)
            assert rec.start_at > db.db_now(conn, S) + timedelta(seconds=25)
            make_due(conn, job_id)
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert _errors(rec.attempts) == ["e1", "e2"]


def test_retry_notifies_only_when_eligible_now_and_failure_notifies_stopped(
    conn: Conn, dsn: str
) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t"), pgq.NewJob("t"), pgq.NewJob("t")])
    channels = ("pgq_job_available", "pgq_job_stopped")
    with listening(dsn, *channels) as listener:
        now_retry = claim_one(conn, "t")
        db.end_attempt(
            conn, S, [now_retry.id], error="x", kind=AttemptKind.ERROR, lease=now_retry.lease
        )
        assert listener.collect()["pgq_job_available"] == ["t"]

        later_retry = claim_one(conn, "t")
        db.end_attempt(
            conn,
            S,
            [later_retry.id],
            error="x",
            kind=AttemptKind.ERROR,
            lease=later_retry.lease,
            delay=60,
        )
        assert listener.collect() == {c: [] for c in channels}

        doomed = claim_one(conn, "t")
        db.end_attempt(
            conn,
            S,
            [doomed.id],
            error="x",
            kind=AttemptKind.PERMANENT,
            lease=doomed.lease,
            allow_retry=False,
        )
        got = listener.collect()
        assert got["pgq_job_available"] == []
        assert got["pgq_job_stopped"] == [str(doomed.id)]


def test_retry_failed_resets_only_failed_jobs_with_a_fresh_budget(conn: Conn) -> None:
    registry = _flaky_registry(max_retry_count=0)
    failed_ids = pgq.enqueue_many(conn, [pgq.NewJob("flaky"), pgq.NewJob("flaky")])
    other = pgq.enqueue(conn, "other")
    assert testing.drain(conn, registry).failed == 2
    assert pgq.retry_failed(conn, type="flaky") == 2
    for job_id in failed_ids:
        rec = get(conn, job_id)
        assert rec.state is pgq.JobState.PENDING
        assert (rec.current_retry_count, rec.error_msg, rec.stopped_at) == (0, None, None)
        assert len(rec.attempts) == 1  # history kept
    assert get(conn, other).state is pgq.JobState.PENDING
    assert count_rows(conn) == 3


def test_an_error_message_with_a_nul_character_is_still_recorded(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("binary", max_retry_count=0)
    def binary(payload: dict[str, str]) -> None:
        raise ValueError("bad byte \x00 in input")

    job_id = pgq.enqueue(conn, "binary", {})
    assert testing.drain(conn, registry).failed == 1
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert rec.error_msg is not None and rec.error_msg.startswith("ValueError: bad byte")
    assert rec.error_msg.endswith("in input")
