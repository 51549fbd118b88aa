"""Helpers for process tests: the real CLI in a subprocess, real signals, waits with deadlines."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import psycopg
from psycopg import sql

from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


APP = "pgq_test_app:registry"
# quick failure detection for tests: dead_after must stay >= 3 x heartbeat_interval
FAST = ("--heartbeat-interval", "0.5", "--dead-after", "2", "--poll-interval", "0.5")


class Supervisor:
    """`python -m pgq_supervisor run ...` in its own process group, logs to a file."""

    def __init__(
        self,
        dsn: str,
        app: str,
        *args: str,
        env: dict[str, str] | None = None,
        wrap: Sequence[str] = (),
    ) -> None:
        """`wrap`: a command that runs the CLI (`timeout ...`); `pid` is then the wrapper's."""
        self.log_path = Path(tempfile.mkstemp(prefix="pgq-sup-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "tests" / "acceptance" / "apps"), full_env.get("PYTHONPATH", "")]
        )
        full_env.pop("PGQ_DSN", None)
        # the test's own variables first, as a pod's env puts its settings before the rest
        given = env or {}
        full_env = {**given, **{k: v for k, v in full_env.items() if k not in given}}
        self.cmd = [
            *wrap,
            sys.executable,
            "-m",
            "pgq_supervisor",
            "run",
            "--dsn",
            dsn,
            "--app",
            app,
            *args,
        ]
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=ROOT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def children(self) -> list[int]:
        """PIDs of the worker children (forked by the supervisor's fork server)."""
        return [pid for pid, title in self.descendants() if "pgq-worker[" in title]

    def descendants(self) -> list[tuple[int, str]]:
        """(pid, title) of every process under the supervisor: the fork server, its children,
        multiprocessing's resource tracker."""
        out = subprocess.run(
            ["ps", "-e", "-o", "pid=,ppid=,args="], capture_output=True, text=True
        ).stdout
        by_parent: dict[int, list[tuple[int, str]]] = {}
        for line in out.splitlines():
            pid, ppid, *title = line.split(maxsplit=2)
            by_parent.setdefault(int(ppid), []).append((int(pid), " ".join(title)))
        found: list[tuple[int, str]] = []
        todo = [self.pid]
        while todo:
            kids = by_parent.get(todo.pop(), [])
            found += kids
            todo += [pid for pid, _ in kids]
        return found

    def wait_ready(self, n: int, timeout: float = 30.0) -> list[int]:
        """Wait until n children said they are ready; returns their pids."""

        def check() -> list[int] | None:
            assert self.proc.poll() is None, f"supervisor exited early:\n{self.log()}"
            # the log first: `ps` costs a process each poll, on the cores the start-up needs
            if len(re.findall(r"child \d+ ready", self.log())) < n:
                return None
            pids = self.children()
            return pids if len(pids) == n else None

        return wait_for(f"{n} ready children of supervisor {self.pid}", check, timeout=timeout)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill_group()
        return self.proc.wait(timeout=10)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill_group()
            self.proc.wait(timeout=10)
        self._log.close()


def run_cli(
    args: Sequence[str],
    dsn: str | None = None,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.pop("PGQ_DSN", None)
    full_env["PYTHONPATH"] = str(ROOT / "tests" / "acceptance" / "apps")
    if dsn is not None:
        full_env["PGQ_DSN"] = dsn
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pgq_supervisor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=ROOT,
    )


def count_query(where: str) -> sql.Composed:
    """Counts jobs matching a condition written in the test itself (never input)."""
    return sql.SQL("SELECT count(*) FROM pgq.job WHERE {}").format(sql.SQL(where))


def count(dsn: str, where: str = "true") -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(count_query(where)).fetchone()
    assert row is not None
    return int(row[0])
