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
capacity), while its jobs in flight run on. A type's own `concurrency` cap leaves the type out
of the next claim while it is full, and a claim of capped types only takes what their caps have
room for. Jobs claimed beyond a cap (by a claim that also took other types) wait here, held and
heart-beaten, for `release_unstarted_after` at most: then they go back for another child.

Handlers that take `conn` get a connection of a per-child pool (psycopg_pool: an async one for
async handlers, a sync one for threads, `concurrency` connections at most, opened on first use):
their writes and the job's fenced success commit in one transaction, as in sync.py (runs.py).

Timeouts: an async job past its timeout is cancelled here and its attempt ends as a timeout; the
slot gives the supervisor ASYNC_GRACE more before it kills the child (a handler that swallows
the cancellation). A job in a thread cannot be cancelled: its slot entry has no grace, and the
supervisor kills the child at the timeout (the other jobs go back without an attempt).

Jobs named by RunAlone (released from the death of a child that held several, deaths.py) run
with nothing else in flight: the child stops starting and claiming until its jobs in flight are
done, then runs that job by itself.

Stop, a SIGTERM (signals.ChildSignals: its wake-up socket is a reader of the loop; it never
reaches a job's task or thread) or the supervisor gone: claimed jobs not started go back, jobs
in flight finish, exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Final

from psycopg_pool import AsyncConnectionPool, ConnectionPool
from setproctitle import setproctitle

from pgq_supervisor import db
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.ipc import (
    CancelJob,
    ChildSpec,
    Idle,
    JobSlot,
    Ready,
    Report,
    Retiring,
    RunAlone,
    Stop,
    Wake,
)
from pgq_supervisor.jobs import Job, JobId, LeaseToken
from pgq_supervisor.registry import ClaimPolicy, Registry
from pgq_supervisor.signals import ChildSignals
from pgq_supervisor.worker import runs
from pgq_supervisor.worker.base import (
    REPORT_EVERY,
    child_parts,
    connect_child,
    rss_mb,
    stop_on_sigterm,
)
from pgq_supervisor.worker.runs import Lost, Settlement

log = logging.getLogger(__name__)

CLAIM_EVERY: Final = 0.01  # with any slot free, claim at least this often
ASYNC_GRACE: Final = 2.0  # a cancelled async job must end within this, or the child is killed
RUN_ALONE_KEEP: Final = 10_000  # the most RunAlone ids a child remembers


@dataclass(slots=True)
class InFlight:
    job: Job
    entry: int  # its slot entry
    task: asyncio.Future[Settlement]


def uses_loop(spec: ChildSpec, registry: Registry) -> bool:
    """Does this child need the many-jobs worker: concurrency > 1, or an async handler?"""
    if spec.concurrency > 1:
        return True
    return any((h := registry.handlers.get(t)) is not None and h.is_async for t in spec.types)


class InFlightWorker:
    """The child's loop when it may hold many jobs at once (see the module docstring)."""

    def __init__(
        self,
        spec: ChildSpec,
        registry: Registry,
        pipe: Connection,
        slot: JobSlot,
        conn: db.Conn,
        *,
        clock: Callable[[], float] = time.monotonic,
        error_backoff: Backoff | None = None,
        signals: ChildSignals | None = None,
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.pipe = pipe
        self.slot = slot
        self.conn = conn
        self.clock = clock
        self.capacity = max(1, min(spec.concurrency, slot.capacity))
        self.heartbeat, self.executor, self.completer = child_parts(spec, registry)
        # errors that repeat (the database away) must not spin; reset by a claim
        self.error_backoff = error_backoff or Backoff(initial=0.1, maximum=5.0)
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
        self.run_alone: dict[JobId, None] = {}  # ordered: the oldest are forgotten first
        self.alone: JobId | None = None  # the job running alone now
        self.threads: ThreadPoolExecutor | None = None
        self.apool: AsyncConnectionPool | None = None
        self.spool: ConnectionPool | None = None
        self.stopping = False
        self.idle = False  # the last claim found nothing: wait for a Wake
        self.found_none_of: tuple[str, ...] | None = None  # a capped claim's types, found empty
        self.jobs_done = 0
        self.last_claim = 0.0
        self.last_report = clock()
        self.latencies: list[float] = []
        self.woken_at: float | None = None
        self.changed: asyncio.Event | None = None
        self.title = ""
        self.signals = signals

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
                log.warning("could not write the outcomes of %d jobs before exit", len(self.done))
                self.done.clear()
            return
        release_in = None
        if self.stopping:
            self._release(list(self.queued))
            self.queued.clear()
        else:
            self._start_queued()
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

    # ---- capacity ----

    def _free(self) -> int:
        """Slots a claim may fill: none past the jobs left to start before max_jobs."""
        free = self.capacity - len(self.running) - len(self.queued)
        if self.spec.max_jobs is not None:
            free = min(free, self.spec.max_jobs - self.started - len(self.queued))
        return free

    def _claim_due(self) -> bool:
        if self.alone is not None or (
            self.run_alone and any(j.id in self.run_alone for j in self.queued)
        ):
            return False  # a job waits to run alone: let the others drain
        free = self._free()
        if free <= 0:
            return False
        return (
            free >= max(1, self.capacity // 4)
            or not self.running
            or self.clock() - self.last_claim >= CLAIM_EVERY
        )

    def _held(self) -> dict[str, int]:
        """Jobs held per type: in flight or queued."""
        held = dict(self.per_type)
        for job in self.queued:
            held[job.type] = held.get(job.type, 0) + 1
        return held

    def _claim_policy(self) -> ClaimPolicy | None:
        """The types a claim may take now: those below their cap (None: none are)."""
        if not self.caps:
            types = self.spec.types
        else:
            held = self._held()
            types = tuple(t for t in self.spec.types if held.get(t, 0) < self.caps.get(t, 1 << 30))
            if not types:
                return None
        policy = self.policies.get(types)
        if policy is None:
            policy = self.policies[types] = self.registry.claim_policy(types)
        return policy

    def _cap_room(self, types: tuple[str, ...]) -> int | None:
        """When every type of a claim is capped, the jobs their caps have room for: no more
        are claimed, or they would wait here behind the jobs in flight (None: no bound)."""
        if not self.caps or any(t not in self.caps for t in types):
            return None
        held = self._held()
        return sum(max(0, self.caps[t] - held.get(t, 0)) for t in types)

    async def _claim(self) -> bool:
        """Claim up to the free slots; False after a database error (dealt with)."""
        self._poll_pipe()  # a RunAlone sent before a release must be known before we claim
        if self.stopping:
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
        if self.woken_at is not None:
            self.latencies.append(self.clock() - self.woken_at)
            self.woken_at = None
        # the supervisor sends RunAlone before it releases a shared death's jobs: one this
        # claim took is named in the pipe by now
        self._poll_pipe()
        self.queued.extend(jobs)
        self._start_queued()
        if self.queued:
            self.claimed_at[jobs[0].lease] = self.last_claim
        return True

    def _start_queued(self) -> None:
        if not self.queued or self.alone is not None:
            return
        kept: deque[Job] = deque()
        while self.queued:
            job = self.queued.popleft()
            if job.id in self.run_alone:
                if self.running:
                    kept.append(job)
                    kept.extend(self.queued)  # nothing else starts before it
                    self.queued.clear()
                    break
                self.alone = job.id
                log.info("job id=%s runs alone (released from a shared death)", job.id)
                self._start(job)
                kept.extend(self.queued)
                self.queued.clear()
                break
            cap = self.caps.get(job.type)
            if cap is not None and self.per_type.get(job.type, 0) >= cap:
                kept.append(job)
                continue
            self._start(job)
        self.queued = kept

    def _release_waiting(self) -> float | None:
        """Queued jobs that have waited `release_unstarted_after` since their claim go back
        (for another child to run), but for one waiting to run alone: it waits for the jobs in
        flight by design. Returns the seconds until the next is due (None: none waits)."""
        if not self.queued:
            self.claimed_at.clear()
            return None
        now = self.clock()
        after = self.spec.release_unstarted_after
        due: list[Job] = []
        kept: deque[Job] = deque()
        next_in: float | None = None
        for job in self.queued:
            left = self.claimed_at.get(job.lease, now) + after - now
            if left <= 0 and job.id not in self.run_alone:
                due.append(job)
                continue
            kept.append(job)
            if job.id not in self.run_alone:
                next_in = left if next_in is None else min(next_in, left)
        if due:
            self.queued = kept
            self._release(due)
        if len(self.claimed_at) > len(self.queued):  # claims none of whose jobs wait now
            leases = {j.lease for j in self.queued}
            self.claimed_at = {k: v for k, v in self.claimed_at.items() if k in leases}
        return next_in

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
            self.run_alone.pop(job.id, None)
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
        """As many connections as jobs of such handlers can be in flight at once (0: none)."""
        total = 0
        for t in self.spec.types:
            h = self.registry.handlers.get(t)
            if h is not None and h.wants_conn and h.is_async == want_async:
                total += self.caps.get(t, self.capacity)
        return min(total, self.capacity)

    # ---- the pipe ----

    def _read_pipe(self) -> None:
        self._poll_pipe()
        if self.changed is not None:
            self.changed.set()

    def _read_signals(self) -> None:
        if stop_on_sigterm(self.signals, self.pipe, self.spec.worker_id, self.stopping):
            self.stopping = True
        if self.changed is not None:
            self.changed.set()

    def _poll_pipe(self) -> None:
        try:
            while self.pipe.poll(0):
                self._handle(self.pipe.recv())
        except (EOFError, OSError):
            if not self.stopping:
                log.info("worker %s: the supervisor is gone; finishing", self.spec.worker_id)
            self.stopping = True
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self.pipe.fileno())

    def _handle(self, msg: object) -> None:
        if isinstance(msg, Wake):
            self.idle = False
            self.found_none_of = None
            self.woken_at = msg.sent_at
        elif isinstance(msg, Stop):
            self.stopping = True
        elif isinstance(msg, CancelJob):
            flight = self.running.get(msg.job_id)
            # a thread cannot be cancelled: the supervisor kills the child for such a job
            if flight is not None and isinstance(flight.task, asyncio.Task):
                flight.task.cancel()
        elif isinstance(msg, RunAlone):
            for job_id in msg.job_ids():
                self.run_alone[job_id] = None
            while len(self.run_alone) > RUN_ALONE_KEEP:
                del self.run_alone[next(iter(self.run_alone))]

    # ---- reporting and leaving ----

    def _set_title(self) -> None:
        n = len(self.running)
        title = f"pgq-worker[{self.spec.index}] " + (
            "idle" if n == 0 and self.idle else f"{n}/{self.capacity} in flight"
        )
        if title != self.title:
            self.title = title
            setproctitle(title)

    def _report(self) -> None:
        self._set_title()
        outcomes = self.completer.take_outcomes()
        if outcomes or self.latencies:
            with contextlib.suppress(OSError):
                self.pipe.send(
                    Report(
                        tuple((o.job.type, o.kind, o.duration) for o in outcomes),
                        tuple(self.latencies),
                    )
                )
            self.latencies = []
        self.last_report = self.clock()

    def _retire_if_due(self) -> None:
        if self.stopping:
            return
        reason = None
        if self.spec.max_jobs is not None and self.jobs_done >= self.spec.max_jobs:
            reason = f"ran {self.jobs_done} jobs (max_jobs_per_child={self.spec.max_jobs})"
        elif self.spec.max_memory_mb is not None and (rss := rss_mb()) > self.spec.max_memory_mb:
            reason = f"RSS {rss:.0f} MiB > max_memory_per_child={self.spec.max_memory_mb} MiB"
        if reason:
            log.info("worker %s retiring: %s", self.spec.worker_id, reason)
            with contextlib.suppress(OSError):
                self.pipe.send(Retiring(reason))
            self.stopping = True

    def _release(self, jobs: list[Job]) -> None:
        """Claimed but never started: back to pending without an attempt (by lease)."""
        by_lease: dict[object, list[Job]] = {}
        for job in jobs:
            by_lease.setdefault(job.lease, []).append(job)
        for group in by_lease.values():
            self.completer.release(self.conn, group)

    def _exit(self) -> None:
        self._release(list(self.queued))
        self.queued.clear()
        try:
            self.completer.flush(self.conn)
        except DatabaseError as exc:
            log.warning(
                "could not write %d successes before exit: %s", self.completer.buffered, exc
            )
        with contextlib.suppress(OSError):
            self._report()
        if self.threads is not None:
            self.threads.shutdown(wait=False, cancel_futures=True)
        if self.spool is not None:
            self.spool.close()
        self.heartbeat.stop()
        self.conn.close()

    # ---- the database ----

    def _connect(self, application_name: str) -> db.Conn:
        return connect_child(self.spec, application_name)

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        """Sleep, jobs running on, but wake for a Stop from the supervisor."""
        assert self.changed is not None
        deadline = self.clock() + seconds
        while not self.stopping and (left := deadline - self.clock()) > 0:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    async def _database_error(self, exc: DatabaseError) -> None:
        """Back off (still handling messages), reconnect if the connection is gone, then let
        the completer write its buffer or forget it (those jobs run again)."""
        log.warning("worker %s database error: %s", self.spec.worker_id, exc)
        await self._sleep_unless_stopped(self.error_backoff.failed())
        if self.conn.closed or self.conn.broken:
            self.conn.close()
            try:
                self.conn = self._connect("pgq-worker")
                log.info("worker %s reconnected", self.spec.worker_id)
            except DatabaseError as again:
                log.info("worker %s cannot connect: %s", self.spec.worker_id, again)
                return
        self.completer.recover(self.conn)
