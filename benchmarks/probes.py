"""Latency probes against a running supervisor: wake-up, SIGKILL to rerun, idle RSS, cancel of
a running job to a free child; the memory of idle children and their start-up time.

Times that cross processes are wall-clock (time.time()) on the one host: the harness stamps
the enqueue commit or the kill, the handler stamps its own start.
"""

from __future__ import annotations

import math
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.rows import TupleRow

import pgq_supervisor as pgq
from benchmarks.apps import BUSY, CRASH, WAKE
from benchmarks.enqueue import reset
from benchmarks.procs import (
    BenchError,
    ProcInfo,
    Supervisor,
    descendants,
    memory_kib,
    running,
    wait_for,
)
from benchmarks.report import Json
from benchmarks.server import SCHEMA

WARMUP = 5


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def titles(workers: Sequence[ProcInfo]) -> list[str]:
    """Current process titles of known children (cheaper than scanning /proc)."""
    out = []
    for w in workers:
        try:
            with open(f"/proc/{w.pid}/cmdline", "rb") as f:
                out.append(f.read().replace(b"\0", b" ").decode(errors="replace").strip())
        except OSError:
            out.append("")  # gone
    return out


@dataclass(frozen=True, slots=True)
class WakeRun:
    latencies_ms: list[float]
    rss_kib: list[dict[str, int]]  # one per idle child, after the probe

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 99)

    @property
    def rss_mib(self) -> float:
        return max(r["VmRSS"] for r in self.rss_kib) / 1024

    def details(self) -> dict[str, Json]:
        lat = self.latencies_ms
        return {
            "samples": len(lat),
            "min_ms": round(min(lat), 3),
            "max_ms": round(max(lat), 3),
            "mean_ms": round(sum(lat) / len(lat), 3),
        }

    def rss_details(self) -> dict[str, Json]:
        return {"children": [dict(r) for r in self.rss_kib]}


def run_wake(
    dsn: str, samples: int, procs: int = 2, supervisor_args: Sequence[str] = ()
) -> WakeRun:
    """Enqueue one job at a time into a queue whose children are all idle; the latency is the
    handler's start minus the moment the enqueue's commit returned."""
    reset(dsn)
    latencies: list[float] = []
    rng = random.Random(5)
    with (
        running(Supervisor(dsn, procs, supervisor_args)) as sup,
        psycopg.connect(dsn) as conn,
        psycopg.connect(dsn, autocommit=True) as listen,
    ):
        workers = sup.wait_idle()
        listen.execute("LISTEN pgq_job_stopped")
        for i in range(WARMUP + samples):
            job_id = pgq.enqueue(conn, WAKE, {}, schema=SCHEMA)
            conn.commit()
            committed = time.time()
            wait_stopped(listen, str(job_id))
            row = conn.execute(
                "SELECT (result->>'t')::float8 FROM pgq.job WHERE id = %s AND state = 'succeeded'",
                (job_id,),
            ).fetchone()
            conn.commit()
            if row is None or row[0] is None:
                raise BenchError(f"wake job {job_id} did not succeed: {sup.log_tail(3)}")
            if i >= WARMUP:
                latencies.append((float(row[0]) - committed) * 1000)
            wait_for(
                "idle children",
                lambda: all(t.endswith(" idle") for t in titles(workers)),
                5.0,
                0.0005,
            )
            time.sleep(rng.uniform(0.002, 0.006))
        rss = [memory_kib(w.pid) for w in sup.wait_idle()]
        code = sup.stop()
        if code != 0:
            raise BenchError(f"supervisor exited {code} on SIGTERM: {sup.log_tail(3)}")
    return WakeRun(latencies, rss)


