"""The demo: sample handlers, and a driver that runs them through a real supervisor.

`./scripts/demo` (or `python -m pgq_supervisor demo`) enqueues a few hundred jobs (CPU-bound
ones, flaky ones that fail and then succeed on retry, a bundle with a completion job), starts
`python -m pgq_supervisor run` as a child process with its log going to a file, shows a live
per-type view read from the database until every job is done, prints a summary and stops the
supervisor with SIGTERM. The supervisor's log reaches the terminal only when it fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

import pydantic

from pgq_supervisor import db, ids
from pgq_supervisor.client import enqueue_bundle, enqueue_many
from pgq_supervisor.connect import open_db
from pgq_supervisor.display import per_second, plural
from pgq_supervisor.errors import ExitCode
from pgq_supervisor.jobs import Bundle, Job, JobState, NewJob
from pgq_supervisor.redaction import redact
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
    bundle = db.get_bundle(conn, db.default_schema(), ids.bundle_id(payload["bundle_id"]))
    return {"bundle": str(bundle.id), "parts": bundle.num_jobs_stopped}


TYPES = ("demo.fib", "demo.flaky", "demo.part", "demo.report")
FRAME = 0.25  # the live view redraws four times a second
PLAIN_EVERY = 3.0  # seconds between progress lines when stdout is not a terminal
STALL = 60.0  # no job finished for this long: the supervisor is not working
LOG_TAIL = 30  # lines of the supervisor's log shown when it fails
BAR = 24


def enqueue_demo_jobs(conn: db.Conn, schema: str, origin: str, jobs: int) -> tuple[int, Bundle]:
    """Enqueue about `jobs` jobs; returns how many will run (the completion job included)."""
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
        bundle = enqueue_bundle(
            conn,
            "demo.import",
            [NewJob("demo.part", {"i": i}, origin=origin) for i in range(n_parts)],
            on_complete="demo.report",
            origin=origin,
            schema=schema,
        )
    total = n_fib + n_flaky + n_parts + 1
    print(
        f"enqueued {plural(total, 'job')} (origin {origin}):\n"
        f"  {n_fib:>5} demo.fib     CPU-bound: each child process has its own interpreter\n"
        f"  {n_flaky:>5} demo.flaky   fail once or twice, then succeed on retry\n"
        f"  {n_parts:>5} demo.part    a bundle; its completion job demo.report runs once after them"
    )
    return total, bundle


# ---- the live view: pure functions from database counts to lines --------------------------


@dataclasses.dataclass
class Counts:
    done: int = 0  # succeeded
    running: int = 0
    pending: int = 0
    retried: int = 0  # retry attempts so far
    failed: int = 0
    finished: int = 0  # any terminal state


def tally(rows: Iterable[tuple[str, JobState, int, float | None, int]]) -> dict[str, Counts]:
    """Per-type counts from `db.summary_by_origin` rows (type, state, count, mean, attempts)."""
    out = {t: Counts() for t in TYPES}
    for type_, state, count, _mean, failed_attempts in rows:
        c = out.setdefault(type_, Counts())
        c.done += count if state is JobState.SUCCEEDED else 0
        c.running += count if state is JobState.RUNNING else 0
        c.pending += count if state is JobState.PENDING else 0
        c.failed += count if state is JobState.FAILED else 0
        c.finished += count if state.is_terminal else 0
        # every failed attempt was retried except the last one of each failed job
        c.retried += failed_attempts - (count if state is JobState.FAILED else 0)
    return out


def render(
    counts: dict[str, Counts],
    *,
    elapsed: float,
    total: int,
    procs: int,
    claim_batch: int = 200,
    concurrency: int = 1,
) -> list[str]:
    """The live view: a header line, what `running` counts, then one row per job type."""
    finished = sum(c.finished for c in counts.values())
    rate = per_second(finished, elapsed, "jobs") or "- jobs/s"
    filled = min(BAR, BAR * finished // total) if total > 0 else BAR
    # more running than procs: a child holds the batch it claimed as running (sync.py)
    at_once = "one" if concurrency == 1 else f"up to {concurrency}"
    lines = [
        f"{elapsed:6.1f} s  {rate:>13}  {plural(procs, 'proc')}"
        f"  [{'#' * filled}{'.' * (BAR - filled)}] {finished}/{total}",
        f"  {sum(c.running for c in counts.values())} running on {plural(procs, 'proc')}"
        f" (up to {claim_batch} in flight per child, run {at_once} at a time)",
        f"  {'type':<13}{'done':>8}{'running':>9}{'pending':>9}{'retried':>9}{'failed':>8}",
    ]
    for type_, c in counts.items():
        lines.append(
            f"  {type_:<13}{c.done:>8}{c.running:>9}{c.pending:>9}{c.retried:>9}{c.failed:>8}"
        )
    return lines


def plain_line(counts: dict[str, Counts], *, elapsed: float, total: int) -> str:
    """One progress line, for output that is not a terminal."""
    cs = counts.values()
    return (
        f"progress {elapsed:.1f} s: {sum(c.finished for c in cs)}/{total} finished"
        f"  running {sum(c.running for c in cs)}  pending {sum(c.pending for c in cs)}"
        f"  retried {sum(c.retried for c in cs)}  failed {sum(c.failed for c in cs)}"
    )


class LiveView:
    """Redraws in place on a terminal (cursor up, rewrite); elsewhere prints a line at times."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.drawn = 0
        self.last_plain: float | None = None

    def show(self, lines: list[str], plain: str, now: float, *, final: bool = False) -> None:
        if self.tty:
            # a line longer than the terminal would wrap and break the count of lines to go up
            width = max(20, shutil.get_terminal_size().columns - 1)
            up = f"\x1b[{self.drawn}A\r" if self.drawn else "\x1b[?25l"  # hide the cursor
            body = "".join(f"{line[:width]}\x1b[K\n" for line in lines)
            self.out.write(up + body)
            self.out.flush()
            self.drawn = len(lines)
        elif final or self.last_plain is None or now - self.last_plain >= PLAIN_EVERY:
            print(plain, file=self.out, flush=True)
            self.last_plain = now

    def close(self) -> None:
        if self.tty and self.drawn:
            self.out.write("\x1b[?25h")  # show the cursor again
            self.out.flush()


