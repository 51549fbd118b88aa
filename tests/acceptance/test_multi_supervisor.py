"""Three supervisors on one database: every job runs exactly once, all three share the work,
and the queue depth an autoscaler reads falls to zero."""

from __future__ import annotations

from collections import Counter

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.processes import APP, FAST, Supervisor, count, run_cli
from tests.support.waiting import wait_for

JOBS = 3000


def test_three_supervisors_share_3000_jobs_and_run_each_once(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    for _ in range(3):
        sups.append(Supervisor(dsn, APP, "--procs", "2", "--types", "record", *FAST))
    children = {sup.pid: set(sup.wait_ready(2)) for sup in sups}

    ids = pgq.enqueue_many(db, [pgq.NewJob("record", {"n": i}) for i in range(JOBS)])
    # six children take at most 100 jobs per claim: most are still waiting right after enqueue
    assert count(dsn, "state = 'pending' AND start_at <= now()") > JOBS // 2
    wait_for(f"{JOBS} succeeded", lambda: count(dsn, "state = 'succeeded'") == JOBS, timeout=60)

    # no job claimed twice: one effect each, each written by a child of the supervisor whose
    # worker id the job carries, on the first attempt
    rows = db.execute(
        "SELECT j.id, j.worker_id, j.current_retry_count, jsonb_array_length(j.attempts),"
        " count(e.job_id), min(e.pid), max(e.attempt)"
        " FROM pgq.job j LEFT JOIN effects e ON e.job_id = j.id GROUP BY j.id"
    ).fetchall()
    assert {r[0] for r in rows} == set(ids)
    assert [r for r in rows if r[4] != 1] == [], "a job ran twice, or not at all"
    assert [r for r in rows if (r[2], r[3], r[6]) != (0, 0, 1)] == [], "a job needed a retry"
    per_supervisor: Counter[int] = Counter()
    for _id, worker_id, *_, pid, _attempt in rows:
        assert isinstance(worker_id, str) and isinstance(pid, int)
        sup_pid = int(worker_id.split(":")[1])  # host:supervisor pid:child index:nonce
        assert pid in children[sup_pid], f"job {_id} ran outside the supervisor it names"
        per_supervisor[sup_pid] += 1

    # the work spread over all three
    assert set(per_supervisor) == set(children), per_supervisor
    assert all(n >= JOBS // 30 for n in per_supervisor.values()), per_supervisor

    # what an autoscaler reads
    def depth() -> str:
        result = run_cli(["depth"], dsn)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert wait_for("depth 0", lambda: depth() == "0\n", timeout=10)
    for sup in sups:
        assert sup.stop() == 0, sup.log()[-2000:]
