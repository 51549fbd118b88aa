"""`python -m pgq_supervisor dashboard` in a subprocess, for the browser and CLI tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.processes import ROOT
from tests.support.waiting import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Served:
    """A server command on a free port (`{port}` in `argv` is replaced), logs to a file."""

    def __init__(self, argv: list[str], env: dict[str, str], prefix: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkstemp(prefix=prefix, suffix=".log")[1])
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [a.replace("{port}", str(self.port)) for a in argv],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )  # fmt: skip

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


class Dashboard(Served):
    """The real `dashboard` command on a free port, logs to a file. `args` are its flags, `env`
    variables added to the test's environment (PGQ_DSN removed: the DSN is a flag)."""

    def __init__(self, dsn: str, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PGQ_DASHBOARD_")}
        full_env.pop("PGQ_DSN", None)
        full_env.update(env or {})
        argv = [sys.executable, "-m", "pgq_supervisor", "dashboard", "--dsn", dsn,
                "--port", "{port}", *args]  # fmt: skip
        super().__init__(argv, full_env, "pgq-dash-")

    def up(self) -> bool:
        """Answering HTTP (any status: a 401 asking for credentials is an answer)."""
        assert self.proc.poll() is None, self.log()
        try:
            with urllib.request.urlopen(self.url + "/", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def wait_up(self) -> Dashboard:
        wait_for("the dashboard answering", self.up)
        return self
