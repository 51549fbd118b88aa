"""The one-at-a-time Worker: claim a batch sized from how long recent jobs took, run it
in order, settle (jobs not started go back), report; or idle on the pipe until woken.
See the package docstring; what it shares with the in-flight loop is base.BaseWorker."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from multiprocessing.connection import Connection, wait
from typing import Final, Unpack

from pgq_supervisor import db
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.ipc import ChildSpec, Idle, JobSlot, Ready
from pgq_supervisor.jobs import Job
from pgq_supervisor.registry import Registry
from pgq_supervisor.worker import runs
from pgq_supervisor.worker.base import HEARTBEAT_DOWN_POLL, REPORT_EVERY, BaseWorker, Options
from pgq_supervisor.worker.unstarted import Unstarted

log = logging.getLogger(__name__)

BATCH_BUDGET: Final = 0.05  # seconds of work one claim should take at most

CHECK_PIPE_EVERY: Final = 0.01


class Worker(BaseWorker):
    """The child's loop when it runs one job at a time (see the module docstring)."""

    def __init__(
        self, spec: ChildSpec, registry: Registry, pipe: Connection, slot: JobSlot,
        conn: db.Conn, **options: Unpack[Options],
    ) -> None:  # fmt: skip
        super().__init__(spec, registry, pipe, slot, conn, **options)
        self.claim_policy = registry.claim_policy(spec.types)
        # the batch's jobs not started: when the job in hand runs long, the heartbeat thread
        # gives them back and writes the successes buffered before it (unstarted.py)
        self.unstarted = Unstarted(spec.release_unstarted_after, slot.set_held)
        self.heartbeat.watch(self.unstarted, self.completer.flush)
        self.per_job = BATCH_BUDGET  # running estimate of seconds per job; sizes the claim
        self.last_pipe_check = 0.0
        # what an idle or backing-off child waits on: a SIGTERM's wake-up byte as well
        self.wait_on: list[Connection | socket.socket] = [pipe]
        if self.signals is not None and self.signals.reader is not None:
            self.wait_on.append(self.signals.reader)

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
        if self._heartbeat_down():
            try:  # the successes the claim would have carried: held until written
                self.completer.flush(self.conn)
            except DatabaseError as exc:
                self._database_error(exc)
                return None
            self._sleep_polling(HEARTBEAT_DOWN_POLL)
            return None
        limit = max(1, min(self.spec.claim_batch, int(BATCH_BUDGET / max(self.per_job, 1e-6))))
        if self.spec.max_jobs is not None:  # never more than the jobs left before retiring
            limit = max(1, min(limit, self.spec.max_jobs - self.jobs_done))
        try:
            jobs = self.completer.claim(self.conn, self.claim_policy, limit)
        except DatabaseError as exc:
            self._database_error(exc)
            return None
        self.error_backoff.succeeded()
        if jobs:
            self._measure_wake()
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
            self._set_title(f"{job.type} {job.id}")
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
        self._set_title("idle")
        while not self.stopping:
            ready = wait(self.wait_on)
            self._poll_signals(woken=True)
            if self.pipe in ready:
                self._handle(self.pipe.recv())  # EOFError when the supervisor is gone
                return

    # ---- the database ----

    def _database_error(self, exc: DatabaseError) -> None:
        for seconds in self._recovering(exc):
            self._sleep_polling(seconds)

    # ---- the pipe ----

    def _poll_signals(self, woken: bool = False) -> None:
        """A SIGTERM recorded: stop. No system call unless one was recorded or a wait woke
        (`woken`: empty the wake-up socket, whichever signal wrote to it, so the next wait
        blocks)."""
        if self.signals is not None and (woken or self.signals.pending):
            self._take_sigterm()

    def _poll_pipe(self, force: bool = False) -> None:
        """Between jobs, at most every 10 ms: has the supervisor asked us to stop? At every
        call: has a SIGTERM?"""
        self._poll_signals()
        now = time.monotonic()
        if not force and now - self.last_pipe_check < CHECK_PIPE_EVERY:
            return
        self.last_pipe_check = now
        self._read_pipe_messages()

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