@dataclass(frozen=True, slots=True)
class MemoryRun:
    procs: int
    startup_s: float  # supervisor started → every child idle (booted, connected, first claim)
    respawn_ms: float  # SIGKILL of an idle child → its successor idle
    children_kib: list[dict[str, int]]  # one per idle child: VmRSS, Rss, Pss, Uss, ...
    server_kib: dict[str, int]  # the fork server the children share pages with

    def largest(self, key: str) -> float:
        """The largest `key` (Uss, Pss, VmRSS) of the idle children, in MiB."""
        return max(c.get(key, 0) for c in self.children_kib) / 1024

    def details(self) -> dict[str, Json]:
        return {
            "procs": self.procs,
            "startup_s": round(self.startup_s, 3),
            "respawn_ms": round(self.respawn_ms, 1),
            "children_kib": [dict(c) for c in self.children_kib],
            "forkserver_kib": dict(self.server_kib),
        }


def run_memory(dsn: str, procs: int = 8, supervisor_args: Sequence[str] = ()) -> MemoryRun:
    """Start a supervisor with `procs` children and time it until every child is idle; read
    each idle child's memory from /proc (RSS, PSS, USS); then SIGKILL one idle child and time
    until its successor is idle."""
    reset(dsn)
    started = time.monotonic()
    with running(Supervisor(dsn, procs, supervisor_args)) as sup:
        workers = sup.wait_idle()
        startup = time.monotonic() - started
        time.sleep(0.5)  # let the first claims' garbage settle before reading memory
        workers = sup.wait_idle()
        memory = [memory_kib(w.pid) for w in workers]
        servers = [p for p in descendants(sup.pid) if p.title.startswith("pgq-forkserver")]
        server = memory_kib(servers[0].pid) if servers else {}
        victim = workers[0]
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)

        def successor() -> bool:
            now = sup.workers()
            return (
                victim.pid not in {w.pid for w in now}
                and len(now) == procs
                and all(w.title.endswith(" idle") for w in now)
            )

        wait_for("the killed child's successor idle", successor, 30.0, 0.001)
        respawn = (time.monotonic() - killed_at) * 1000
        code = sup.stop()
        if code != 0:
            raise BenchError(f"supervisor exited {code} on SIGTERM: {sup.log_tail(3)}")
    return MemoryRun(procs, startup, respawn, memory, server)


def wait_stopped(listen: psycopg.Connection[TupleRow], job_id: str) -> None:
    """Wait for pgq_job_stopped naming `job_id` (payloads are comma-separated ids)."""
    deadline = time.monotonic() + 10.0
    while (left := deadline - time.monotonic()) > 0:
        for note in listen.notifies(timeout=left):
            if job_id in note.payload.split(","):
                return
    raise BenchError(f"job {job_id} did not finish within 10 s")


@dataclass(frozen=True, slots=True)
class Start:
    attempt: int
    pid: int
    at: float


def read_starts(path: Path) -> list[Start]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        attempt, pid, at = line.split()
        out.append(Start(int(attempt), int(pid), float(at)))
    return out


def run_kill(
    dsn: str, kills: int, procs: int = 2, supervisor_args: Sequence[str] = ()
) -> tuple[list[float], dict[str, Json]]:
    """SIGKILL the child running a long job `kills` times; each sample is the time from the
    kill to the handler's next start (ms). The job's type retries without backoff. Each death
    must be in the job's attempt history."""
    reset(dsn)
    fd, name = tempfile.mkstemp(prefix="pgqb-starts-", suffix=".log")
    os.close(fd)
    log = Path(name)
    samples: list[float] = []
    pids: list[Json] = []
    args = ["--shutdown-timeout", "1", *supervisor_args]  # the last job sleeps: don't wait it out
    try:
        with running(Supervisor(dsn, procs, args)) as sup, psycopg.connect(dsn) as conn:
            sup.wait_idle()
            job_id = pgq.enqueue(conn, CRASH, {"log": str(log)}, schema=SCHEMA)
            conn.commit()
            for k in range(kills):
                start = wait_for(f"attempt {k + 1}", attempt_started(log, k + 1), 30.0, 0.001)
                settled(sup)
                if start.pid not in {w.pid for w in sup.workers()}:
                    raise BenchError(f"pid {start.pid} that ran the job is not our child")
                killed_at = time.time()
                os.kill(start.pid, signal.SIGKILL)
                rerun = wait_for(f"attempt {k + 2}", attempt_started(log, k + 2), 30.0, 0.0005)
                samples.append((rerun.at - killed_at) * 1000)
                pids.append({"killed": start.pid, "rerun_by": rerun.pid})
            code = sup.stop()
            row = conn.execute("SELECT attempts FROM pgq.job WHERE id = %s", (job_id,)).fetchone()
    finally:
        log.unlink(missing_ok=True)
    attempts = row[0] if row is not None and isinstance(row[0], list) else []
    deaths = [a for a in attempts if isinstance(a, dict) and "SIGKILL" in str(a.get("error"))]
    if len(deaths) != kills:
        raise BenchError(f"{kills} kills, but the job's history records {len(deaths)} deaths")
    return samples, {
        "samples_ms": [round(x, 2) for x in samples],
        "pids": pids,
        "supervisor_exit": code,
    }


