"""Processes the harness starts: the real supervisor CLI and peer workers, read through /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
P = TypeVar("P", bound="Process")


class BenchError(Exception):
    """A measure could not be taken; the message says why in one line."""


def wait_for(what: str, check: Callable[[], T | None], timeout: float, interval: float = 0.01) -> T:
    """Poll `check` until it returns something truthy; BenchError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def child_env() -> dict[str, str]:
    """Our environment minus PGQ_* (the flags say everything), with the repo importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQ_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    title: str


def children_of(pid: int) -> list[ProcInfo]:
    """Direct children of `pid` with their command line (a process title set by setproctitle)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
            # the command name may hold spaces and parentheses: fields start after the last ')'
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
            if ppid != pid:
                continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                title = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        out.append(ProcInfo(int(entry.name), title))
    return out


def descendants(pid: int) -> list[ProcInfo]:
    """Children of `pid`, and theirs, and so on (the workers are the fork server's children)."""
    out = []
    todo = [pid]
    while todo:
        found = children_of(todo.pop())
        out += found
        todo += [c.pid for c in found]
    return out


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS from /proc/<pid>/status; Rss, Pss and USS (Private_Clean + Private_Dirty) from
    smaps_rollup, in KiB."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "RssAnon:", "RssFile:")):
                key, value = line.split(":", 1)
                found[key] = int(value.split()[0])
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
                found[key] = int(value.split()[0])
    if "Private_Clean" in found and "Private_Dirty" in found:
        found["Uss"] = found["Private_Clean"] + found["Private_Dirty"]
    return found


class Process:
    """A subprocess in its own session, output to a log file; stop() is SIGTERM, then SIGKILL."""

    def __init__(self, cmd: Sequence[str], name: str) -> None:
        fd, path = tempfile.mkstemp(prefix=f"pgqb-{name}-", suffix=".log")
        self.log_path = Path(path)
        self.cmd = list(cmd)
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env(),
                cwd=ROOT,
                start_new_session=True,  # a Ctrl-C at the terminal reaches only the harness
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise BenchError(f"{self.cmd[2]} exited early with {code}: {self.log_tail(3)}")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BenchError(
                f"{' '.join(self.cmd[:4])} still running after {timeout:g} s"
            ) from None

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait; SIGKILL the whole session if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait(timeout=10)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        """Make sure nothing we started outlives us, and remove the log (errors quote its tail)."""
        if self.proc.poll() is None:
            self.kill()
            self.proc.wait(timeout=10)
        with contextlib.suppress(OSError):
            self.log_path.unlink()


class Supervisor(Process):
    """`python -m pgq_supervisor run --app benchmarks.apps:registry ...`."""

    def __init__(
        self, dsn: str, procs: int, extra: Sequence[str] = (), app: str = "benchmarks.apps:registry"
    ) -> None:
        super().__init__(
            [
                sys.executable,
                "-m",
                "pgq_supervisor",
                "run",
                "--app",
                app,
                "--procs",
                str(procs),
                "--schema",
                "pgq",
                "--dsn",
                dsn,
                *extra,
            ],
            "supervisor",
        )
        self.procs = procs

    def workers(self) -> list[ProcInfo]:
        return [c for c in descendants(self.pid) if c.title.startswith("pgq-worker[")]

    def wait_idle(self, timeout: float = 60.0) -> list[ProcInfo]:
        """Wait until all `procs` children exist and show the idle title; returns them."""

        def idle() -> list[ProcInfo] | None:
            self.check_alive()
            workers = self.workers()
            if len(workers) == self.procs and all(w.title.endswith(" idle") for w in workers):
                return workers
            return None

        return wait_for(f"{self.procs} idle children", idle, timeout, interval=0.01)


@contextlib.contextmanager
def running(proc: P) -> Iterator[P]:
    """Close (kill if needed) a Process on the way out, whatever happened."""
    try:
        yield proc
    finally:
        proc.close()
