"""No job waits behind a slow one (issue 20): a child that claimed a batch gives back the jobs it
has not started once the job in hand runs long, and writes the successes before it; a child
with many jobs in flight claims no more of a capped type than its cap has room for, and gives
back those it holds past the cap. Jobs claimed but not started show as such in `workers`,
`show` and the dashboard. And a child recycled after max_jobs_per_child starts no more than
that many jobs. The real CLI in a subprocess; waits on conditions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.processes import APP, FAST, Supervisor, count, run_cli
from tests.support.waiting import wait_for

ASYNC_APP = "pgq_async_app:registry"


def _start(sups: list[Supervisor], dsn: str, *args: str, app: str = APP) -> Supervisor:
    sup = Supervisor(dsn, app, *args)
    sups.append(sup)
    return sup


def _none_charged(db: Conn) -> bool:
    row = db.execute(
        "SELECT count(*) FROM pgq.job WHERE current_retry_count > 0 OR attempts <> '[]'"
    ).fetchone()
    return row == (0,)


def test_jobs_claimed_behind_a_slow_job_finish_while_it_runs(
    dsn: str, db: Conn, sups: list[Supervisor], tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    jobs = [pgq.NewJob("gated", {}) for _ in range(400)]
    # past the first claims, which are small: the slow job lands inside a batch
    jobs[200] = pgq.NewJob("gated", {"gate": str(gate)})
    ids = pgq.enqueue_many(db, jobs)
    slow = ids[200]
    sup = _start(sups, dsn, "--procs", "2", "--types", "gated", *FAST)

    def fast_done() -> bool:
        assert pgq.get_job(db, slow).state is not pgq.JobState.SUCCEEDED  # its gate is shut
        return count(dsn, "state = 'succeeded'") == 399

    wait_for("the 399 fast jobs done while the slow one runs", fast_done, timeout=60)
    assert pgq.get_job(db, slow).state is pgq.JobState.RUNNING
    gate.touch()
    wait_for("the slow job done", lambda: count(dsn, "state = 'succeeded'") == 400, timeout=60)
    assert _none_charged(db), "a job given back consumed an attempt"
    assert sup.stop() == 0


@pytest.mark.parametrize(
    "types",
    [
        "agated",  # capped only: a claim takes what the cap has room for
        "agated,asleep",  # another type, uncapped: a claim may take more, the rest goes back
    ],
)
def test_many_in_flight_jobs_of_a_capped_type_do_not_wait_behind_a_slow_one(
    dsn: str, db: Conn, sups: list[Supervisor], tmp_path: Path, types: str
) -> None:
    gate = tmp_path / "open"
    slow = pgq.enqueue(db, "agated", {"gate": str(gate)})
    pgq.enqueue_many(db, [pgq.NewJob("agated", {}) for _ in range(20)])
    args = ("--procs", "2", "--concurrency", "4", "--types", types, *FAST)
    sup = _start(sups, dsn, *args, app=ASYNC_APP)

    def fast_done() -> bool:
        assert pgq.get_job(db, slow).state is not pgq.JobState.SUCCEEDED  # its gate is shut
        return count(dsn, "state = 'succeeded'") == 20

    wait_for("the 20 fast jobs done while the slow one runs", fast_done, timeout=60)
    gate.touch()
    wait_for("the slow job done", lambda: count(dsn, "state = 'succeeded'") == 21, timeout=60)
    assert _none_charged(db), "a job given back consumed an attempt"
    assert sup.stop() == 0


def test_workers_and_show_tell_jobs_claimed_but_not_started(
    dsn: str, db: Conn, sups: list[Supervisor], tmp_path: Path
) -> None:
    # held for a minute behind the job in hand, so that they can be seen
    args = ("--procs", "1", "--types", "gated", "--release-unstarted-after", "60", *FAST)
    sup = _start(sups, dsn, *args)
    sup.wait_ready(1)
    # warm up: the child sizes its claims by how long its jobs took, and these take nothing
    pgq.enqueue_many(db, [pgq.NewJob("gated", {}) for _ in range(300)])
    wait_for("the warm-up done", lambda: count(dsn, "state = 'succeeded'") == 300, timeout=60)
    gate = tmp_path / "open"
    slow, *fast = pgq.enqueue_many(
        db, [pgq.NewJob("gated", {"gate": str(gate)})] + [pgq.NewJob("gated", {})] * 10
    )

    def child_holding() -> dict[str, object] | None:
        out = run_cli(["workers", "--json"], dsn)
        assert out.returncode == 0, out.stderr
        for s in json.loads(out.stdout)["supervisors"]:
            for c in s["children"]:
                if c["job_id"] == str(slow) and c["held"] > 0:
                    return dict(c)
        return None

    child = wait_for("the child's row: the slow job in hand, others held", child_holding)
    held = int(str(child["held"]))
    assert count(dsn, "state = 'running'") == held + 1
    text = run_cli(["workers"], dsn)
    assert text.returncode == 0, text.stderr
    assert f"job gated {slow} (+{held} claimed, not started)" in text.stdout

    waiting = next(i for i in fast if pgq.get_job(db, i).state is pgq.JobState.RUNNING)
    shown = run_cli(["show", str(waiting)], dsn)
    assert shown.returncode == 0, shown.stderr
    assert "claimed, not started" in shown.stdout and str(slow) in shown.stdout
    doc = json.loads(run_cli(["show", str(waiting), "--json"], dsn).stdout)
    assert doc["not_started"]["running"] == [str(slow)]
    assert doc["not_started"]["child"] == 0
    in_hand = json.loads(run_cli(["show", str(slow), "--json"], dsn).stdout)
    assert in_hand["not_started"] is None
    assert "claimed, not started" not in run_cli(["show", str(slow)], dsn).stdout

    gate.touch()
    wait_for("all done", lambda: count(dsn, "state = 'succeeded'") == 311, timeout=60)
    assert sup.stop() == 0


@pytest.mark.parametrize(
    ("app", "job", "args"),
    [
        (APP, pgq.NewJob("noop", {}), ()),  # one job at a time, claimed in batches
        (ASYNC_APP, pgq.NewJob("asleep", {"seconds": 0.01}), ("--concurrency", "4")),
    ],
    ids=["one-at-a-time", "many-in-flight"],
)
def test_a_child_starts_no_more_jobs_than_max_jobs_per_child(
    dsn: str, db: Conn, sups: list[Supervisor], app: str, job: pgq.NewJob, args: tuple[str, ...]
) -> None:
    limit = 7
    pgq.enqueue_many(db, [job] * 120)
    sup = _start(
        sups, dsn, "--procs", "2", "--max-jobs-per-child", str(limit), *args, *FAST, app=app
    )
    wait_for("the backlog done", lambda: count(dsn, "state = 'succeeded'") == 120, timeout=120)
    rows = db.execute(
        "SELECT worker_id, count(*) FROM pgq.job WHERE state = 'succeeded' GROUP BY worker_id"
    ).fetchall()
    ran = sorted(int(str(n)) for _, n in rows)
    assert sum(ran) == 120
    assert max(ran) <= limit, f"a child ran more than {limit} jobs: {ran}"
    assert ran.count(limit) >= 120 // limit - 2, f"children retired early: {ran}"
    assert sup.stop() == 0
