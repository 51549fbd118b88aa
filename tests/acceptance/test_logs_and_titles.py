"""What users see by default: process titles and the log, with settings in the environment
placed first, as a pod's manifest puts them."""

from __future__ import annotations

import json
import re
import subprocess

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.processes import APP, FAST, Supervisor, count
from tests.support.waiting import wait_for


def _titles() -> dict[int, str]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return {int(line.split()[0]): line.split(None, 1)[1] for line in out.splitlines()}


def test_titles_hold_with_log_settings_first_in_the_environment(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    env = {"PGQ_LOG_FORMAT": "json", "PGQ_LOG_LEVEL": "info"}
    sup = Supervisor(dsn, APP, "--procs", "2", *FAST, env=env)
    sups.append(sup)
    pids = sup.wait_ready(2)
    job_id = pgq.enqueue(db, "sleep", {"seconds": 3})

    def busy() -> int | None:
        titles = _titles()
        return next((p for p in pids if titles.get(p, "").endswith(str(job_id))), None)

    child = wait_for("a child titled with its job", busy)
    titles = _titles()
    assert titles[sup.pid] == "pgq-supervisor [2 procs]"
    assert re.fullmatch(rf"pgq-worker\[[01]\] sleep {job_id}", titles[child]), titles[child]
    other = next(p for p in pids if p != child)
    wait_for("the other child idle", lambda: _titles().get(other, "").endswith("] idle"))
    failing = pgq.enqueue(db, "fail", {})
    wait_for("the failing job failed", lambda: count(dsn, "state = 'failed'") == 1)
    assert sup.stop() == 0
    # the environment's format reached the supervisor and the child that logged the failure
    lines = [json.loads(ln) for ln in sup.log().splitlines() if ln.startswith("{")]
    assert any(ln["pid"] == sup.pid for ln in lines)
    failed = [ln for ln in lines if ln["level"] == "error" and str(failing) in ln["msg"]]
    assert failed and failed[0]["pid"] in pids


def test_default_log_summarises_jobs_and_shows_every_failure(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = Supervisor(dsn, APP, "--procs", "2", "--summary-interval", "1", *FAST)
    sups.append(sup)
    sup.wait_ready(2)
    pgq.enqueue_many(db, [pgq.NewJob("noop", {}) for _ in range(200)])
    failing = pgq.enqueue(db, "fail", {})
    wait_for("all ended", lambda: count(dsn, "state IN ('succeeded', 'failed')") == 201)
    wait_for("a summary with the failure", lambda: "1 failed" in sup.log())
    assert sup.stop() == 0
    log = sup.log()
    # no per-job lines at the default level ...
    assert "job start" not in log and "job succeeded" not in log
    # ... but a summary per period, and the retry and failure with id, type, attempt, error
    ended = sum(int(n.replace(",", "")) for n in re.findall(r"([\d,]+) jobs? ended in", log))
    assert ended == 202  # 200 successes, one retry, one failure
    assert re.search(rf"WARNING .*job retry id={failing} type=fail attempt=1 .*boom", log)
    assert re.search(rf"ERROR .*job failed id={failing} type=fail attempt=2 .*boom", log)


def test_a_type_no_live_supervisor_serves_is_warned_about_once(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    """Issue 36: `enqueue(conn, "slep", ...)` is accepted and nothing serves it; the supervisor
    that hears of it says so, once, after 5 x poll_interval (2.5 s here)."""
    sup = Supervisor(dsn, APP, "--procs", "1", *FAST)
    sups.append(sup)
    sup.wait_ready(1)
    assert _titles()[sup.pid] == "pgq-supervisor [1 proc]"  # not "1 procs" (issue 36)
    assert re.search(r"INFO .*supervisor pid=\d+ serving .* with 1 proc \(schema pgq\)", sup.log())
    pgq.enqueue(db, "slep", {"seconds": 0})
    pgq.enqueue(db, "noop", {})  # served: never named
    said = "WARNING .*jobs of type {!r} are enqueued but no live supervisor serves it"
    wait_for("the warning", lambda: re.search(said.format("slep"), sup.log()))
    assert re.search(said.format("slep") + r" \(did you mean 'sleep'\?\)$", sup.log(), re.M)
    pgq.enqueue(db, "slep", {"seconds": 0})  # warned already: not again
    pgq.enqueue(db, "other_typo", {})
    wait_for("the second type's warning", lambda: "'other_typo'" in sup.log())
    assert len(re.findall(said.format("slep"), sup.log())) == 1
    assert "'noop'" not in sup.log()
    assert sup.stop() == 0


def test_a_type_another_supervisor_serves_is_not_warned_about(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    noop_only = Supervisor(dsn, APP, "--procs", "1", "--types", "noop", *FAST)
    sleep_only = Supervisor(dsn, APP, "--procs", "1", "--types", "sleep", *FAST)
    sups += [noop_only, sleep_only]
    noop_only.wait_ready(1)
    sleep_only.wait_ready(1)

    def registered() -> bool:
        row = db.execute("SELECT count(*) FROM pgq.supervisor").fetchone()
        return row is not None and row[0] == 2

    wait_for("both supervisors' rows", registered)
    pgq.enqueue(db, "sleep", {"seconds": 0})  # noop_only hears it: sleep_only serves it
    pgq.enqueue(db, "zzz", {})  # after it: warned about once the grace for both has passed
    wait_for("zzz warned about", lambda: "'zzz'" in noop_only.log() and "'zzz'" in sleep_only.log())
    assert "'sleep'" not in noop_only.log() and "'noop'" not in sleep_only.log()
    assert noop_only.stop() == 0 and sleep_only.stop() == 0