def attempt_started(log: Path, attempt: int) -> Callable[[], Start | None]:
    return lambda: next((s for s in read_starts(log) if s.attempt == attempt), None)


def settled(sup: Supervisor) -> None:
    """Before a kill: every child is up, and each is either idle or running the probe job, so a
    rerun never waits for a child that is still booting."""

    def ok() -> bool:
        sup.check_alive()
        workers = sup.workers()
        return len(workers) == sup.procs and all(
            w.title.endswith(" idle") or f" {CRASH} " in w.title for w in workers
        )

    wait_for("children to settle", ok, 60.0, 0.01)
    time.sleep(0.05)


def run_cancel(
    dsn: str, cancels: int, supervisor_args: Sequence[str] = ()
) -> tuple[list[float], dict[str, Json]]:
    """One child runs a CPU-bound job that never returns (no timeout) while a probe job waits
    behind it; the sample is the time from the moment the cancel's commit returned to the
    probe's handler start (ms): the cancel landed, the child was killed, a new one booted,
    claimed and ran. Each cancelled job must end `cancelled` with one cancelled attempt."""
    reset(dsn)
    samples: list[float] = []
    with running(Supervisor(dsn, 1, supervisor_args)) as sup, psycopg.connect(dsn) as conn:
        sup.wait_idle()
        for _ in range(cancels):
            busy = pgq.enqueue(conn, BUSY, {}, schema=SCHEMA)
            conn.commit()
            wait_for("the busy job running", lambda: f" {BUSY} " in "".join(titles(sup.workers())),
                     30.0, 0.001)  # fmt: skip
            probe = pgq.enqueue(conn, WAKE, {}, schema=SCHEMA)
            conn.commit()
            pgq.cancel_job(conn, busy, schema=SCHEMA)
            conn.commit()
            committed = time.time()
            started = wait_for("the probe job run", _result_time(conn, probe), 30.0, 0.0005)
            samples.append((started - committed) * 1000)
            rec = pgq.get_job(conn, busy, schema=SCHEMA)
            conn.commit()
            kinds = [a.get("kind") for a in rec.attempts if isinstance(a, dict)]
            if rec.state is not pgq.JobState.CANCELLED or kinds != ["cancelled"]:
                raise BenchError(f"cancelled job ended {rec.state} with attempts {kinds}")
            sup.wait_idle()
        code = sup.stop()
    return samples, {"samples_ms": [round(x, 2) for x in samples], "supervisor_exit": code}


def _result_time(
    conn: psycopg.Connection[TupleRow], job_id: pgq.JobId
) -> Callable[[], float | None]:
    def check() -> float | None:
        row = conn.execute(
            "SELECT (result->>'t')::float8 FROM pgq.job WHERE id = %s AND state = 'succeeded'",
            (job_id,),
        ).fetchone()
        conn.commit()
        return None if row is None or row[0] is None else float(row[0])

    return check
