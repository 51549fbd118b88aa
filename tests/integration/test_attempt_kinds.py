"""The attempt and outcome kinds Python names are exactly the strings the database writes."""

from __future__ import annotations

import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, OutcomeKind
from tests.support.db import age_heartbeat, claim_one, get

S = "pgq"


def _kinds_in_history(conn: Conn, job_id: pgq.JobId) -> list[str]:
    return [str(a["kind"]) for a in get(conn, job_id).attempts if isinstance(a, dict)]


@pytest.mark.parametrize("kind", [k for k in AttemptKind if k is not AttemptKind.RESCUED], ids=str)
def test_end_attempt_stores_the_kind_it_is_given(conn: Conn, kind: AttemptKind) -> None:
    job_id = pgq.enqueue(conn, "t")
    job = claim_one(conn, "t", worker_id="w")
    db.end_attempt(conn, S, [job_id], lease=job.lease, error="x", kind=kind)
    assert _kinds_in_history(conn, job_id) == [kind.value]


def test_the_rescuer_writes_the_rescued_kind(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t")
    claim_one(conn, "t", worker_id="dead")
    age_heartbeat(conn, job_id, 120)
    db.rescue(conn, S, dead_after=30)
    assert _kinds_in_history(conn, job_id) == [AttemptKind.RESCUED.value]


def test_outcome_kinds_are_the_metric_labels_users_see() -> None:
    assert [k.value for k in OutcomeKind] == [
        "succeeded", "retried", "failed", "lost", "snoozed", "suspended",
    ]  # fmt: skip
