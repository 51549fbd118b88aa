"""The supervisor's handle on one child process: spawn, lifecycle state, messages, signals,
exit decoding."""

from __future__ import annotations

import enum
import logging
import multiprocessing
import os
import random
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Protocol

from pgq_supervisor.backoff import Backoff
from pgq_supervisor.errors import ExitCode
from pgq_supervisor.ipc import (
    BootFailed,
    CancelJob,
    ChildSpec,
    FromChild,
    JobSlot,
    Ready,
    Report,
    Retiring,
    RunAlone,
    RunAloneSet,
    SlotView,
    Stop,
    ToChild,
    Wake,
)
from pgq_supervisor.jobs import JobId, JsonValue
from pgq_supervisor.settings import Settings
from pgq_supervisor.worker.main import child_main

log = logging.getLogger(__name__)

RESPAWN_MAX = 10.0  # the longest respawn delay of a crash loop
STABLE_AFTER = 10.0  # a child that lived longer than this before dying ends a crash loop
# A child that could not connect is spawned again after a jittered backoff from BOOT_RETRY up
# to BOOT_RETRY_MAX: a database short of connections frees them at its own pace, and children
# retrying in step would take each slot the application frees.
BOOT_RETRY = 1.0
BOOT_RETRY_MAX = 30.0
KILL_GRACE = 2.0  # SIGTERM to SIGKILL
RUN_ALONE_AT_SPAWN = 1_000  # the latest jobs to run alone a new child is told of (verdicts.py)


