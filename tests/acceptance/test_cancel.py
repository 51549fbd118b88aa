"""Cancel of a running job as users do it: the real CLI, a real supervisor, real signals."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from pathlib import Path
from uuid import UUID

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.processes import APP, FAST, Supervisor, count, run_cli
from tests.support.waiting import wait_for


def _start(sups: list[Supervisor], dsn: str, *args: str) -> Supervisor:
    sup = Supervisor(dsn, APP, *args)
    sups.append(sup)
    return sup


def _job(db: Conn, job_id: UUID) -> pgq.JobRecord:
    return pgq.get_job(db, pgq.JobId(job_id))


def _running_on(sup: Supervisor, db: Conn, job_id: UUID) -> str | None:
    """The worker id of the child running the job, once it runs."""
    rec = _job(db, job_id)
    return rec.worker_id if rec.state is pgq.JobState.RUNNING else None


def _ready_count(sup: Supervisor) -> int:
    return len(re.findall(r"child \d+ ready", sup.log()))


def test_cancel_stops_a_cpu_bound_job_and_frees_its_child(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = _start(sups, dsn, "--procs", "2", *FAST)
    before = set(sup.wait_ready(2))
    busy, *others = pgq.enqueue_many(
        db,
        [pgq.NewJob("busy_loop", priority=10)]
        + [pgq.NewJob("sleep", {"seconds": 0.05}) for _ in range(20)],
    )
    wait_for("busy_loop running", lambda: _running_on(sup, db, busy))
    ready = _ready_count(sup)

    out = run_cli(["cancel", str(busy)], dsn)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"cancelled job {busy} (it was running on ")

    rec = _job(db, busy)
    assert rec.state is pgq.JobState.CANCELLED  # at once: the database is the referee
    wait_for("a new child ready", lambda: _ready_count(sup) > ready, timeout=10)

    def two_children() -> list[int] | None:
        pids = sup.children()
        return pids if len(pids) == 2 else None

    after = wait_for("two children again", two_children)
    assert len(before - set(after)) == 1, "exactly the busy child was replaced"

    wait_for("the others succeeded", lambda: count(dsn, "type = 'sleep' AND state = 'succeeded'")
             == len(others), timeout=30)  # fmt: skip
    rows = db.execute(
        "SELECT count(*) FROM pgq.job WHERE type = 'sleep' AND attempts <> '[]'::jsonb"
    ).fetchone()
    assert rows is not None and rows[0] == 0, "no other job may count an attempt"
    effects = db.execute("SELECT job_id, count(*) FROM effects GROUP BY job_id").fetchall()
    assert {r[0] for r in effects} == set(others) and all(r[1] == 1 for r in effects)

    rec = _job(db, busy)  # still cancelled: never retried
    assert rec.state is pgq.JobState.CANCELLED and rec.current_retry_count == 0
    assert [a["kind"] for a in rec.attempts if isinstance(a, dict)] == ["cancelled"]
    log = sup.log()
    assert f"job id={busy} was cancelled: stopping child" in log
    assert "worker died" not in log and " died: " not in log
    assert sup.stop() == 0


def test_a_missed_cancel_notification_is_caught_by_the_poll(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = _start(sups, dsn, "--procs", "1", *FAST)  # poll every 0.5 s
    (pid,) = sup.wait_ready(1)
    busy = pgq.enqueue(db, "busy_loop")
    wait_for("busy_loop running", lambda: _running_on(sup, db, busy))
    # the cancel's writes without its notification: as if the LISTEN connection had missed it
    db.execute(
        "UPDATE pgq.job SET state = 'cancelled', stopped_at = now(), worker_alive_at = NULL,"
        " lease = NULL WHERE id = %s",
        (busy,),
    )
    wait_for("the child replaced", lambda: (p := sup.children()) and p != [pid], timeout=10)
    wait_for("the replacement ready", lambda: _ready_count(sup) == 2)
    assert f"job id={busy} was cancelled (found by the poll)" in sup.log()
    assert _job(db, busy).state is pgq.JobState.CANCELLED
    ok = pgq.enqueue(db, "sleep", {"seconds": 0.0})
    wait_for("the new child works", lambda: _job(db, ok).state is pgq.JobState.SUCCEEDED)
    assert sup.stop() == 0


def test_cancel_racing_the_handlers_return_lands_exactly_one_outcome(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    """Each `sleep` job (a `conn` handler: its effect commits with its success) is cancelled
    about when its handler returns. Whichever commits first wins; the effect exists iff it
    succeeded."""
    sup = _start(sups, dsn, "--procs", "2", *FAST)
    sup.wait_ready(2)
    seconds = 0.15
    # cancel from a little before to a little after the handler's end (started_at is the claim)
    offsets = [k / 100 for k in range(-1, 7)]
    ids = pgq.enqueue_many(db, [pgq.NewJob("sleep", {"seconds": seconds}) for _ in offsets])
    for job_id, offset in zip(ids, offsets, strict=True):

        def near_its_end(job_id: UUID = job_id, offset: float = offset) -> bool:
            row = db.execute(
                "SELECT state <> 'running' OR clock_timestamp() - started_at"
                " >= make_interval(secs => %s) FROM pgq.job WHERE id = %s",
                (seconds + offset, job_id),
            ).fetchone()
            pending = _job(db, job_id).state is pgq.JobState.PENDING
            return row is not None and bool(row[0]) and not pending

        wait_for("the job near its end", near_its_end, interval=0.002)
        with contextlib.suppress(pgq.InvalidTransition):  # it may have finished first
            pgq.cancel_job(db, pgq.JobId(job_id))
    wait_for("every job ended", lambda: count(dsn, "state IN ('succeeded', 'cancelled')")
             == len(ids))  # fmt: skip
    effects = {r[0] for r in db.execute("SELECT job_id FROM effects").fetchall()}
    for job_id in ids:
        rec = _job(db, job_id)
        assert (job_id in effects) == (rec.state is pgq.JobState.SUCCEEDED), rec
    assert sup.stop() == 0


def test_a_forged_cancel_notification_from_a_role_without_grants_stops_nothing(
    dsn: str, db: Conn, sups: list[Supervisor], tmp_path: Path
) -> None:
    """Any role that may connect may NOTIFY on any channel: the supervisor acts on a cancel
    only once the database shows the job cancelled, so the job runs to its end, once."""
    sup = _start(sups, dsn, "--procs", "1", "--log-level", "debug", *FAST)
    (pid,) = sup.wait_ready(1)
    gate = tmp_path / "gate"
    job_id = pgq.enqueue(db, "gated", {"gate": str(gate)})
    worker = wait_for("the job running", lambda: _running_on(sup, db, job_id))
    role = f"pgq_forger_{uuid.uuid4().hex[:8]}"
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        with psycopg.connect(make_conninfo(dsn, user=role), autocommit=True) as forger:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):  # no grant on pgq
                forger.execute("SELECT count(*) FROM pgq.job")
            payload = json.dumps({"job_id": str(job_id), "worker_id": worker})
            for _ in range(3):
                forger.execute("SELECT pg_notify('pgq_job_cancel', %s)", (payload,))
        ignored = f"ignored a pgq_job_cancel notification for job id={job_id}"
        wait_for("the forged notifications read", lambda: sup.log().count(ignored) == 3)
        assert _job(db, job_id).state is pgq.JobState.RUNNING
        assert sup.children() == [pid]
        gate.touch()
        wait_for("the job done", lambda: _job(db, job_id).state is pgq.JobState.SUCCEEDED)
    finally:
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    rec = _job(db, job_id)
    assert rec.attempts == [] and rec.current_retry_count == 0, "one run, never released"
    assert sup.children() == [pid], "the child was never stopped"
    assert "was cancelled: stopping child" not in sup.log()
    assert sup.stop() == 0
