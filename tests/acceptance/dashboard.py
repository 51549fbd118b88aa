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

from tests.acceptance.helpers import ROOT, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Dashboard:
    """The real `dashboard` command on a free port, logs to a file. `args` are its flags, `env`
    variables added to the test's environment (PGQ_DSN removed: the DSN is a flag)."""

    def __init__(self, dsn: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkstemp(prefix="pgq-dash-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PGQ_DASHBOARD_")}
        full_env.pop("PGQ_DSN", None)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgq_supervisor", "dashboard", "--dsn", dsn,
             "--port", str(self.port), *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT,
        )  # fmt: skip

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

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

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
