"""A whole pod dies: SIGKILL of one supervisor's process group while two others run. The figure
is the time from the kill to the next start of the job its child was running, by the other
supervisors (through the freed session lock, schema/0017, not the heartbeat timeout)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg

import pgq_supervisor as pgq
from benchmarks.apps import CRASH
from benchmarks.enqueue import reset
from benchmarks.probes import attempt_started
from benchmarks.procs import BenchError, Supervisor, wait_for
from benchmarks.report import Json
from benchmarks.server import SCHEMA

PODS = 3
ORPHAN_ERROR = "worker died: its supervisor's database session ended"


def locked(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute(
        f"SELECT count(*) FROM {SCHEMA}.supervisor WHERE locked_on IS NOT NULL"
    ).fetchone()
    return int(str(row[0])) if row is not None else 0


@contextlib.contextmanager
def pods() -> Iterator[list[Supervisor]]:
    """The supervisors started inside; each is closed (killed if need be) on the way out."""
    started: list[Supervisor] = []
    try:
        yield started
    finally:
        for sup in started:
            sup.close()


def run_dead_pod(
    dsn: str, kills: int, procs: int = 2, supervisor_args: Sequence[str] = ()
) -> tuple[list[float], dict[str, Json]]:
    """`kills` times: SIGKILL the process group of the supervisor whose child runs the probe
    job, with PODS - 1 others running, and start a replacement. Each sample: ms from the kill to
    the job's next start. Every death must be in the job's history as its supervisor's."""
    reset(dsn)
    fd, name = tempfile.mkstemp(prefix="pgqb-deadpod-", suffix=".log")
    os.close(fd)
    log = Path(name)
    samples: list[float] = []
    args = ["--shutdown-timeout", "1", *supervisor_args]
    try:
        with pods() as sups, psycopg.connect(dsn, autocommit=True) as conn:

            def top_up() -> None:
                while len(sups) < PODS:
                    sups.append(Supervisor(dsn, procs, args))
                    sups[-1].wait_idle()
                wait_for("every pod's locked row", lambda: locked(conn) == PODS, 30.0, 0.01)

            top_up()
            job_id = pgq.enqueue(conn, CRASH, {"log": str(log)}, schema=SCHEMA)
            for k in range(kills):
                start = wait_for(f"attempt {k + 1}", attempt_started(log, k + 1), 30.0, 0.001)
                victim = next((s for s in sups if start.pid in {w.pid for w in s.workers()}), None)
                if victim is None:
                    raise BenchError(f"pid {start.pid} that ran the job is none of our pods'")
                killed_at = time.time()
                victim.kill()
                rerun = wait_for(f"attempt {k + 2}", attempt_started(log, k + 2), 60.0, 0.0005)
                samples.append((rerun.at - killed_at) * 1000)
                victim.proc.wait(timeout=10)
                victim.close()
                sups.remove(victim)
                top_up()
            row = conn.execute(
                f"SELECT attempts FROM {SCHEMA}.job WHERE id = %s", (job_id,)
            ).fetchone()
            codes = [sup.stop() for sup in sups]
    finally:
        log.unlink(missing_ok=True)
    attempts = row[0] if row is not None and isinstance(row[0], list) else []
    deaths = [a for a in attempts if isinstance(a, dict) and a.get("error") == ORPHAN_ERROR]
    if len(deaths) != kills:
        raise BenchError(f"{kills} pods killed, but the history records {len(deaths)} such deaths")
    return samples, {
        "samples_ms": [round(x, 2) for x in samples],
        "pods": PODS,
        "procs": procs,
        "supervisor_exits": list(codes),
    }