class Process(Protocol):
    """What the supervisor needs of a process (multiprocessing's, or a fake in unit tests)."""

    @property
    def pid(self) -> int | None: ...
    @property
    def sentinel(self) -> int: ...
    @property
    def exitcode(self) -> int | None: ...
    def start(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...
    def terminate(self) -> None: ...  # SIGTERM; nothing if it has exited
    def kill(self) -> None: ...  # SIGKILL; nothing if it has exited


# Starts a child; returns it and the supervisor's end of its pipe. Unit tests pass a fake.
Spawner = Callable[[ChildSpec, JobSlot], tuple[Process, Connection]]


# Children are forked by multiprocessing's fork server, which imports
# pgq_supervisor.supervisor.preload (and through it psycopg, pydantic, the child's code and the app)
# once: see preload.py.
_FORKSERVER = multiprocessing.get_context("forkserver")
PRELOAD = ["pgq_supervisor.supervisor.preload"]
# The app the fork server preloads ("package.module:registry"): read from its environment,
# which is ours when it starts.
PRELOAD_APP_ENV = "_PGQ_PRELOAD_APP"  # no PGQ_ prefix: not a setting


def spawn_process(spec: ChildSpec, slot: JobSlot) -> tuple[Process, Connection]:
    """Fork a child from the preloaded fork server (started, on first use, as a fresh
    interpreter: it inherits no connection, lock or thread, and the children share its pages)."""
    # Both only matter when the fork server starts (first use, or after it died): a process
    # that later runs another app (tests) has the child import it at boot.
    os.environ[PRELOAD_APP_ENV] = spec.app
    _FORKSERVER.set_forkserver_preload(PRELOAD)
    ours, theirs = _FORKSERVER.Pipe(duplex=True)
    proc: BaseProcess = _FORKSERVER.Process(
        target=child_main, args=(spec, theirs, slot), name=f"pgq-worker[{spec.index}]"
    )
    proc.start()
    theirs.close()
    return proc, ours


# The kill reason of a child killed for shutdown: its job is released without using an attempt.
SHUTDOWN = "shutdown"
# The kill reason of a child stopped because its job was cancelled: that job has already ended
# (in the cancel's transaction), the rest are released; the death counts as no attempt.
CANCELLED = "cancelled"
# The kill reason of a child whose heartbeat could not reach the database for a safe part of
# dead_after (it says so in its slot): its jobs go back without an attempt before the rescuer
# would charge them one, and its work so far is not carried on only to be thrown away.
HEARTBEAT_LOST = "heartbeat lost"


def child_spec(
    settings: Settings, index: int, worker_id: str, dsn: str, types: tuple[str, ...],
    adaptive: int = 0,  # worker/adaptive.py's adaptive_in_flight for these settings and types
) -> ChildSpec:  # fmt: skip
    s = settings
    return ChildSpec(
        index=index,
        worker_id=worker_id,
        app=s.app or "",
        dsn=dsn,
        schema=s.db_schema,
        types=types,
        heartbeat_interval=s.heartbeat_interval,
        claim_batch=s.claim_batch,
        max_jobs=s.max_jobs_per_child,
        max_memory_mb=s.max_memory_per_child,
        log_level=s.log_level,
        log_format=s.log_format,
        connect_timeout=s.connect_timeout,
        dead_after=s.dead_after,
        synchronous_commit=s.worker_synchronous_commit,
        prepare_threshold=s.prepare_threshold,
        concurrency=s.concurrency,
        adaptive=adaptive,
        pool_size=s.child_pool_size,
        release_unstarted_after=s.release_unstarted_after,
    )


@dataclass(frozen=True, slots=True)
class Fatal:
    code: ExitCode
    message: str


class Respawns:
    """When each child index may be spawned again: a first crash respawns at once, a crash
    loop backs off, doubling up to RESPAWN_MAX. A child that could not boot: if the app does
    not load, the supervisor stops (a configuration error: every child would fail alike); if it
    could not connect, that index is spawned again after its jittered Backoff, the others
    working on (`failing` names them until one of theirs is ready)."""

    def __init__(
        self, clock: Callable[[], float], rng: random.Random, counted: Callable[[], object]
    ) -> None:
        self.counted = counted  # called for each boot failure (a metric)
        self.at: dict[int, float] = {}
        self.crashes: dict[int, int] = {}
        self.clock = clock
        self.rng = rng
        self.boot_backoffs: dict[int, Backoff] = {}  # the indexes whose last boot failed

    @property
    def failing(self) -> int:
        """How many child indexes could not boot last time they tried."""
        return len(self.boot_backoffs)

    def child_ready(self, index: int) -> None:
        self.boot_backoffs.pop(index, None)

    def boot_failed(self, index: int, failure: BootFailed, now: float) -> Fatal | None:
        """A child that could not boot: a Fatal says the supervisor must stop; otherwise the
        index is spawned again after its backoff (instead of `after_exit`'s delay)."""
        self.counted()
        if failure.app_error:
            return Fatal(ExitCode.APP_LOAD, f"error: child could not load the app: {failure.error}")
        backoff = self.boot_backoffs.get(index)
        if backoff is None:
            backoff = self.boot_backoffs[index] = Backoff(
                initial=BOOT_RETRY, maximum=BOOT_RETRY_MAX, clock=self.clock, rng=self.rng
            )
        delay = backoff.failed()
        self.at[index] = now + delay
        log.warning(
            "child %d could not start (%s): next try in %.1f s", index, failure.error, delay
        )
        return None

    def due(self, index: int, now: float) -> bool:
        return self.at.get(index, 0.0) <= now

    def after_exit(self, index: int, lived: float, clean: bool, now: float) -> None:
        """Schedule the respawn of a child that exited after `lived` seconds (one that could
        not boot: `boot_failed`)."""
        n = 0 if clean or lived > STABLE_AFTER else self.crashes.get(index, 0) + 1
        self.crashes[index] = n
        delay = 0.0 if n <= 1 else min(RESPAWN_MAX, 0.1 * 2 ** (n - 1))
        self.at[index] = now + delay


def describe_exit(exitcode: int | None) -> str:
    """'SIGKILL', 'exit code 1', ...; exitcode as multiprocessing decodes it (negative = signal)."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    if exitcode == ExitCode.CHILD_BOOT_FAILURE:
        return "boot failure"
    return f"exit code {exitcode}"


class ChildState(enum.Enum):
    """Where a child is in its one lifecycle, as the supervisor sees it.

    BOOTING ─Ready─▶ BUSY ─Idle─▶ IDLE ─Wake─▶ BUSY ...
    any live state ─Stop sent / Retiring (also its own SIGTERM)─▶ STOPPING (exits 0 after the
        job in hand)
    any ─job outran its timeout, or was cancelled: SIGTERM─▶ TERMINATING ─KILL_GRACE─▶ KILLED
    any ─shutdown deadline or second SIGINT: SIGKILL─▶ KILLED
    """

    BOOTING = "booting"
    BUSY = "busy"  # claiming or running: it claims again before it idles
    IDLE = "idle"  # its last claim found nothing; it waits for a Wake
    STOPPING = "stopping"
    TERMINATING = "terminating"
    KILLED = "killed"


LEAVING = frozenset({ChildState.STOPPING, ChildState.TERMINATING, ChildState.KILLED})


@dataclass(eq=False)
class Child:
    spec: ChildSpec
    proc: Process
    pipe: Connection
    slot: JobSlot
    started_at: float
    state: ChildState = ChildState.BOOTING
    boot_failure: BootFailed | None = None  # what the child said before exiting
    kill_reason: str | None = None  # e.g. "timeout after 5 s": recorded as the attempt's error
    kill_job: JobId | None = None  # the job the kill was meant for (None: all of them)
    term_sent_at: float | None = None  # when TERMINATING began
    # jobs of this child cancelled in the database (cancels.py): stopped once in hand
    cancelled: set[JobId] = field(default_factory=set)
    jobs_done: int = 0  # outcomes it reported (any kind): the Workers page shows them

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    @property
    def worker_id(self) -> str:
        return self.spec.worker_id

    @property
    def leaving(self) -> bool:
        """Asked to stop, or being killed: never woken, never asked again."""
        return self.state in LEAVING

    # ---- what the child told us ----

    def on_ready(self) -> None:
        if self.state is ChildState.BOOTING:
            self.state = ChildState.BUSY  # a fresh child claims at once

    def on_idle(self) -> None:
        if not self.leaving:
            self.state = ChildState.IDLE

    def on_retiring(self) -> None:
        if not self.leaving:
            self.state = ChildState.STOPPING

    # ---- what we tell it ----

    def wake(self, sent_at: float) -> bool:
        """Wake an idle child. False if it is not idle or its pipe is gone."""
        if self.state is not ChildState.IDLE or not self.send(Wake(sent_at)):
            return False
        self.state = ChildState.BUSY
        return True

    def stop(self) -> None:
        """Finish the job in hand and exit 0 (a no-op for a child already leaving)."""
        if not self.leaving:
            self.state = ChildState.STOPPING
            self.send(Stop())

    def terminate(self, now: float, reason: str, job_id: JobId | None) -> None:
        """SIGTERM for `job_id`, whose attempt records `reason`; SIGKILL follows if needed.
        The slot's kill mark, set first, makes the child die of it rather than stop (a SIGTERM
        from anyone else is a stop: signals.ChildSignals)."""
        self.kill_reason, self.kill_job, self.term_sent_at = reason, job_id, now
        self.state = ChildState.TERMINATING
        self.slot.mark_kill()
        self.proc.terminate()

    def stop_cancelled(self, now: float, job: SlotView) -> None:
        """Stop `job`, which was cancelled while this child runs it. An async job (its slot
        entry has a grace) is cancelled by the child, told so; the child stays. A sync handler
        cannot be interrupted inside the process: SIGTERM (SIGKILL after KILL_GRACE), the loop
        respawns the child, and its other jobs go back without an attempt."""
        if job.grace > 0 and self.send(CancelJob(job.job_id)):
            self.cancelled.discard(job.job_id)
            return
        self.terminate(now, CANCELLED, job.job_id)

    def enforce(self, now: float, at_deadline: bool) -> None:
        """Kill what outlived its time (the loop asks each turn): at the shutdown deadline,
        SIGKILL; a job cancelled or past its timeout, SIGTERM; SIGTERM ignored for KILL_GRACE,
        SIGKILL."""
        if self.state is ChildState.KILLED:
            return
        if at_deadline:
            log.warning("child %d still busy at shutdown_timeout: killing it", self.spec.index)
            self.kill(SHUTDOWN)
        elif self.state is ChildState.TERMINATING:
            if self.term_sent_at is not None and now - self.term_sent_at > KILL_GRACE:
                self.kill()
        elif self.slot.heartbeat_lost:
            log.warning(
                "child %d: its heartbeat cannot reach the database: stopping it, its jobs go"
                " back without an attempt",
                self.spec.index,
            )
            self.terminate(now, HEARTBEAT_LOST, None)
        elif (job := self.cancelled_in_hand()) is not None:
            log.info("job id=%s was cancelled: stopping child %d", job.job_id, self.spec.index)
            self.stop_cancelled(now, job)
        elif (job := self.overdue_job(now)) is not None:
            log.warning(
                "job id=%s outran its timeout of %g s: killing child %d",
                job.job_id,
                job.timeout,
                self.spec.index,
            )
            self.terminate(now, f"timeout after {job.timeout:g} s", job.job_id)

    def kill(self, reason: str | None = None) -> None:
        """SIGKILL. `reason` replaces the attempt's error (SHUTDOWN: the job is released)."""
        if reason is not None:
            self.kill_reason = reason
        self.state = ChildState.KILLED
        self.proc.kill()

    def send(self, msg: ToChild) -> bool:
        try:
            self.pipe.send(msg)
            return True
        except OSError:
            return False  # it is exiting; its sentinel will tell us

    def receive(self) -> list[FromChild]:
        """The messages in the pipe, once what they say of this child is applied to it."""
        out: list[FromChild] = []
        try:
            while self.pipe.poll(0):
                out.append(self.pipe.recv())
        except (EOFError, OSError):
            pass
        for msg in out:
            if isinstance(msg, Report):
                self.jobs_done += msg.jobs
            elif isinstance(msg, Ready):
                self.on_ready()
            elif isinstance(msg, Retiring):
                self.on_retiring()
            elif isinstance(msg, BootFailed):
                self.boot_failure = msg
        return out

    def describe(self) -> dict[str, JsonValue]:
        """What the supervisor's registered row says of this child (schema/0010)."""
        jobs = self.slot.read_all()
        job = jobs[0] if jobs else None
        described: dict[str, JsonValue] = {
            "index": self.spec.index,
            "pid": self.pid,
            "worker_id": self.worker_id,
            "state": self.state.value,
            "job_id": None if job is None else str(job.job_id),
            "job_type": None if job is None else job.job_type,
            "in_flight": len(jobs),
            # claimed (running in the database) but not started: waiting behind those in hand
            "held": self.slot.held(),
            "jobs_done": self.jobs_done,
        }
        if len(jobs) > 1:  # every job in hand, so that `show` can tell one claimed, not started
            described["job_ids"] = [str(v.job_id) for v in jobs]
        return described

    def cancelled_in_hand(self) -> SlotView | None:
        """A job in hand that was cancelled (cancels.py marked it): it must be stopped now.
        None for a child already being killed."""
        if not self.cancelled or self.state in (ChildState.TERMINATING, ChildState.KILLED):
            return None
        return next((v for v in self.current_jobs() if v.job_id in self.cancelled), None)

    def current_job(self) -> SlotView | None:
        return self.slot.read()

    def current_jobs(self) -> list[SlotView]:
        """Every job in flight (one at most, unless the child runs many at once)."""
        return self.slot.read_all()

    def overdue_job(self, now: float) -> SlotView | None:
        """A job in hand that outran its timeout (and its grace, an async job the child
        cancels itself) by `now` (the supervisor's clock, which must share the slot's time
        base: time.monotonic, or a test's fake clock)."""
        if self.slot.capacity == 1:
            job = self.slot.read()
            if job is None or job.timeout is None or now - job.started <= job.timeout + job.grace:
                return None
            return job
        for job in self.slot.read_all():
            if job.timeout is not None and now - job.started > job.timeout + job.grace:
                return job
        return None


def start_child(spec: ChildSpec, spawner: Spawner, now: float, run_alone: RunAloneSet) -> Child:
    """Spawn a child for `spec`, with a slot entry per job it may hold. One that may hold
    several is told the latest jobs that must run alone: in the pipe before its first claim
    (16 KB at most, which the pipe's buffer holds while it boots)."""
    slot = JobSlot(spec.types, capacity=spec.slots)
    proc, pipe = spawner(spec, slot)
    child = Child(spec=spec, proc=proc, pipe=pipe, slot=slot, started_at=now)
    if run_alone and spec.slots > 1:
        child.send(RunAlone.of(run_alone.latest(RUN_ALONE_AT_SPAWN)))
    return child


def wake_idle(children: Iterable[Child], n: int, sent_at: float) -> int:
    """Wake up to `n` idle children; returns how many wake-ups found none to deliver to."""
    for child in children:
        if n <= 0:
            break
        if child.wake(sent_at):
            n -= 1
    return n


def tell_run_alone(children: Iterable[Child], ids: Sequence[JobId]) -> None:
    """Tell the children that may run several jobs at once to run these alone."""
    for child in children:
        if child.spec.slots > 1 and not child.leaving:
            child.send(RunAlone.of(ids))
