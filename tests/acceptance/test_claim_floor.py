"""Claim floors under a real supervisor (CLI subprocess, two children): a REPEATABLE READ
snapshot held open makes it keep floors for its types, jobs keep running past them (plain ones
and a chain of dependents enqueued before the snapshot), and when the snapshot ends the floors
are gone."""

from __future__ import annotations

import itertools

import psycopg

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.processes import APP, FAST, Supervisor, count
from tests.support.waiting import wait_for


def _floors(db: Conn) -> list[tuple[object, ...]]:
    """(type, walked) of each floor: walked once the first walk after it was made has run."""
    return db.execute(
        "SELECT type, upto > '-infinity' FROM pgq.claim_floor ORDER BY type"
    ).fetchall()


def test_a_held_snapshot_brings_floors_and_every_job_still_runs(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = Supervisor(dsn, APP, "--procs", "2", *FAST)
    sups.append(sup)
    sup.wait_ready(2)
    # a chain enqueued before the snapshot: each link becomes ready with an old created_at
    with db.transaction():
        first = pgq.enqueue(db, "step", {"name": "gate", "seconds": 8.0})
        chain = [first]
        for i in range(3):
            chain.append(pgq.enqueue(db, "step", {"name": f"link{i}"}, depends_on=[chain[-1]]))
    with psycopg.connect(dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgq.job").fetchone()
        pgq.enqueue_many(db, [pgq.NewJob("noop", {})] * 300)
        wait_for("walked floors", lambda: any(r[1] for r in _floors(db)), timeout=30)
        assert "claims of" in sup.log() and "start past them" in sup.log()
        pgq.enqueue_many(db, [pgq.NewJob("noop", {})] * 300)
        wait_for("every job finished", lambda: count(dsn, "stopped_at IS NULL") == 0, timeout=60)
        assert count(dsn, "state = 'succeeded'") == 604
        assert {r[0] for r in _floors(db)} >= {"noop", "step"}
        holder.rollback()
    wait_for("the floors dropped", lambda: not _floors(db), timeout=30)
    assert "claims walk from the start again" in sup.log()
    jobs = [pgq.get_job(db, j) for j in chain]
    for before, after in itertools.pairwise(jobs):
        assert before.stopped_at is not None and after.started_at is not None
        assert before.stopped_at <= after.started_at
    assert sup.stop() == 0
