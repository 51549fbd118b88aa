"""A child worker process: claim, run, write outcomes.

    supervisor ──pipe──▶ child (main thread)          child (pgq-heartbeat thread)
      Wake / Stop          claim batch ◀─ job conn       every heartbeat_interval:
      ◀── Ready / Idle     run handler, one by one       UPDATE worker_alive_at
          Report           write outcomes (fenced)       for every job held (fenced),
      ◀── shared slot ──   slot = job in hand            on its own connection

The main thread claims up to a batch of jobs at once (sized from how long recent jobs took),
runs them in order and writes successes in one statement per batch. The heartbeat thread
keeps every held job alive until its outcome lands. The child sends Idle when a claim finds
nothing and then blocks on its pipe; pipe EOF (the supervisor is gone) makes it finish the job
in hand and exit. SIGINT is ignored: the supervisor decides when children stop.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Final

from setproctitle import getproctitle, setproctitle

from pgq_supervisor import db
from pgq_supervisor.errors import AppLoadError, DatabaseError, ExitCode
from pgq_supervisor.executor import Executor, Outcome
from pgq_supervisor.heartbeat import Heartbeat
from pgq_supervisor.ipc import BootFailed, Idle, JobSlot, Ready, Report, Retiring, Stop, Wake
from pgq_supervisor.jobs import Job, OutcomeKind
from pgq_supervisor.logs import setup_logging
from pgq_supervisor.registry import Registry, load_registry

log = logging.getLogger(__name__)

BATCH_BUDGET: Final = 0.05  # seconds of work one claim should take at most
REPORT_EVERY: Final = 0.25
CHECK_PIPE_EVERY: Final = 0.01


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """Everything a spawned child needs; plain data, pickled to the new interpreter."""

    index: int
    worker_id: str
    app: str
    dsn: str
    schema: str
    types: tuple[str, ...]
    heartbeat_interval: float
    claim_batch: int
    max_jobs: int | None
    max_memory_mb: int | None
    log_level: str
    log_format: str
    connect_timeout: float = 30.0
    synchronous_commit: bool = False


def child_main(spec: ChildSpec, pipe: Connection, slot: JobSlot) -> None:
    """Entry point of a spawned child. Exits 0 when told to stop, or CHILD_BOOT_FAILURE."""
    getproctitle()  # first: see cli.main
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(spec.log_level, spec.log_format)
    setproctitle(f"pgq-worker[{spec.index}] booting")
    try:
        registry = load_registry(spec.app)
    except AppLoadError as exc:
        pipe.send(BootFailed(str(exc), app_error=True))
        sys.exit(ExitCode.CHILD_BOOT_FAILURE)
    try:
        conn = connect_retrying(spec.dsn, spec.connect_timeout, spec.synchronous_commit)
    except DatabaseError as exc:
        pipe.send(BootFailed(str(exc), app_error=False))
        sys.exit(ExitCode.CHILD_BOOT_FAILURE)
    _trim_heap()
    Worker(spec, registry, pipe, slot, conn).run()
    sys.exit(0)


def _trim_heap() -> None:
    """Give the memory that booting freed (imports, validation set-up) back to the system, so
    an idle child costs less; glibc keeps it otherwise."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def connect_retrying(dsn: str, timeout: float, synchronous_commit: bool) -> db.Conn:
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            return db.connect(
                dsn, application_name="pgq-worker", synchronous_commit=synchronous_commit
            )
        except DatabaseError:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def rss_mb() -> float:
    with open("/proc/self/statm", "rb") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class Worker:
    def __init__(
        self, spec: ChildSpec, registry: Registry, pipe: Connection, slot: JobSlot, conn: db.Conn
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.pipe = pipe
        self.slot = slot
        self.conn = conn
        self.types = list(spec.types)
        self.max_retries = [registry.handlers[t].max_retry_count for t in self.types]
        self.executor = Executor(conn, spec.schema, registry, spec.worker_id)
        self.heartbeat = Heartbeat(
            lambda: db.connect(
                spec.dsn,
                application_name="pgq-heartbeat",
                synchronous_commit=spec.synchronous_commit,
            ),
            spec.schema,
            spec.heartbeat_interval,
            spec.worker_id,
        )
        self.stopping = False
        self.jobs_done = 0
        self.per_job = BATCH_BUDGET  # running estimate of seconds per job; sizes the claim
        self.outcomes: list[tuple[str, OutcomeKind, float]] = []
        self.latencies: list[float] = []
        self.last_report = time.monotonic()
        self.last_pipe_check = 0.0
        self.woken_at: float | None = None
        self.error_backoff = 0.1
        self.title_idle = f"pgq-worker[{spec.index}] idle"

    # ---- main loop ----

    def run(self) -> None:
        self.heartbeat.start()
        self.pipe.send(Ready(os.getpid()))
        idle = False
        try:
            while not self.stopping:
                if idle:
                    self._report()
                    setproctitle(self.title_idle)
                    self._wait_for_wake()
                    idle = False
                    continue
                jobs = self._claim()
                if jobs is None:
                    continue
                if not jobs:
                    self.pipe.send(Idle())
                    idle = True
                    continue
                self._run_batch(jobs)
                reason = self._retire_reason()
                if reason:
                    log.info("worker %s retiring: %s", self.spec.worker_id, reason)
                    self.pipe.send(Retiring(reason))
                    self.stopping = True
        except (BrokenPipeError, EOFError):
            self.stopping = True  # supervisor gone: the job in hand was finished, leave
        finally:
            self._flush_before_exit()
            # the supervisor may be gone; then nobody is left to report to
            with contextlib.suppress(OSError):
                self._report()
            self.heartbeat.stop()
            self.conn.close()

    def _flush_before_exit(self) -> None:
        """Successes waiting to ride on a claim that will not come are written now."""
        try:
            self._flush()
        except DatabaseError as exc:
            log.warning("could not write %d successes before exit: %s", self.executor.buffered, exc)

    def _wait_for_wake(self) -> None:
        msg = self.pipe.recv()  # EOFError when the supervisor is gone
        self._handle(msg)

    def _handle(self, msg: object) -> None:
        if isinstance(msg, Wake):
            self.woken_at = msg.sent_at
        elif isinstance(msg, Stop):
            self.stopping = True

    def _poll_pipe(self, force: bool = False) -> None:
        """Between jobs, at most every 10 ms: has the supervisor asked us to stop?"""
        now = time.monotonic()
        if not force and now - self.last_pipe_check < CHECK_PIPE_EVERY:
            return
        self.last_pipe_check = now
        try:
            while self.pipe.poll(0):
                self._handle(self.pipe.recv())
        except (EOFError, OSError):
            self.stopping = True

    def _claim(self) -> list[Job] | None:
        limit = max(1, min(self.spec.claim_batch, int(BATCH_BUDGET / max(self.per_job, 1e-6))))
        claim: db.ClaimArgs = {
            "worker_id": self.spec.worker_id,
            "types": self.types,
            "max_retry_counts": self.max_retries,
            "limit": limit,
        }
        try:
            buffered = self.executor.buffered_for_claim()
            if buffered is not None:
                # the last batch's successes ride on this claim: one statement, one commit
                lease, results = buffered
                held, jobs = db.succeed_and_claim(
                    self.conn, self.spec.schema, lease, results, **claim
                )
                self._settled(self.executor.settle_buffered(lease, held))
            else:
                self._flush()
                jobs = db.claim(self.conn, self.spec.schema, **claim)
        except DatabaseError as exc:
            self._reconnect(exc)
            self._recover()
            return None
        self.error_backoff = 0.1
        if jobs and self.woken_at is not None:
            self.latencies.append(time.monotonic() - self.woken_at)
        self.woken_at = None
        return jobs

    def _run_batch(self, jobs: list[Job]) -> None:
        lease = jobs[0].lease
        self.heartbeat.hold(lease, [j.id for j in jobs])
        batch_start = time.monotonic()
        last_flush = batch_start
        small = len(jobs) <= 4
        done = 0
        try:
            for job in jobs:
                self._poll_pipe()
                if self.stopping:
                    break
                handler = self.registry.handlers.get(job.type)
                timeout = job.timeout or (handler.timeout if handler else None)
                self.slot.set(job.id, time.monotonic(), timeout, job.attempt, job.type)
                if small:
                    setproctitle(f"pgq-worker[{self.spec.index}] {job.type} {job.id}")
                outcome = self.executor.run(job)
                self.slot.clear()
                done += 1
                if outcome is not None:
                    self._record([outcome])
                    self.heartbeat.drop(lease, [job.id])
                if self.executor.buffered and time.monotonic() - last_flush > REPORT_EVERY:
                    self._flush()
                    last_flush = time.monotonic()
            if self.stopping:
                self._flush()
            # else the successes ride on the next claim (see _claim)
        except DatabaseError as exc:
            self.slot.clear()
            self._reconnect(exc)
            self._recover()
        finally:
            self._release_rest(jobs[done:])
        if done:
            took = (time.monotonic() - batch_start) / done
            self.per_job = 0.7 * self.per_job + 0.3 * took
        self.jobs_done += done
        if time.monotonic() - self.last_report > REPORT_EVERY:
            self._report()

    def _flush(self) -> None:
        self._settled(self.executor.flush())

    def _settled(self, outcomes: list[Outcome]) -> None:
        self._record(outcomes)
        for o in outcomes:
            self.heartbeat.drop(o.job.lease, [o.job.id])

    def _recover(self) -> None:
        """After a lost connection: write the buffered successes if we still can."""
        try:
            self._flush()
        except DatabaseError:
            for job in self.executor.discard_buffered():
                self.heartbeat.drop(job.lease, [job.id])

    def _release_rest(self, rest: list[Job]) -> None:
        """Jobs claimed but not started go back without consuming an attempt."""
        if not rest:
            return
        ids = [j.id for j in rest]
        try:
            db.release(self.conn, self.spec.schema, ids=ids, lease=rest[0].lease)
        except DatabaseError as exc:
            log.warning("could not release %d claimed jobs (the rescuer will): %s", len(ids), exc)
        finally:
            self.heartbeat.drop(rest[0].lease, ids)

    def _reconnect(self, exc: DatabaseError) -> None:
        """After a database error: back off (errors that repeat, such as a schema that is
        not migrated, must not spin), then reconnect if the connection is gone."""
        log.warning("worker %s database error: %s", self.spec.worker_id, exc)
        self._sleep_polling(self.error_backoff)
        self.error_backoff = min(self.error_backoff * 2, 5.0)
        if not self.conn.closed and not self.conn.broken:
            return
        self.conn.close()
        delay = 0.2
        while not self.stopping:
            try:
                self.conn = db.connect(
                    self.spec.dsn,
                    application_name="pgq-worker",
                    synchronous_commit=self.spec.synchronous_commit,
                )
                self.executor.conn = self.conn
                log.info("worker %s reconnected", self.spec.worker_id)
                return
            except DatabaseError:
                self._sleep_polling(delay)
                delay = min(delay * 2, 5.0)

    def _sleep_polling(self, seconds: float) -> None:
        """Sleep, but wake for a Stop from the supervisor."""
        try:
            if self.pipe.poll(seconds):
                self._poll_pipe(force=True)
        except (EOFError, OSError):
            self.stopping = True

    def _record(self, outcomes: list[Outcome]) -> None:
        self.outcomes.extend((o.job.type, o.kind, o.duration) for o in outcomes)

    def _report(self) -> None:
        if self.outcomes or self.latencies:
            self.pipe.send(Report(tuple(self.outcomes), tuple(self.latencies)))
            self.outcomes = []
            self.latencies = []
        self.last_report = time.monotonic()

    def _retire_reason(self) -> str | None:
        if self.spec.max_jobs is not None and self.jobs_done >= self.spec.max_jobs:
            return f"ran {self.jobs_done} jobs (max_jobs_per_child={self.spec.max_jobs})"
        if self.spec.max_memory_mb is not None:
            rss = rss_mb()
            if rss > self.spec.max_memory_mb:
                return f"RSS {rss:.0f} MiB > max_memory_per_child={self.spec.max_memory_mb} MiB"
        return None