# ---- the driver ----------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """`demo`: asks before it writes into a database the user named, then runs."""
    if settings.dsn and not args.yes and not _demo_may_write(settings.dsn, args.jobs):
        return int(ExitCode.USAGE)
    dsn, conn = open_db(settings, migrate=True, wait=True)
    conn.close()
    return run_demo(dsn, settings, jobs=args.jobs, procs=args.procs)


def _demo_may_write(dsn: str, jobs: int) -> bool:
    """Whether the demo may migrate and fill a database the user named: asked on a terminal;
    elsewhere (a script, CI) only --yes says so."""
    what = (
        f"the demo migrates schema pgq and enqueues about {jobs} sample jobs into"
        f" {redact(dsn)} (unset PGQ_DSN to use an embedded server instead)"
    )
    if not sys.stdin.isatty():
        print(f"error: {what}; pass --yes to go ahead", file=sys.stderr)
        return False
    answer = input(f"{what}. Go ahead? [y/N] ")
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("nothing written", file=sys.stderr)
    return False


def run_demo(dsn: str, settings: Settings, *, jobs: int, procs: int | None) -> int:
    schema = settings.db_schema
    origin = f"demo:{uuid.uuid4().hex[:8]}"
    procs = procs or min(4, os.cpu_count() or 2)
    log_path = _new_log_path()
    with db.connect(dsn, prepare_threshold=settings.prepare_threshold) as conn:
        total, bundle = enqueue_demo_jobs(conn, schema, origin, jobs)
        print(f"supervisor: {plural(procs, 'proc')}, its log in {log_path}\n", flush=True)
        sup = _start_supervisor(dsn, settings, procs, log_path)
        started = time.monotonic()
        view = LiveView(sys.stdout)
        interrupted = False
        try:
            failure = _watch(conn, settings, origin, total, procs, sup, view, started)
        except KeyboardInterrupt:
            failure, interrupted = "interrupted", True
        finally:
            view.close()
            elapsed = time.monotonic() - started
            code = _stop(sup)
        if failure is None:
            _print_summary(conn, schema, origin, bundle, elapsed)
    if interrupted:
        how = "stopped cleanly" if code == 0 else _describe(code)
        print(f"\ninterrupted; the supervisor {how}; its log: {log_path}")
        return 130
    if failure is None and code != 0:
        failure = f"the supervisor {_describe(code)} when asked to stop"
    if failure is not None:
        _print_log_tail(log_path, f"demo: {failure}")
        return 1
    print(f"supervisor stopped cleanly with SIGTERM; its full log: {log_path}")
    return 0


