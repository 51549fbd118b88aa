"""Stops by the signals service managers and terminals send (issue 20, point 3).

systemd's KillMode=control-group, `timeout(1)` and `kill -- -PGID` send SIGTERM to every process
of the group, the supervisor and its children at once; Ctrl-C sends SIGINT to the foreground
group; KillMode=mixed sends SIGTERM to the supervisor alone; an operator may SIGTERM one child.
Each is a graceful stop: the job inside its handler runs to its end and succeeds, jobs claimed
but not started go back to pending without an attempt, every child exits 0.

Each test starts the real CLI in its own process group and waits until a `capped_steps` job (the
`steps` handler: it reports progress, then waits for its gate row) is inside its handler before
signalling. kill(2) returns once the signal is pending in every target, so a gate opened after
it is seen only after the children's handlers have run: the job ends after the signal, always.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable

import pytest

import pgq_supervisor as pgq
from tests.acceptance.apps.pgq_test_app import GATES_DDL
from tests.acceptance.conftest import Conn
from tests.support.processes import APP, FAST, Supervisor, count
from tests.support.waiting import wait_for

Send = Callable[[Supervisor], None]
# capped_steps jobs enqueued behind the first: claimed with it (as many as fit), unstarted
OTHERS = 5


def _start(sups: list[Supervisor], dsn: str, *args: str, wrap: tuple[str, ...] = ()) -> Supervisor:
    # jobs claimed behind the running one stay claimed until the stop (no head-of-line release)
    held = ("--release-unstarted-after", "600")
    sup = Supervisor(
        dsn, APP, "--procs", "1", "--shutdown-timeout", "60", *held, *FAST, *args, wrap=wrap
    )
    sups.append(sup)
    return sup


def _concurrency(args: tuple[str, ...]) -> int:
    return int(args[args.index("--concurrency") + 1]) if "--concurrency" in args else 1


def _gated_jobs_claimed(db: Conn, dsn: str, concurrency: int) -> list[pgq.JobId]:
    """Enqueue a first capped_steps job and OTHERS behind it; return their ids once the first is
    inside its handler and more are claimed behind it, not started."""
    db.execute(GATES_DDL)
    if concurrency == 1:
        # the one-job-at-a-time child sizes its claim from how long recent jobs took: after
        # quick ones it claims a batch, whose jobs behind the first wait unstarted
        pgq.enqueue_many(db, [pgq.NewJob("noop", {}) for _ in range(300)])
        wait_for("warm-up jobs done", lambda: count(dsn, "state = 'succeeded'") == 300)
    # in one statement, so one claim sees them all; the first goes first (its priority)
    ids = pgq.enqueue_many(
        db,
        [pgq.NewJob("capped_steps", {"n": 1}, priority=10)]
        + [pgq.NewJob("capped_steps", {"n": 1}) for _ in range(OTHERS)],
    )
    first = ids[0]
    wait_for("the first job inside its handler", lambda: _in_handler(db, first))
    # at --concurrency 4 the type's cap of 1 keeps 3 claimed and waiting in the child
    wait_for(
        "jobs claimed but not started behind it",
        lambda: count(dsn, f"type = 'capped_steps' AND state = 'running' AND id <> '{first}'") >= 1,
    )
    return ids


def _in_handler(db: Conn, job_id: pgq.JobId) -> bool:
    record = pgq.get_job(db, job_id)
    return record.state is pgq.JobState.RUNNING and record.progress == {"fraction": 1, "step": 1}


def _open_gate(db: Conn, job_id: pgq.JobId) -> None:
    db.execute("INSERT INTO gates (job_id, step) VALUES (%s, 1)", (job_id,))


def _job(db: Conn, job_id: pgq.JobId) -> pgq.JobRecord:
    return pgq.get_job(db, job_id)


def _uncharged(record: pgq.JobRecord) -> bool:
    return record.current_retry_count == 0 and record.attempts == []


def _assert_children_stopped_cleanly(sup: Supervisor, pids: list[int]) -> None:
    log = sup.log()
    assert " died" not in log, log
    for pid in pids:
        assert f"(pid {pid}) stopped: exit code 0" in log, log


def _killpg(sig: signal.Signals) -> Send:
    return lambda sup: os.killpg(sup.pid, sig)


def _supervisor_only(sup: Supervisor) -> None:
    sup.signal(signal.SIGTERM)


def _timeout_fires(sup: Supervisor) -> None:
    # SIGALRM is timeout(1)'s own timer: it then sends SIGTERM to the CLI and to its group,
    # exactly as when the duration runs out
    os.kill(sup.pid, signal.SIGALRM)


STOPS = {
    # systemd KillMode=control-group, kill -- -PGID
    "SIGTERM to the group": ((), _killpg(signal.SIGTERM)),
    # Ctrl-C in a terminal
    "SIGINT to the group": ((), _killpg(signal.SIGINT)),
    # systemd KillMode=mixed (the unit we ship), Kubernetes (tini forwards to the CLI alone)
    "SIGTERM to the supervisor": ((), _supervisor_only),
    # timeout -s TERM: its duration runs out
    "timeout -s TERM": (("timeout", "--preserve-status", "-s", "TERM", "600"), _timeout_fires),
}


@pytest.mark.parametrize("args", [(), ("--concurrency", "4")], ids=["one at a time", "in flight"])
@pytest.mark.parametrize("stop", list(STOPS))
def test_a_stop_signal_lets_the_running_job_finish_and_releases_the_rest(
    stop: str, args: tuple[str, ...], dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    wrap, send = STOPS[stop]
    sup = _start(sups, dsn, *args, wrap=wrap)
    pids = sup.wait_ready(1)
    first, *others = _gated_jobs_claimed(db, dsn, _concurrency(args))
    send(sup)
    _open_gate(db, first)
    assert sup.wait(timeout=60) == 0, sup.log()
    record = _job(db, first)
    assert record.state is pgq.JobState.SUCCEEDED, (record, sup.log())
    assert _uncharged(record) and record.attempt == 1, record
    for job_id in others:
        record = _job(db, job_id)
        assert record.state is pgq.JobState.PENDING and _uncharged(record), record
    _assert_children_stopped_cleanly(sup, pids)
    assert re.search(r"SIG(TERM|INT): stopping", sup.log())


@pytest.mark.parametrize("args", [(), ("--concurrency", "4")], ids=["one at a time", "in flight"])
def test_sigterm_to_a_child_alone_stops_it_cleanly_and_it_is_replaced(
    args: tuple[str, ...], dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    """An operator's `kill <child pid>`: the child finishes its job, releases the rest and exits
    0; the supervisor, still running, starts a new child at once and charges nothing."""
    sup = _start(sups, dsn, *args)
    (victim,) = sup.wait_ready(1)
    ids = _gated_jobs_claimed(db, dsn, _concurrency(args))
    os.kill(victim, signal.SIGTERM)
    _open_gate(db, ids[0])

    def replaced() -> list[int] | None:
        kids = sup.children()
        ready = len(re.findall(r"child \d+ ready", sup.log()))
        return kids if kids and victim not in kids and ready >= 2 else None

    new = wait_for("a new child in its place", replaced)
    for job_id in ids[1:]:
        _open_gate(db, job_id)
    done = "type = 'capped_steps' AND state = 'succeeded'"
    wait_for("every gated job done", lambda: count(dsn, done) == len(ids))
    assert all(_uncharged(_job(db, job_id)) for job_id in ids)
    ran_by = {job_id: pid for job_id, pid in db.execute("SELECT job_id, pid FROM effects")}
    assert len(ran_by) == len(ids)
    assert ran_by[ids[0]] == victim  # finished where it was running
    assert {ran_by[job_id] for job_id in ids[1:]} == set(new)  # the rest waited, unstarted
    _assert_children_stopped_cleanly(sup, [victim])
    assert sup.stop() == 0


@pytest.mark.parametrize("args", [(), ("--concurrency", "4")], ids=["one at a time", "in flight"])
def test_the_supervisors_own_sigterm_for_a_timeout_still_kills_at_once(
    args: tuple[str, ...], dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    """A child treats a SIGTERM as a stop unless its supervisor sent it to kill the child (a
    timeout here): then it dies of it at once, not of the SIGKILL that follows 2 s later."""
    sup = _start(sups, dsn, *args)
    sup.wait_ready(1)
    job_id = pgq.enqueue(db, "spin", {})  # CPU-bound, timeout 1 s, 3 attempts
    wait_for("spin failed", lambda: _job(db, job_id).state is pgq.JobState.FAILED, timeout=60)
    record = _job(db, job_id)
    errors = [a["error"] for a in record.attempts if isinstance(a, dict)]
    assert errors == ["timeout after 1 s"] * 3
    log = sup.log()
    assert len(re.findall(r"died: SIGTERM", log)) == 3 and "SIGKILL" not in log, log
    assert sup.stop() == 0
