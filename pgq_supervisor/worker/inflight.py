"""A child with many jobs in flight (`concurrency` > 1, or an `async def` handler served).

    supervisor ──pipe──▶ child main thread: one asyncio loop            pgq-heartbeat thread
      Wake / Stop /        claim up to the free slots ◀─ job conn       (as in sync.py: every
      CancelJob / RunAlone async handlers: tasks on the loop            held job, fenced)
      ◀── Ready / Idle     sync handlers: a thread pool (pgq-job-N)
          Report           settle on the loop: Completer, as sync.py
      ◀── shared slot ──   one entry per job in flight

The loop claims when enough slots are free (a quarter of them, or any after CLAIM_EVERY), up to
`claim_batch` at a time, and no more than the jobs left to start before `max_jobs`; the
successes buffered since ride on the claim, as in sync.py. A claim that finds nothing sends
Idle: the child then claims again only when woken (the supervisor wakes children with free
capacity), while its jobs in flight run on. Type caps, RunAlone and the jobs claimed but not
started yet: admission.py.

Handlers that take `conn` get a connection of a per-child pool (psycopg_pool: an async one for
async handlers, a sync one for threads, `concurrency` connections at most, opened on first use):
their writes and the job's fenced success commit in one transaction, as in sync.py (runs.py).

Timeouts: an async job past its timeout is cancelled here and its attempt ends as a timeout; the
slot gives the supervisor ASYNC_GRACE more before it kills the child (a handler that swallows
the cancellation). A job in a thread cannot be cancelled: its slot entry has no grace, and the
supervisor kills the child at the timeout (the other jobs go back without an attempt).

Stop, a SIGTERM (signals.ChildSignals: its wake-up socket is a reader of the loop; it never
reaches a job's task or thread) or the supervisor gone: claimed jobs not started go back, jobs
in flight finish, exit. A database error backs off, then reconnects as base.BaseWorker says
(until connected or told to stop), jobs in flight running on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Final, Unpack

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgq_supervisor import db
from pgq_supervisor.display import plural
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.ipc import ChildSpec, Idle, JobSlot, Ready, RunAloneSet
from pgq_supervisor.jobs import Job, JobId, LeaseToken
from pgq_supervisor.registry import ClaimPolicy, Registry
from pgq_supervisor.worker import runs
from pgq_supervisor.worker.adaptive import InFlightLimit
from pgq_supervisor.worker.admission import CLAIM_EVERY, Admission
from pgq_supervisor.worker.base import HEARTBEAT_DOWN_POLL, REPORT_EVERY, BaseWorker, Options
from pgq_supervisor.worker.runs import Lost, Settlement

log = logging.getLogger(__name__)

ASYNC_GRACE: Final = 2.0  # a cancelled async job must end within this, or the child is killed


@dataclass(slots=True)
class InFlight:
    job: Job
    entry: int  # its slot entry
    task: asyncio.Future[Settlement]


def uses_loop(spec: ChildSpec, registry: Registry) -> bool:
    """Does this child need the many-jobs worker: concurrency > 1, or an async handler?"""
    if spec.slots > 1:
        return True
    return any((h := registry.handlers.get(t)) is not None and h.is_async for t in spec.types)


def pool_size(
    registry: Registry,
    types: Sequence[str],
    capacity: int,
    want_async: bool,
    cap: int | None = None,
) -> int:
    """The size of a child's pool for the handlers that take `conn` (async ones, or those run
    in threads): as many connections as such jobs can be in flight at once (0: none), `cap` at
    most (the child_pool_size setting, which the connection budget may lower: budget.py).
    Jobs beyond it wait for a connection of the pool."""
    total = 0
    for t in types:
        h = registry.handlers.get(t)
        if h is not None and h.wants_conn and h.is_async == want_async:
            total += capacity if h.concurrency is None else min(h.concurrency, capacity)
    return min(total, capacity, cap or capacity)


class InFlightWorker(Admission, BaseWorker):
    """The child's loop when it may hold many jobs at once (see the module docstring); what
    it may claim and start is admission.Admission, what it shares with the one-at-a-time
    loop base.BaseWorker."""

    def __init__(
        self, spec: ChildSpec, registry: Registry, pipe: Connection, slot: JobSlot,
        conn: db.Conn, **options: Unpack[Options],
    ) -> None:  # fmt: skip
        super().__init__(spec, registry, pipe, slot, conn, **options)
        self.capacity = max(1, min(spec.slots, slot.capacity))
        # the jobs in flight allowed now: the capacity, or what adaptive.py grows it to
        self.adapt = (
            InFlightLimit(self.capacity, self.clock, time.process_time) if spec.adaptive else None
        )
        self.limit = self.capacity if self.adapt is None else self.adapt.limit
        # a type's own cap, where lower than the child's
        self.caps: dict[str, int] = {}
        for t in spec.types:
            handler = registry.handlers.get(t)
            if handler is not None and handler.concurrency is not None:
                self.caps[t] = min(handler.concurrency, self.capacity)
        self.policies: dict[tuple[str, ...], ClaimPolicy] = {}
        self.running: dict[JobId, InFlight] = {}
        self.per_type: dict[str, int] = {}
        self.queued: deque[Job] = deque()  # claimed, waiting for a type's cap or to run alone
        self.claimed_at: dict[LeaseToken, float] = {}  # when each claim of a queued job was
        self.started = 0  # jobs started: with max_jobs, claims stop at the jobs left to start
        self.done: list[Settlement] = []  # ended, to be settled
        self.free_entries = list(range(self.capacity - 1, -1, -1))
        self.run_alone = RunAloneSet()  # named by RunAlone: the oldest are forgotten first
        self.alone: JobId | None = None  # the job running alone now
        self.threads: ThreadPoolExecutor | None = None
        self.apool: AsyncConnectionPool | None = None
        self.spool: ConnectionPool | None = None
        self.idle = False  # the last claim found nothing: wait for a Wake
        self.found_none_of: tuple[str, ...] | None = None  # a capped claim's types, found empty
        self.last_claim = 0.0
        self.changed: asyncio.Event | None = None

    # ---- the loop ----

    def run(self) -> None:
        self.heartbeat.start()
        self.pipe.send(Ready(os.getpid()))
        try:
            asyncio.run(self._main())
        finally:
            self._exit()

    async def _main(self) -> None:
        self.changed = asyncio.Event()
        # pools for the handlers that take `conn`, if any: connections opened on demand
        if self._pool_size(True):
            self.apool = AsyncConnectionPool(
                self.spec.dsn,
                min_size=0,
                max_size=self._pool_size(True),
                kwargs={**runs.POOL_KWARGS, "prepare_threshold": self.spec.prepare_threshold},
                open=False,
            )
            await self.apool.open()
        if self._pool_size(False):
            self.spool = ConnectionPool(
                self.spec.dsn,
                min_size=0,
                max_size=self._pool_size(False),
                kwargs={**runs.POOL_KWARGS, "prepare_threshold": self.spec.prepare_threshold},
                open=True,
            )
        loop = asyncio.get_running_loop()
        loop.add_reader(self.pipe.fileno(), self._read_pipe)
        sigterm = None if self.signals is None else self.signals.reader
        if sigterm is not None:
            loop.add_reader(sigterm.fileno(), self._read_signals)
        self._read_signals()  # one that came while it booted
        try:
            while not (self.stopping and not self.running and not self.done):
                await self._turn()
                self.slot.set_held(len(self.queued))
        finally:
            loop.remove_reader(self.pipe.fileno())
            if sigterm is not None:
                loop.remove_reader(sigterm.fileno())
            # jobs still held when the loop ends (the supervisor is gone and a job will not
            # end): leave them to the supervisor or the rescuer
            for flight in self.running.values():
                flight.task.cancel()
            if self.apool is not None:
                await self.apool.close()

    async def _turn(self) -> None:
        """Settle what ended → start what may start → claim if slots are free → report →
        wait for a change (a job ended, a message) or the next claim."""
        assert self.changed is not None
        self.changed.clear()
        if self.done and not await self._settle():
            if self.stopping:  # leaving with the database away: the rescuer has them
                log.warning(
                    "could not write the outcomes of %s before exit", plural(len(self.done), "job")
                )
                self.done.clear()
            return
        release_in = None
        if self.stopping:
            self._release(list(self.queued))
            self.queued.clear()
        else:
            self._start_queued()
            if self.adapt is not None:
                self.limit = self.adapt.tick(len(self.running))
            if not self.idle and self._claim_due() and not await self._claim():
                return
            release_in = self._release_waiting()
        try:
            if self.idle and self.completer.buffered:
                self.completer.flush(self.conn)  # no claim is coming to carry them
            else:
                self.completer.flush_if_due(self.conn)
        except DatabaseError as exc:
            await self._database_error(exc)
        now = self.clock()
        if now - self.last_report > REPORT_EVERY:
            self._report()
            self._retire_if_due()
        if self.done or (self.stopping and not self.running):
            return
        wait = REPORT_EVERY
        if not self.idle and not self.stopping and self._free() > 0:
            wait = min(wait, max(0.0, self.last_claim + CLAIM_EVERY - now))
        if release_in is not None:
            wait = min(wait, release_in)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), wait)

    async def _claim(self) -> bool:
        """Claim up to the free slots; False after a database error (dealt with)."""
        self._poll_pipe()  # a RunAlone sent before a release must be known before we claim
        if self.stopping:
            return True
        if self._heartbeat_down():
            await self._sleep_unless_stopped(HEARTBEAT_DOWN_POLL)
            return True
        policy = self._claim_policy()
        if policy is None or policy.types == self.found_none_of:
            return True  # every type is full, or those not full had nothing a moment ago
        limit = max(1, min(self._free(), self.spec.claim_batch))
        room = self._cap_room(policy.types)
        if room is not None:
            limit = max(1, min(limit, room))
        self.last_claim = self.clock()
        try:
            jobs = self.completer.claim(self.conn, policy, limit)
        except DatabaseError as exc:
            await self._database_error(exc)
            return False
        self.error_backoff.succeeded()
        if self.adapt is not None:
            self.adapt.claimed(limit, len(jobs), len(self.running) + len(self.queued) + len(jobs))
        if not jobs and policy.types != self.spec.types:
            # only the types below their cap had nothing: claim again once one that was
            # full has room (the claim's types change then), or when woken (Idle asks for it)
            self.found_none_of = policy.types
            self.pipe.send(Idle())
            return True
        self.found_none_of = None
        if not jobs:
            self.idle = True
            self.pipe.send(Idle())
            self._report()
            return True
        self._measure_wake()
        # the supervisor sends RunAlone before it releases a shared death's jobs: one this
        # claim took is named in the pipe by now
        self._poll_pipe()
        self.queued.extend(jobs)
        self._start_queued()
        if self.queued:
            self.claimed_at[jobs[0].lease] = self.last_claim
        return True

    # ---- running ----

    def _start(self, job: Job) -> None:
        handler = self.registry.handlers.get(job.type)
        timeout = self.registry.policy(job.type).timeout_for(job) if handler else None
        is_async = handler is not None and handler.is_async
        entry = self.free_entries.pop()
        self.started += 1
        self.slot.set(
            job.id, self.clock(), timeout, job.attempt, job.type,
            entry=entry, grace=ASYNC_GRACE if is_async else 0.0,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Settlement]
        if handler is None:
            fut = loop.create_future()
            fut.set_result(self.executor.run(job))
        elif is_async:
            pool = self.apool if handler.wants_conn else None
            connect = None if pool is None else pool.connection
            run = runs.run_async(self.executor, job, timeout, self.spec.schema, connect)
            fut = loop.create_task(run)
        else:
            # a pooled connection for one that takes `conn` (the pool opened by _main: this
            # child serves such handlers)
            pooled = self.spool.connection if self.spool is not None else None
            fut = loop.run_in_executor(
                self._threads(), runs.run_sync, self.executor, job, self.spec.schema, pooled
            )
        flight = InFlight(job, entry, fut)
        self.running[job.id] = flight
        self.per_type[job.type] = self.per_type.get(job.type, 0) + 1
        fut.add_done_callback(functools.partial(self._ended, flight))

    def _ended(self, flight: InFlight, fut: asyncio.Future[Settlement]) -> None:
        """A job's task or thread ended (on the loop): free its slot, settle it next turn."""
        job = flight.job
        self.running.pop(job.id, None)
        self.per_type[job.type] -= 1
        self.slot.clear(flight.entry)
        self.free_entries.append(flight.entry)
        if self.alone == job.id:
            self.alone = None
            self.run_alone.discard(job.id)
        if fut.cancelled():
            log.info("job id=%s was cancelled: its task stopped", job.id)
            self.done.append(Lost(job, 0.0))
        elif (exc := fut.exception()) is not None:  # not the handler's (the executor
            # catches those): ours
            log.error("job id=%s: the worker failed running it: %r", job.id, exc)
            self.done.append(self.executor.failed(job, Exception(repr(exc)), 0.0))
        else:
            self.done.append(fut.result())
        if self.changed is not None:
            self.changed.set()

    async def _settle(self) -> bool:
        """Write what the ended jobs came to; False after a database error (what is not
        written stays, to be written after the backoff)."""
        while self.done:
            try:
                self.completer.settle(self.conn, self.done[0])
            except DatabaseError as exc:
                await self._database_error(exc)
                return False
            self.done.pop(0)
            self.jobs_done += 1
        self._start_queued()
        return True

    # ---- pools, created on first use ----

    def _threads(self) -> ThreadPoolExecutor:
        if self.threads is None:
            self.threads = ThreadPoolExecutor(self.capacity, thread_name_prefix="pgq-job")
        return self.threads

    def _pool_size(self, want_async: bool) -> int:
        # an adaptive child's pools are those of its concurrency setting (1 by default: what
        # the supervisor's connection budget counted); its jobs in flight share them
        most = self.spec.concurrency if self.adapt is not None else self.capacity
        return pool_size(self.registry, self.spec.types, most, want_async, self.spec.pool_size)

    # ---- the pipe ----

    def _read_pipe(self) -> None:
        self._poll_pipe()
        if self.changed is not None:
            self.changed.set()

    def _read_signals(self) -> None:
        self._take_sigterm()
        if self.changed is not None:
            self.changed.set()

    def _poll_pipe(self) -> None:
        if not self._read_pipe_messages():  # EOF: the reader would fire at every turn
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self.pipe.fileno())

    def _woken(self, sent_at: float) -> None:
        self.idle = False
        self.found_none_of = None
        self.woken_at = sent_at

    def _cancel(self, job_id: JobId) -> None:
        flight = self.running.get(job_id)
        # a thread cannot be cancelled: the supervisor kills the child for such a job
        if flight is not None and isinstance(flight.task, asyncio.Task):
            flight.task.cancel()

    # ---- reporting and leaving ----

    def _report(self) -> None:
        n = len(self.running)
        self._set_title("idle" if n == 0 and self.idle else f"{n}/{self.limit} in flight")
        with contextlib.suppress(OSError):
            super()._report()

    def _exit(self) -> None:
        self._release(list(self.queued))
        self.queued.clear()
        super()._exit()
        if self.threads is not None:
            self.threads.shutdown(wait=False, cancel_futures=True)
        if self.spool is not None:
            self.spool.close()

    # ---- the database ----

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        """Sleep, jobs running on, but wake for a Stop from the supervisor or a SIGTERM."""
        assert self.changed is not None
        deadline = self.clock() + seconds
        while not self.stopping and (left := deadline - self.clock()) > 0:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    async def _database_error(self, exc: DatabaseError) -> None:
        for seconds in self._recovering(exc):
            await self._sleep_unless_stopped(seconds)
