"""Operator transitions: cancel (pending or running: test_cancel_running.py) and reset
(finished, or running when forced)."""

from __future__ import annotations

import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobId
from tests.support.db import claim_one, get, raw_row

S = "pgq"


def _job_in_state(conn: Conn, state: pgq.JobState) -> JobId:
    job_id = pgq.enqueue(conn, "t", {"state": state.value})
    if state is pgq.JobState.PENDING:
        return job_id
    if state is pgq.JobState.CANCELLED:
        pgq.cancel_job(conn, job_id)
        return job_id
    job = claim_one(conn, "t", max_retry_count=0)
    assert job.id == job_id
    if state is pgq.JobState.SUCCEEDED:
        db.succeed(conn, S, job.lease, [(job.id, '"ok"')])
    elif state is pgq.JobState.FAILED:
        db.end_attempt(conn, S, [job.id], error="broken", kind=AttemptKind.ERROR, lease=job.lease)
    assert get(conn, job_id).state is state
    return job_id


def test_cancel_of_a_pending_job(conn: Conn) -> None:
    job_id = _job_in_state(conn, pgq.JobState.PENDING)
    pgq.cancel_job(conn, job_id)
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.CANCELLED
    assert rec.stopped_at is not None


@pytest.mark.parametrize(
    "state",
    [pgq.JobState.SUCCEEDED, pgq.JobState.FAILED, pgq.JobState.CANCELLED],
)
def test_cancel_of_a_finished_job_is_refused(conn: Conn, state: pgq.JobState) -> None:
    job_id = _job_in_state(conn, state)
    before = raw_row(conn, job_id)
    with pytest.raises(pgq.InvalidTransition, match=f"job {job_id} is {state.value}"):
        pgq.cancel_job(conn, job_id)
    assert raw_row(conn, job_id) == before


def test_reset_of_a_running_job_without_force_is_refused(conn: Conn) -> None:
    job_id = _job_in_state(conn, pgq.JobState.RUNNING)
    before = raw_row(conn, job_id)
    with pytest.raises(pgq.InvalidTransition, match=r"is running; .*force=True"):
        pgq.reset_job(conn, job_id)
    assert raw_row(conn, job_id) == before


def test_reset_of_a_pending_job_is_refused(conn: Conn) -> None:
    job_id = _job_in_state(conn, pgq.JobState.PENDING)
    before = raw_row(conn, job_id)
    with pytest.raises(pgq.InvalidTransition, match="is pending"):
        pgq.reset_job(conn, job_id, force=True)
    assert raw_row(conn, job_id) == before


@pytest.mark.parametrize(
    "state", [pgq.JobState.SUCCEEDED, pgq.JobState.FAILED, pgq.JobState.CANCELLED]
)
def test_reset_of_a_finished_job_gives_a_fresh_budget_and_keeps_history(
    conn: Conn, state: pgq.JobState
) -> None:
    job_id = _job_in_state(conn, state)
    history = get(conn, job_id).attempts
    pgq.reset_job(conn, job_id)
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.PENDING
    assert (rec.current_retry_count, rec.result, rec.error_msg, rec.error_data) == (
        0,
        None,
        None,
        None,
    )
    assert (rec.started_at, rec.stopped_at, rec.worker_id) == (None, None, None)
    assert rec.attempts == history
    assert rec.start_at <= db.db_now(conn, S)
    again = claim_one(conn, "t")
    assert again.id == job_id and again.attempt == 1


def test_forced_reset_takes_a_running_job_from_its_worker(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t")
    old = claim_one(conn, "t", worker_id="stuck")
    pgq.reset_job(conn, job_id, force=True)
    new = claim_one(conn, "t", worker_id="fresh")
    assert new.id == job_id and new.lease != old.lease
    # the job can finish only once, and only under the new lease
    assert db.succeed(conn, S, old.lease, [(job_id, '"stale"')]) == set()
    assert db.succeed(conn, S, new.lease, [(job_id, '"fresh"')]) == {job_id}
    rec = get(conn, job_id)
    assert (rec.state, rec.result, rec.worker_id) == (pgq.JobState.SUCCEEDED, "fresh", "fresh")
