"""The one-at-a-time Worker: claim a batch sized from how long recent jobs took, run it
in order, settle (jobs not started go back), report; or idle on the pipe until woken.
See the package docstring."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from multiprocessing.connection import Connection, wait
from typing import Final

from setproctitle import setproctitle

from pgq_supervisor import db
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.ipc import ChildSpec, Idle, JobSlot, Ready, Report, Retiring, Stop, Wake
from pgq_supervisor.jobs import Job
from pgq_supervisor.registry import Registry
from pgq_supervisor.signals import ChildSignals
from pgq_supervisor.worker import runs
from pgq_supervisor.worker.base import (
    REPORT_EVERY,
    child_parts,
    connect_child,
    rss_mb,
    stop_on_sigterm,
)
from pgq_supervisor.worker.unstarted import Unstarted

log = logging.getLogger(__name__)

BATCH_BUDGET: Final = 0.05  # seconds of work one claim should take at most

CHECK_PIPE_EVERY: Final = 0.01


class Worker:
    def __init__(
        self,
        spec: ChildSpec,
        registry: Registry,
        pipe: Connection,
        slot: JobSlot,
        conn: db.Conn,
        *,
        error_backoff: Backoff | None = None,
        connect_backoff: Backoff | None = None,
        signals: ChildSignals | None = None,
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.pipe = pipe
        self.slot = slot
        self.conn = conn
        self.claim_policy = registry.claim_policy(spec.types)
        self.heartbeat, self.executor, self.completer = child_parts(spec, registry)
        # the batch's jobs not started: when the job in hand runs long, the heartbeat thread
        # gives them back and writes the successes buffered before it (unstarted.py)
        self.unstarted = Unstarted(spec.release_unstarted_after, slot.set_held)
        self.heartbeat.watch(self.unstarted, self.completer.flush)
        # Errors that repeat (a schema not migrated, say) must not spin; reset by a claim.
        self.error_backoff = error_backoff or Backoff(initial=0.1, maximum=5.0)
        self.connect_backoff = connect_backoff or Backoff(initial=0.2, maximum=5.0)
        self.stopping = False
        self.jobs_done = 0
        self.per_job = BATCH_BUDGET  # running estimate of seconds per job; sizes the claim
        self.latencies: list[float] = []
        self.last_report = time.monotonic()
        self.last_pipe_check = 0.0
        self.woken_at: float | None = None
        self.title_idle = f"pgq-worker[{spec.index}] idle"
        self.signals = signals
        # what an idle or backing-off child waits on: a SIGTERM's wake-up byte as well
        self.wait_on: list[Connection | socket.socket] = [pipe]
        if signals is not None and signals.reader is not None:
            self.wait_on.append(signals.reader)

    def run(self) -> None:
        """Claim → run the batch → settle → report, or idle until woken; until told to stop."""
        self.heartbeat.start()
        self.pipe.send(Ready(os.getpid()))
        self._poll_signals()  # one that came while it booted
        try:
            while not self.stopping:
                jobs = self._claim()
                if jobs is None:
                    continue  # a database error, dealt with: claim again
                if not jobs:
                    self._idle()
                    continue
                self._run_batch(jobs)
                if time.monotonic() - self.last_report > REPORT_EVERY:
                    self._report()
                self._retire_if_due()
        except (BrokenPipeError, EOFError):
            self.stopping = True  # supervisor gone: the job in hand was finished, leave
        finally:
            self._exit()

    # ---- the steps ----

    def _claim(self) -> list[Job] | None:
        """The next batch; the last batch's successes are written on the way. None after a
        database error."""
        limit = max(1, min(self.spec.claim_batch, int(BATCH_BUDGET / max(self.per_job, 1e-6))))
        if self.spec.max_jobs is not None:  # never more than the jobs left before retiring
            limit = max(1, min(limit, self.spec.max_jobs - self.jobs_done))
        try:
            jobs = self.completer.claim(self.conn, self.claim_policy, limit)
        except DatabaseError as exc:
            self._database_error(exc)
            return None
        self.error_backoff.succeeded()
        if jobs and self.woken_at is not None:
            self.latencies.append(time.monotonic() - self.woken_at)
        self.woken_at = None
        return jobs

    def _run_batch(self, jobs: list[Job]) -> None:
        """Run the batch in claim order until done or told to stop; jobs not started go back
        (at the end, or earlier from the heartbeat thread when one job runs long)."""
        titled = len(jobs) <= 4  # a title per job costs microseconds: small batches only
        started = time.monotonic()
        unstarted = self.unstarted
        unstarted.load(jobs, started)
        done = 0
        job: Job | None = None  # the job in hand, if its run raised
        try:
            while True:
                self._poll_pipe()
                if self.stopping:
                    break
                now = time.monotonic()
                job = unstarted.take(now)
                if job is None:
                    break
                self._run_one(job, titled, now)
                job = None
                done += 1
                self.completer.flush_if_due(self.conn)
        except DatabaseError as exc:
            self.slot.clear()
            self._database_error(exc)
        finally:
            rest = unstarted.finish()
            # as before: a job whose outcome could not be written goes back with the rest
            self.completer.release(self.conn, rest if job is None else [job, *rest])
        if done:
            took = (time.monotonic() - started) / done
            self.per_job = 0.7 * self.per_job + 0.3 * took
        self.jobs_done += done

    def _run_one(self, job: Job, titled: bool, now: float) -> None:
        timeout = self.registry.policy(job.type).timeout_for(job)
        self.slot.set(job.id, now, timeout, job.attempt, job.type)
        if titled:
            setproctitle(f"pgq-worker[{self.spec.index}] {job.type} {job.id}")
        settlement = runs.run_sync(self.executor, job, self.spec.schema, self._own_conn)
        self.completer.settle(self.conn, settlement)
        self.slot.clear()

    def _own_conn(self) -> contextlib.nullcontext[db.Conn]:
        """A handler that takes `conn` runs in a transaction on the worker's own connection."""
        return contextlib.nullcontext(self.conn)

    def _idle(self) -> None:
        """The claim found nothing: say so, report, and block until woken or told to stop."""
        self.pipe.send(Idle())
        self._report()
        setproctitle(self.title_idle)
        while not self.stopping:
            ready = wait(self.wait_on)
            self._poll_signals(woken=True)
            if self.pipe in ready:
                self._handle(self.pipe.recv())  # EOFError when the supervisor is gone
                return

    def _report(self) -> None:
        outcomes = self.completer.take_outcomes()
        if outcomes or self.latencies:
            self.pipe.send(
                Report(
                    tuple((o.job.type, o.kind, o.duration) for o in outcomes),
                    tuple(self.latencies),
                )
            )
            self.latencies = []
        self.last_report = time.monotonic()

    def _retire_if_due(self) -> None:
        reason = self._retire_reason()
        if reason:
            log.info("worker %s retiring: %s", self.spec.worker_id, reason)
            self.pipe.send(Retiring(reason))
            self.stopping = True

    def _retire_reason(self) -> str | None:
        if self.spec.max_jobs is not None and self.jobs_done >= self.spec.max_jobs:
            return f"ran {self.jobs_done} jobs (max_jobs_per_child={self.spec.max_jobs})"
        if self.spec.max_memory_mb is not None:
            rss = rss_mb()
            if rss > self.spec.max_memory_mb:
                return f"RSS {rss:.0f} MiB > max_memory_per_child={self.spec.max_memory_mb} MiB"
        return None

    def _exit(self) -> None:
        """Successes waiting for a claim that will not come are written now; then the last
        report, and the connections close."""
        try:
            self.completer.flush(self.conn)
        except DatabaseError as exc:
            n = self.completer.buffered
            log.warning("could not write %d successes before exit: %s", n, exc)
        # the supervisor may be gone; then nobody is left to report to
        with contextlib.suppress(OSError):
            self._report()
        self.heartbeat.stop()
        self.conn.close()

    # ---- the database ----

    def _connect(self, application_name: str) -> db.Conn:
        return connect_child(self.spec, application_name)

    def _database_error(self, exc: DatabaseError) -> None:
        """Back off, reconnect if the connection is gone, then let the completer write its
        buffer on the connection we have, or forget it (those jobs will run again)."""
        log.warning("worker %s database error: %s", self.spec.worker_id, exc)
        self._sleep_polling(self.error_backoff.failed())
        if self.conn.closed or self.conn.broken:
            self._reconnect()
        self.completer.recover(self.conn)

    def _reconnect(self) -> None:
        """Connect again, backing off with jitter, until connected or told to stop."""
        self.conn.close()
        if self.stopping:
            return
        try:
            self.conn = self.connect_backoff.retry(
                lambda: self._connect("pgq-worker"),
                retry_on=DatabaseError,
                give_up=lambda exc: self.stopping,
                sleep=self._sleep_reconnecting,
            )
        except DatabaseError:
            return  # told to stop: leave without a connection
        log.info("worker %s reconnected", self.spec.worker_id)

    def _sleep_reconnecting(self, seconds: float) -> None:
        log.info("worker %s cannot connect, next try in %.2f s", self.spec.worker_id, seconds)
        self._sleep_polling(seconds)

    # ---- the pipe ----

    def _handle(self, msg: object) -> None:
        if isinstance(msg, Wake):
            self.woken_at = msg.sent_at
        elif isinstance(msg, Stop):
            self.stopping = True

    def _poll_signals(self, woken: bool = False) -> None:
        """A SIGTERM recorded: stop. No system call unless one was recorded or a wait woke
        (`woken`: empty the wake-up socket, whichever signal wrote to it, so the next wait
        blocks)."""
        if self.signals is not None and (woken or self.signals.pending):
            self.stopping |= stop_on_sigterm(
                self.signals, self.pipe, self.spec.worker_id, self.stopping
            )

    def _poll_pipe(self, force: bool = False) -> None:
        """Between jobs, at most every 10 ms: has the supervisor asked us to stop? At every
        call: has a SIGTERM?"""
        self._poll_signals()
        now = time.monotonic()
        if not force and now - self.last_pipe_check < CHECK_PIPE_EVERY:
            return
        self.last_pipe_check = now
        try:
            while self.pipe.poll(0):
                self._handle(self.pipe.recv())
        except (EOFError, OSError):
            self.stopping = True

    def _sleep_polling(self, seconds: float) -> None:
        """Sleep, but wake for a Stop from the supervisor or a SIGTERM (a Wake does not cut it
        short)."""
        deadline = time.monotonic() + seconds
        try:
            while not self.stopping and (left := deadline - time.monotonic()) > 0:
                if wait(self.wait_on, left):
                    self._poll_signals(woken=True)
                    self._poll_pipe(force=True)
        except (EOFError, OSError):
            self.stopping = True
