"""`python -m pgq_supervisor demo` as a newcomer runs it, with stdout not a terminal (CI, pipes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.support.waiting import wait_for

LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", re.MULTILINE)
SUMMARY_ROW = re.compile(r"^(demo\.\S+)\s+(\w+)\s+(\d+)\s+(\S+)\s+(\d+)$")


def demo_cmd(*args: str) -> list[str]:
    """The demo into the test's database (PGQ_DSN): --yes, as a script must say."""
    return [sys.executable, "-m", "pgq_supervisor", "demo", "--procs", "2", "--yes", *args]


def demo_env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQ_")}
    env["PGQ_DSN"] = dsn
    return env


def log_path_in(out: str) -> Path:
    match = re.search(r"its log in (\S+)", out)
    assert match, f"no log path in the output:\n{out}"
    return Path(match.group(1))


def test_demo_counts_retries_and_keeps_the_log_off_the_terminal(dsn: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        demo_cmd("--jobs", "40"),
        capture_output=True,
        text=True,
        timeout=120,
        env=demo_env(dsn),
        cwd=tmp_path,  # the log goes to ./.pgq
    )
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}"
    assert "WARNING" not in out + proc.stderr
    assert not LOG_RECORD.search(out + proc.stderr), "a log record reached the terminal"
    assert "\x1b[" not in out, "escape codes written to a pipe"

    log_path = log_path_in(out)
    assert log_path.parent == tmp_path / ".pgq" and log_path.exists()
    assert out.rstrip().endswith(str(log_path)), "the summary names the log again"
    log = log_path.read_text()
    assert "child 0 ready" in log and "child 1 ready" in log
    assert "SIGTERM: stopping" in log and log.rstrip().endswith("supervisor stopped")
    retry_warnings = [ln for ln in log.splitlines() if "WARNING" in ln and "job retry" in ln]

    origin = re.search(r"origin (demo:[0-9a-f]+)", out)
    assert origin
    with psycopg.connect(dsn) as conn:
        db_rows = conn.execute(
            "SELECT type, state::text, count(*), sum(jsonb_array_length(attempts))"
            " FROM pgq.job WHERE origin = %s GROUP BY 1, 2",
            (origin.group(1),),
        ).fetchall()
    summary = [m.groups() for ln in out.splitlines() if (m := SUMMARY_ROW.match(ln))]
    assert {(t, s, int(n), int(a)) for t, s, n, _mean, a in summary} == {
        (t, s, n, a) for t, s, n, a in db_rows
    }
    by_type = {(t, s): n for t, s, n, _a in db_rows}
    assert sum(by_type.values()) == 41 and f"{41} jobs in " in out
    assert set(by_type) == {
        ("demo.fib", "succeeded"),
        ("demo.flaky", "succeeded"),
        ("demo.part", "succeeded"),
        ("demo.report", "succeeded"),
    }
    attempts = sum(a for _t, _s, _n, a in db_rows)
    assert attempts > 0 and len(retry_warnings) == attempts, "one WARNING per retry, in the log"
    assert f"{attempts} expected retries" in out
    parts = by_type[("demo.part", "succeeded")]
    assert f"{parts}/{parts} parts finished; completion job demo.report: succeeded" in out


def test_demo_shows_the_log_tail_and_fails_when_the_supervisor_dies(
    dsn: str, tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        demo_cmd("--jobs", "3000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=demo_env(dsn),
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        head = ""
        while "its log in" not in head:
            line = proc.stdout.readline()
            assert line, f"the demo ended early:\n{head}"
            head += line
        log_path = log_path_in(head)

        def supervisor_pid() -> int | None:
            log = log_path.read_text()
            match = re.search(r"supervisor pid=(\d+)", log)
            return int(match.group(1)) if match and "child 0 ready" in log else None

        os.kill(wait_for("the supervisor's first child", supervisor_pid), signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, f"stdout:\n{out}\nstderr:\n{err}"
    assert "the supervisor was killed by SIGKILL before the jobs finished" in err
    assert f"lines of {log_path}" in err
    assert "pgq_supervisor." in err, "the log's tail is shown"


def test_demo_asks_before_it_writes_into_a_database_pgq_dsn_names(dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA pgq CASCADE")  # as a user's own database: no queue in it
    cmd = [sys.executable, "-m", "pgq_supervisor", "demo", "--jobs", "5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=demo_env(dsn),
                          cwd=tmp_path, stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: the demo migrates schema pgq") and "--yes" in line
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgq'").fetchone()
    assert row == (0,), "the demo wrote into the database before it was told to"