def _new_log_path() -> Path:
    """.pgq/demo-<timestamp>.log next to the embedded server's data, never overwriting one."""
    folder = Path(".pgq").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 100):
        path = folder / (f"demo-{stamp}.log" if n == 1 else f"demo-{stamp}-{n}.log")
        try:
            path.open("x").close()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"too many demo logs named {folder}/demo-{stamp}*.log")


def _start_supervisor(
    dsn: str, settings: Settings, procs: int, log_path: Path
) -> subprocess.Popen[bytes]:
    # the file gets the full log (info, or debug if asked for) whatever the demo's own level
    level = "debug" if settings.log_level == "debug" else "info"
    env = dict(os.environ, PGQ_DSN=dsn, PGQ_SCHEMA=settings.db_schema)
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "pgq_supervisor", "run", "--app", "pgq_supervisor.demo:registry",
             "--procs", str(procs), "--log-level", level, "--log-format", settings.log_format,
             "--poll-interval", "0.5"],
            env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _watch(
    conn: db.Conn,
    settings: Settings,
    origin: str,
    total: int,
    procs: int,
    sup: subprocess.Popen[bytes],
    view: LiveView,
    started: float,
) -> str | None:
    """Show the live view until every job finished (None) or the supervisor fails (why)."""
    last_finished, last_progress = -1, started
    while True:
        counts = tally(db.summary_by_origin(conn, settings.db_schema, origin))
        now = time.monotonic()
        finished = sum(c.finished for c in counts.values())
        final = finished >= total
        elapsed = now - started
        view.show(
            render(
                counts,
                elapsed=elapsed,
                total=total,
                procs=procs,
                claim_batch=settings.claim_batch,
                concurrency=settings.concurrency,
            ),
            plain_line(counts, elapsed=elapsed, total=total),
            now,
            final=final,
        )
        if final:
            return None
        if finished != last_finished:
            last_finished, last_progress = finished, now
        elif now - last_progress > STALL:
            return f"no job finished in {STALL:.0f} s"
        try:
            sup.wait(timeout=FRAME)  # the frame clock, cut short if the supervisor exits
        except subprocess.TimeoutExpired:
            continue
        return f"the supervisor {_describe(sup.returncode)} before the jobs finished"


def _stop(sup: subprocess.Popen[bytes]) -> int | None:
    if sup.poll() is None:
        sup.send_signal(signal.SIGTERM)
    try:
        return sup.wait(timeout=60)
    except subprocess.TimeoutExpired:
        sup.kill()
        sup.wait()
        return None


def _describe(code: int | None) -> str:
    if code is None:
        return "did not stop in 60 s and was killed"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _print_log_tail(log_path: Path, why: str) -> None:
    lines = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL:]
    print(f"{why}; the last {len(lines)} lines of {log_path}:", file=sys.stderr)
    for line in lines:
        print(f"  {line}", file=sys.stderr)


def _print_summary(conn: db.Conn, schema: str, origin: str, bundle: Bundle, elapsed: float) -> None:
    rows = db.summary_by_origin(conn, schema, origin)
    print(f"\n{'type':<14}{'state':<11}{'jobs':>6}{'mean s':>9}{'failed attempts':>17}")
    for type_, state, count, mean, attempts in rows:
        shown = f"{mean:.3f}" if mean is not None else "-"
        print(f"{type_:<14}{state.value:<11}{count:>6}{shown:>9}{attempts:>17}")
    b = db.get_bundle(conn, schema, bundle.id)
    report = {s for t, s, _c, _m, _a in rows if t == b.on_complete}
    print(
        f"\nbundle {b.type}: {b.num_jobs_stopped}/{b.num_jobs} parts finished; completion job"
        f" {b.on_complete}: {', '.join(sorted(report)) or 'not enqueued'}"
    )
    total = sum(r[2] for r in rows)
    retries = sum(c.retried for c in tally(rows).values())
    rate = per_second(total, elapsed, "jobs")
    print(
        f"{plural(total, 'job')} in {elapsed:.1f} s" + (f" ({rate})" if rate else "")
        + f"; {plural(retries, 'expected retry', 'expected retries')}, logged as warnings in"
        " the supervisor's log"
    )  # fmt: skip
