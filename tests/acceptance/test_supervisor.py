"""The supervisor as users run it: the real CLI in a subprocess, real signals, real PostgreSQL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgq_supervisor as pgq
from tests.acceptance.apps.pgq_test_app import EFFECTS_DDL
from tests.acceptance.conftest import Conn
from tests.support.processes import APP, FAST, Supervisor, count, run_cli
from tests.support.waiting import wait_for


def start(sups: list[Supervisor], dsn: str, *args: str) -> Supervisor:
    sup = Supervisor(dsn, APP, *args)
    sups.append(sup)
    return sup


def job_state(conn: Conn, job_id: UUID) -> pgq.JobRecord:
    return pgq.get_job(conn, pgq.JobId(job_id))


def worker_running(sup: Supervisor, job_id: UUID) -> int | None:
    """PID of the child whose process title shows it running `job_id`."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if str(job_id) in line and "pgq-worker[" in line:
            return int(line.split()[0])
    return None


def test_500_jobs_4_procs_each_once_spread_over_children(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = start(sups, dsn, "--procs", "4", *FAST)
    pids = sup.wait_ready(4)
    ids = pgq.enqueue_many(db, [pgq.NewJob("sleep", {"seconds": 0.005}) for _ in range(500)])
    wait_for("500 succeeded", lambda: count(dsn, "state = 'succeeded'") == 500, timeout=60)
    rows = db.execute("SELECT job_id, count(*), min(pid) FROM effects GROUP BY job_id").fetchall()
    assert len(rows) == 500 and {r[0] for r in rows} == set(ids)
    assert all(r[1] == 1 for r in rows), "a job ran twice"
    assert {r[2] for r in rows} == set(pids), "every child should have run some jobs"
    assert sup.stop() == 0


def test_sigkill_child_reruns_job_at_once(dsn: str, db: Conn, sups: list[Supervisor]) -> None:
    # dead_after is long: recovery must come from the reaper, not the rescuer
    sup = start(sups, dsn, "--procs", "2", "--heartbeat-interval", "5", "--dead-after", "60")
    sup.wait_ready(2)
    job_id = pgq.enqueue(db, "sleep", {"seconds": 1.5})
    victim = wait_for("job running", lambda: worker_running(sup, job_id))
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    wait_for("job succeeded", lambda: job_state(db, job_id).state is pgq.JobState.SUCCEEDED, 20)
    assert time.monotonic() - killed_at < 15
    job = job_state(db, job_id)
    assert job.current_retry_count == 1
    assert isinstance(job.attempts, list) and len(job.attempts) == 1
    first = job.attempts[0]
    assert isinstance(first, dict) and first["error"] == "worker died: SIGKILL"
    assert first["kind"] == "worker_death"
    replacement: list[int] = wait_for(
        "replacement child", lambda: sup.children() if len(sup.children()) == 2 else None
    )
    assert victim not in replacement
    assert count(dsn) == 1


def test_sigstop_past_dead_after_fences_the_stale_worker(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = start(sups, dsn, "--procs", "2", "--heartbeat-interval", "0.2", "--dead-after", "1",
                "--poll-interval", "0.3")  # fmt: skip
    sup.wait_ready(2)
    job_id = pgq.enqueue(db, "sleep", {"seconds": 1.0})
    stopped = wait_for("job running", lambda: worker_running(sup, job_id))
    os.kill(stopped, signal.SIGSTOP)
    try:
        wait_for(
            "another child completes the job",
            lambda: job_state(db, job_id).state is pgq.JobState.SUCCEEDED,
            timeout=20,
        )
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_for("the stale worker logs its lost lease",
             lambda: re.search(rf"lease lost id={job_id}", sup.log()), timeout=20)  # fmt: skip
    effects = db.execute("SELECT pid FROM effects WHERE job_id = %s", (job_id,)).fetchall()
    assert len(effects) == 1 and effects[0][0] != stopped, "the stale worker's effect landed"
    job = job_state(db, job_id)
    assert job.state is pgq.JobState.SUCCEEDED
    assert [a["kind"] for a in job.attempts if isinstance(a, dict)] == ["rescued"]


def test_pod_death_rescued_by_second_supervisor(dsn: str, db: Conn, sups: list[Supervisor]) -> None:
    first = start(sups, dsn, "--procs", "2", *FAST)
    first.wait_ready(2)
    ids = [pgq.enqueue(db, "sleep_first", {"seconds": 60.0}) for _ in range(2)]
    wait_for("both jobs running", lambda: count(dsn, "state = 'running'") == 2)
    second = start(sups, dsn, "--procs", "2", *FAST)
    second.wait_ready(2)
    first.kill_group()  # the whole pod: supervisor and children at once
    killed_at = time.monotonic()
    first.proc.wait(timeout=10)
    wait_for(
        "jobs running again under the second supervisor",
        lambda: (
            count(dsn, f"state = 'running' AND worker_id LIKE '%:{second.pid}:%'") == 2
            or count(dsn, "state = 'succeeded'") == 2
        ),
        timeout=20,
    )
    # dead_after 2 s + poll 0.5 s (jittered up to 0.6 s), plus process scheduling slack
    assert time.monotonic() - killed_at < 2 + 0.6 + 1.5
    wait_for("both succeed", lambda: count(dsn, "state = 'succeeded'") == 2, timeout=20)
    for job_id in ids:
        assert [a["kind"] for a in job_state(db, job_id).attempts if isinstance(a, dict)] == [
            "rescued"
        ]


def test_cpu_bound_timeout_kills_retries_then_fails(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = start(sups, dsn, "--procs", "2", *FAST)
    sup.wait_ready(2)
    job_id = pgq.enqueue(db, "spin", {})
    wait_for("spin failed", lambda: job_state(db, job_id).state is pgq.JobState.FAILED, 30)
    job = job_state(db, job_id)
    errors = [a["error"] for a in job.attempts if isinstance(a, dict)]
    assert errors == ["timeout after 1 s"] * 3  # max_retry_count=2: three attempts
    assert job.current_retry_count == 2
    assert job.error_msg == "timeout after 1 s"
    wait_for("children replaced", lambda: len(sup.children()) == 2)


def test_poison_job_fails_while_others_flow(dsn: str, db: Conn, sups: list[Supervisor]) -> None:
    sup = start(sups, dsn, "--procs", "2", *FAST)
    sup.wait_ready(2)
    poison = pgq.enqueue(db, "poison", {})
    pgq.enqueue_many(db, [pgq.NewJob("record", {}) for _ in range(100)])
    wait_for("poison failed", lambda: job_state(db, poison).state is pgq.JobState.FAILED, 30)
    wait_for("others succeeded", lambda: count(dsn, "type = 'record' AND state = 'succeeded'")
             == 100, 30)  # fmt: skip
    job = job_state(db, poison)
    assert [a["error"] for a in job.attempts if isinstance(a, dict)] == [
        "worker died: exit code 1"
    ] * 3
    assert sup.proc.poll() is None


def test_sigterm_drains_then_releases_what_outlives_shutdown_timeout(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = start(sups, dsn, "--procs", "2", "--shutdown-timeout", "4", *FAST)
    sup.wait_ready(2)
    short = pgq.enqueue(db, "sleep", {"seconds": 2.5}, priority=10)
    long = pgq.enqueue(db, "sleep", {"seconds": 60}, priority=10)
    wait_for("both running", lambda: worker_running(sup, short) and worker_running(sup, long))
    waiting = pgq.enqueue_many(db, [pgq.NewJob("sleep", {"seconds": 0.1}) for _ in range(5)])
    sent = time.monotonic()
    sup.signal(signal.SIGTERM)
    assert sup.wait(timeout=15) == 0
    assert time.monotonic() - sent < 4 + 3  # shutdown_timeout plus the kill and release
    assert job_state(db, short).state is pgq.JobState.SUCCEEDED
    long_job = job_state(db, long)
    assert long_job.state is pgq.JobState.PENDING
    assert long_job.current_retry_count == 0 and long_job.attempts == []
    for job_id in waiting:
        job = job_state(db, job_id)
        assert job.state is pgq.JobState.PENDING and job.attempts == []
    assert count(dsn, "state = 'running'") == 0


def test_process_titles(dsn: str, db: Conn,
                        sups: list[Supervisor]) -> None:  # fmt: skip
    sup = start(sups, dsn, "--procs", "2", *FAST)
    sup.wait_ready(2)
    job_id = pgq.enqueue(db, "sleep", {"seconds": 2})
    wait_for("busy title", lambda: worker_running(sup, job_id))
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    titles = {int(line.split()[0]): line.split(None, 1)[1] for line in out.splitlines()}
    assert titles[sup.pid] == "pgq-supervisor [2 procs]"
    kids = [titles[p] for p in sup.children()]
    assert f"sleep {job_id}" in " ".join(kids)
    assert any(re.fullmatch(r"pgq-worker\[\d\] (idle|sleep \S+)", t) for t in kids), kids
    assert "password" not in " ".join(titles.values())


def test_sigttin_sigttou_resize(dsn: str, db: Conn, sups: list[Supervisor]) -> None:
    sup = start(sups, dsn, "--procs", "1", *FAST)
    sup.wait_ready(1)
    sup.signal(signal.SIGTTIN)
    wait_for("two children", lambda: len(sup.children()) == 2)
    sup.signal(signal.SIGTTOU)
    wait_for("one child", lambda: len(sup.children()) == 1)
    assert sup.stop() == 0


MISSING_DB = "<a database that does not exist on the suite's server>"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--app", "no_such_module:registry"], 3, "cannot import app module 'no_such_module'"),
        (["--app", "pgq_test_app:nothing"], 3, "has no attribute 'nothing'"),
        (["--app", APP, "--procs", "0"], 2, "invalid setting procs"),
        (["--app", APP, "--heartbeat-interval", "5", "--dead-after", "10"], 2, "dead_after"),
        (["--app", APP, "--dsn", "host=127.0.0.1 port=1", "--connect-timeout", "1"], 1,
         "server not reachable"),
        (["--app", APP, "--dsn", "not a dsn"], 2, "invalid setting dsn"),
        (["--app", APP, "--dsn", MISSING_DB], 1, "database does not exist"),
    ],
)  # fmt: skip
def test_bad_configuration_one_line_and_exit_code(
    args: list[str], code: int, message: str, server_dsn: str
) -> None:
    # the suite's own server (local, PGQ_TEST_DSN or embedded), so the database is what is missing
    missing = make_conninfo(server_dsn, dbname=f"pgq_missing_{uuid4().hex[:12]}")
    args = [missing if a == MISSING_DB else a for a in args]
    result = run_cli(["run", *args], timeout=30)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == code, result.stderr
    *before, last = lines
    assert last.startswith("error: ") and message in last, lines
    # before its one error line, only the line said at once while it waits for a database that
    # does not answer yet (a missing database or a bad setting is not waited for)
    waits = message == "server not reachable"
    assert [("waiting for the database at" in ln) for ln in before] == ([True] if waits else [])
    assert "ready" not in result.stdout + result.stderr  # no child was started


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_restart_loses_nothing(mode: str, sups: list[Supervisor]) -> None:
    """A restart (fast) and a crash (immediate: commits made with synchronous_commit off may be
    lost) in the middle of a run: every job still finishes, and effects written through the
    job's connection land exactly once."""
    from tests.acceptance.pgserver import OwnServer

    with OwnServer() as server:
        dsn = server.dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            pgq.migrate(conn)
            conn.execute(EFFECTS_DDL)
            pgq.enqueue_many(conn, [pgq.NewJob("sleep", {"seconds": 0.02}) for _ in range(200)])
            pgq.enqueue_many(conn, [pgq.NewJob("noop", {}) for _ in range(2000)])
        sup = start(sups, dsn, "--procs", "2", *FAST)
        wait_for("some progress", lambda: server.count("state = 'succeeded'") >= 40, timeout=30)
        server.restart(mode)
        wait_for("all succeeded", lambda: server.count("state = 'succeeded'") == 2200, 60)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*), count(DISTINCT job_id) FROM effects").fetchone()
            assert row == (200, 200)
        assert sup.proc.poll() is None
        assert sup.stop() == 0


def test_children_finish_their_job_and_exit_when_the_supervisor_dies(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = start(sups, dsn, "--procs", "2", *FAST)
    pids = sup.wait_ready(2)
    job_id = pgq.enqueue(db, "sleep", {"seconds": 1.0})
    wait_for("job running", lambda: worker_running(sup, job_id))
    os.kill(sup.pid, signal.SIGKILL)  # the supervisor alone; its children see pipe EOF

    def gone() -> bool:
        return not any(os.path.exists(f"/proc/{p}") and _alive(p) for p in pids)

    wait_for("children exit", gone, timeout=20)
    job = job_state(db, job_id)
    assert job.state is pgq.JobState.SUCCEEDED and job.attempts == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
