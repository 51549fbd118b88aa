"""`python -m pgq_supervisor embedded`: the project's embedded server's DSN (started, kept
running, migrated), and `embedded stop`; the DSN it prints is the one pgq.connect() reaches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgq_supervisor.embedded import running_pid


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQ_")}
    env["PGQ_EMBEDDED_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-m", "pgq_supervisor", "embedded", *args],
        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_embedded_prints_a_dsn_that_stays_up_until_stop(tmp_path: Path) -> None:
    data_dir = tmp_path / "pgdata"
    first = _cli(data_dir)
    assert first.returncode == 0, first.stderr
    (dsn,) = first.stdout.splitlines()
    try:
        with psycopg.connect(dsn) as conn:  # up after the command exited, and migrated
            assert conn.execute("SELECT count(*) FROM pgq.job").fetchone() == (0,)
        again = _cli(data_dir)
        assert again.returncode == 0 and again.stdout.splitlines() == [dsn]
    finally:
        stopped = _cli(data_dir, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("stopped the embedded server in")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2).close()
    idle = _cli(data_dir, "stop")
    assert idle.returncode == 0 and idle.stdout.startswith("no embedded server is running")


def test_embedded_stop_refuses_while_a_process_uses_the_server(tmp_path: Path) -> None:
    data_dir = tmp_path / "pgdata"
    assert _cli(data_dir).returncode == 0
    user = subprocess.Popen(  # a producer holding the server, as pgq.connect() does
        [sys.executable, "-c", "import sys, pgq_supervisor as pgq; c = pgq.connect();"
         " print('up', flush=True); sys.stdin.read()"],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PGQ_")},
             "PGQ_EMBEDDED_DIR": str(data_dir)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert user.stdout is not None and user.stdout.readline().strip() == "up"
        refused = _cli(data_dir, "stop")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        (line,) = refused.stderr.splitlines()
        assert f"in use by pid {user.pid}" in line
        if user.stdin is not None:
            user.stdin.close()
        assert user.wait(timeout=60) == 0
        # the producer was the server's last user: it left it running, as `embedded` said
        assert running_pid(data_dir) is not None
    finally:
        user.kill()
        user.wait(timeout=60)
        _cli(data_dir, "stop")
