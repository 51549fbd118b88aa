"""The demo: sample handlers, and a driver that runs them through a real supervisor.

`./scripts/demo` (or `python -m pgq_supervisor demo`) enqueues a few hundred jobs (CPU-bound
ones, flaky ones that fail and then succeed on retry, a bundle with a completion job), starts
`python -m pgq_supervisor run` as a child process, shows progress until every job is done,
prints a summary and stops the supervisor with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pydantic

from pgq_supervisor import db
from pgq_supervisor.client import enqueue_bundle, enqueue_many
from pgq_supervisor.jobs import BundleId, Job, JobState, NewJob
from pgq_supervisor.registry import Registry, RetryPolicy
from pgq_supervisor.settings import Settings

registry = Registry()
QUICK_RETRY = RetryPolicy(base=0.2, cap=1.0)


class FibPayload(pydantic.BaseModel):
    n: int = pydantic.Field(ge=0, le=32)


def _fib(n: int) -> int:
    return n if n < 2 else _fib(n - 1) + _fib(n - 2)


@registry.handler("demo.fib", timeout=30)
def fib(payload: FibPayload) -> dict[str, int]:
    """CPU-bound: the GIL would serialise this in threads; here each child has its own."""
    return {"n": payload.n, "fib": _fib(payload.n)}


@registry.handler("demo.flaky", max_retry_count=3, retry=QUICK_RETRY)
def flaky(payload: dict[str, int], job: Job) -> dict[str, int]:
    """Fails its first `fail_times` attempts, then succeeds."""
    if job.attempt <= payload.get("fail_times", 1):
        raise RuntimeError(f"simulated failure on attempt {job.attempt}")
    return {"attempts": job.attempt}


@registry.handler("demo.part")
def part(payload: dict[str, int]) -> dict[str, int]:
    return {"square": payload["i"] ** 2}


@registry.handler("demo.report")
def report(payload: dict[str, str], conn: db.Conn) -> dict[str, object]:
    """The bundle's completion job: runs once, after every part has finished."""
    bundle = db.get_bundle(conn, db.default_schema(), BundleId(uuid.UUID(payload["bundle_id"])))
    return {"bundle": str(bundle.id), "parts": bundle.num_jobs_stopped}


def enqueue_demo_jobs(conn: db.Conn, schema: str, origin: str, jobs: int) -> int:
    n_fib = max(1, jobs * 2 // 3)
    n_flaky = max(1, jobs // 6)
    n_parts = max(1, jobs - n_fib - n_flaky)
    with conn.transaction():
        enqueue_many(
            conn,
            [NewJob("demo.fib", {"n": 18 + i % 6}, origin=origin) for i in range(n_fib)]
            + [
                NewJob("demo.flaky", {"fail_times": 1 + i % 2}, origin=origin)
                for i in range(n_flaky)
            ],
            schema=schema,
        )
        enqueue_bundle(
            conn,
            "demo.import",
            [NewJob("demo.part", {"i": i}, origin=origin) for i in range(n_parts)],
            on_complete="demo.report",
            origin=origin,
            schema=schema,
        )
    return n_fib + n_flaky + n_parts + 1


def run_demo(dsn: str, settings: Settings, *, jobs: int, procs: int | None) -> int:
    schema = settings.db_schema
    origin = f"demo:{uuid.uuid4().hex[:8]}"
    procs = procs or min(4, os.cpu_count() or 2)
    with db.connect(dsn) as conn:
        total = enqueue_demo_jobs(conn, schema, origin, jobs)
        print(f"enqueued {total} jobs ({origin}); starting the supervisor with {procs} procs")
        env = dict(os.environ, PGQ_DSN=dsn, PGQ_SCHEMA=schema)
        sup = subprocess.Popen(
            [sys.executable, "-m", "pgq_supervisor", "run", "--app", "pgq_supervisor.demo:registry",
             "--procs", str(procs), "--log-level", "warning", "--poll-interval", "0.5"],
            env=env,
        )  # fmt: skip
        started = time.monotonic()
        try:
            done = _show_progress(conn, schema, origin, total, sup)
        finally:
            if sup.poll() is None:
                sup.send_signal(signal.SIGTERM)
            code = sup.wait(timeout=60)
        elapsed = time.monotonic() - started
        _print_summary(conn, schema, origin, elapsed)
    if not done:
        print("demo: the supervisor stopped before the jobs finished", file=sys.stderr)
        return 1
    print(f"supervisor stopped cleanly (exit {code})")
    return 0 if code == 0 else 1


def _show_progress(
    conn: db.Conn, schema: str, origin: str, total: int, sup: subprocess.Popen[bytes]
) -> bool:
    tty = sys.stdout.isatty()
    last_print = 0.0
    while sup.poll() is None:
        counts = {s: 0 for s in JobState}
        for _type, state, count, _mean, _attempts in db.summary_by_origin(conn, schema, origin):
            counts[state] += count
        finished = sum(counts[s] for s in JobState if s.is_terminal)
        line = (
            f"progress: {finished}/{total} done  running={counts[JobState.RUNNING]}"
            f"  pending={counts[JobState.PENDING]}  failed={counts[JobState.FAILED]}"
        )
        now = time.monotonic()
        if tty:
            print("\r" + line, end="", flush=True)
        elif now - last_print > 1.0:
            print(line, flush=True)
            last_print = now
        if finished >= total:
            print("\n" if tty else line, end="" if tty else "\n", flush=True)
            return True
        time.sleep(0.2)  # a progress display, not a test: redraw five times a second
    return False


def _print_summary(conn: db.Conn, schema: str, origin: str, elapsed: float) -> None:
    rows = db.summary_by_origin(conn, schema, origin)
    print(f"\n{'type':<14}{'state':<11}{'jobs':>6}{'mean s':>9}{'failed attempts':>17}")
    for type_, state, count, mean, attempts in rows:
        shown = f"{mean:.3f}" if mean is not None else "-"
        print(f"{type_:<14}{state.value:<11}{count:>6}{shown:>9}{attempts:>17}")
    total = sum(r[2] for r in rows)
    print(f"\n{total} jobs in {elapsed:.1f} s")
