"""The supervisor: one selector loop that owns the children.

    pgq-supervisor [N procs]
    │  selector over: signal wake-up fd · LISTEN connection · each child's pipe and
    │                 exit sentinel · timers (tick 0.1 s, jittered poll, earliest due job)
    ├── listener: LISTEN pgq_job_available ── one notification wakes one idle child
    ├── control connection: reap deaths, rescue stale heartbeats, queue stats
    ├── pgq-worker[0] ─ job connection + heartbeat thread (see worker.py)
    ├── pgq-worker[1]
    └── ...

Signal handlers only record the signal; the loop acts on it. On a child's exit the loop fails
the job it was running as a worker death (its shared slot says which), releases the jobs it
had claimed but not started, and respawns it with backoff. A child whose job outruns its
timeout gets SIGTERM, then SIGKILL. Shutdown sends Stop to every child, waits up to
`shutdown_timeout`, then kills the rest and releases their jobs without consuming an attempt.
"""

from __future__ import annotations

import logging
import os
import random
import selectors
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from setproctitle import setproctitle

from pgq_supervisor import db
from pgq_supervisor.activity import ActivitySummary
from pgq_supervisor.child import Child, Spawner, describe_exit, spawn_process
from pgq_supervisor.errors import DatabaseError, ExitCode
from pgq_supervisor.ipc import BootFailed, Idle, JobSlot, Ready, Report, Retiring, Stop, Wake
from pgq_supervisor.jobs import AttemptKind, JobId
from pgq_supervisor.listener import Listener
from pgq_supervisor.metrics import Metrics
from pgq_supervisor.registry import Registry
from pgq_supervisor.rescuer import Rescuer
from pgq_supervisor.retention import PRUNE_EVERY, Pruner
from pgq_supervisor.settings import Settings
from pgq_supervisor.worker import ChildSpec

log = logging.getLogger(__name__)

TICK = 0.1
KILL_GRACE = 2.0  # SIGTERM to SIGKILL
MAX_BOOT_FAILURES = 3
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGTTIN, signal.SIGTTOU)


@dataclass
class Fatal:
    code: ExitCode
    message: str


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        dsn: str,
        *,
        metrics: Metrics | None = None,
        spawner: Spawner = spawn_process,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.dsn = dsn
        self.schema = settings.db_schema
        self.types = tuple(settings.types or registry.types)
        self.metrics = metrics or Metrics()
        self.spawner = spawner
        self.clock = clock
        self.rng = rng or random.Random()
        self.target = settings.procs
        self.children: dict[int, Child] = {}
        self.respawn_at: dict[int, float] = {}
        self.crashes: dict[int, int] = {}
        self.boot_failures = 0
        self.missed_wakes = 0
        self.stopping = False
        self.shutdown_deadline: float | None = None
        self.exit_code = ExitCode.OK
        self.fatal: Fatal | None = None
        self.signals: list[int] = []
        self.listener = Listener(dsn)
        self.rescuer = Rescuer(self.schema, settings.dead_after)
        self.pruner = Pruner.from_settings(settings)
        self.activity = ActivitySummary(settings.summary_interval, clock())
        self.next_prune = 0.0
        self.conn: db.Conn | None = None
        self.sel = selectors.DefaultSelector()
        self.next_poll = 0.0
        self.next_due: float | None = None
        self.last_loop = clock()
        self.db_ok = False
        self.host = socket.gethostname()

    # ---- lifecycle ----

    def run(self) -> int:
        """Run until shut down. Returns the process exit code."""
        self._install_signals()
        setproctitle(f"pgq-supervisor [{self.target} procs]")
        log.info(
            "supervisor pid=%d serving %s with %d procs (schema %s)",
            os.getpid(),
            ",".join(self.types),
            self.target,
            self.schema,
        )
        try:
            self._loop()
        finally:
            self._close()
        self.activity.run_once(self.clock())
        if self.fatal is not None:
            log.error("%s", self.fatal.message)
            return int(self.fatal.code)
        log.info("supervisor stopped")
        return int(self.exit_code)

    def _loop(self) -> None:
        now = self.clock()
        self._listen(now)
        self._spawn_missing(now)
        while True:
            now = self.clock()
            self.last_loop = now
            for key, _ in self.sel.select(self._timeout(now)):
                self._dispatch(key.data)
            self._handle_signals()
            now = self.clock()
            self._tick(now)
            if self.fatal is not None and not self.children:
                return
            if self.stopping and not self.children:
                return

    def _timeout(self, now: float) -> float:
        deadline = now + TICK
        if self.next_due is not None:
            deadline = min(deadline, self.next_due)
        return max(0.0, deadline - now)

    def _dispatch(self, data: tuple[str, Child | None]) -> None:
        what, child = data
        if what == "signal":
            self._drain_wakeup_fd()
        elif what == "listen":
            self._on_notifications()
        elif what == "pipe" and child is not None:
            self._on_messages(child)
        elif what == "exit" and child is not None:
            self._reap(child)

    # ---- signals: the handler records, the loop acts ----

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, self._record_signal)
        self.sel.register(self._wake_r, selectors.EVENT_READ, ("signal", None))

    def _record_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)

    def _drain_wakeup_fd(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _handle_signals(self) -> None:
        while self.signals:
            sig = self.signals.pop(0)
            if sig in (signal.SIGTERM, signal.SIGINT):
                if self.stopping and sig == signal.SIGINT:
                    self._stop_now()
                else:
                    self._begin_shutdown(signal.Signals(sig).name)
            elif sig == signal.SIGTTIN:
                self.target += 1
                log.info("SIGTTIN: %d procs", self.target)
                setproctitle(f"pgq-supervisor [{self.target} procs]")
            elif sig == signal.SIGTTOU and self.target > 1:
                self.target -= 1
                log.info("SIGTTOU: %d procs", self.target)
                setproctitle(f"pgq-supervisor [{self.target} procs]")
                for index, child in self.children.items():
                    if index >= self.target and not child.stopping:
                        child.stopping = True
                        child.send(Stop())

    def _begin_shutdown(self, why: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        timeout = self.settings.shutdown_timeout
        self.shutdown_deadline = self.clock() + timeout
        log.info("%s: stopping; running jobs get %.0f s to finish", why, timeout)
        self._unlisten()
        for child in self.children.values():
            child.stopping = True
            child.send(Stop())

    def _stop_now(self) -> None:
        log.warning("second SIGINT: stopping now; running jobs are released")
        self.exit_code = ExitCode.INTERRUPTED
        for child in self.children.values():
            child.kill_reason = "shutdown"
            child.signal(signal.SIGKILL)
            child.kill_sent = True

    # ---- wake-ups ----

    def _listen(self, now: float) -> None:
        if self.stopping or not self.listener.connect(now):
            return
        fd = self.listener.fileno()
        if fd is not None:
            self.sel.register(fd, selectors.EVENT_READ, ("listen", None))
        # notifications sent while we were not listening are lost: everyone looks
        self._wake(len(self.children))

    def _unlisten(self) -> None:
        fd = self.listener.fileno()
        if fd is not None:
            self.sel.unregister(fd)
        self.listener.close()

    def _on_notifications(self) -> None:
        fd = self.listener.fileno()
        payloads = self.listener.read()
        if not self.listener.connected and fd is not None:
            self.sel.unregister(fd)
        served = sum(1 for p in payloads if p in self.types)
        if served:
            self._wake(served)

    def _wake(self, n: int) -> None:
        """Wake up to n idle children; what cannot be delivered is owed to the next idle one."""
        if self.stopping:
            return
        sent_at = self.clock()
        for child in self.children.values():
            if n <= 0:
                break
            if child.idle and child.ready and not child.stopping and child.send(Wake(sent_at)):
                child.idle = False
                n -= 1
        # A child busy now claims again before it idles, unless its last claim raced this
        # notification: owe it one wake-up, bounded by the number of children.
        self.missed_wakes = min(self.missed_wakes + n, max(1, len(self.children)))

    # ---- child messages ----

    def _on_messages(self, child: Child) -> None:
        for msg in child.recv_all():
            if isinstance(msg, Report):
                self.metrics.record(msg.outcomes, msg.wake_latencies)
                self.activity.record(msg.outcomes)
            elif isinstance(msg, Idle):
                if self.missed_wakes > 0 and not child.stopping:
                    self.missed_wakes -= 1
                    child.send(Wake(self.clock()))
                else:
                    child.idle = True
            elif isinstance(msg, Ready):
                child.ready = True
                self.boot_failures = 0
                log.info("child %d ready pid=%d", child.spec.index, msg.pid)
            elif isinstance(msg, Retiring):
                child.retiring = child.stopping = True
            elif isinstance(msg, BootFailed):
                child.boot_error, child.boot_app_error = msg.error, msg.app_error

    # ---- children ----

    def _spawn_missing(self, now: float) -> None:
        if self.stopping or self.fatal is not None:
            return
        for index in range(self.target):
            if index in self.children or self.respawn_at.get(index, 0.0) > now:
                continue
            self._spawn(index, now)

    def _spawn(self, index: int, now: float) -> None:
        s = self.settings
        spec = ChildSpec(
            index=index,
            worker_id=f"{self.host}:{os.getpid()}:{index}:{self.rng.getrandbits(32):08x}",
            app=s.app or "",
            dsn=self.dsn,
            schema=self.schema,
            types=self.types,
            heartbeat_interval=s.heartbeat_interval,
            claim_batch=s.claim_batch,
            max_jobs=s.max_jobs_per_child,
            max_memory_mb=s.max_memory_per_child,
            log_level=s.log_level,
            log_format=s.log_format,
            connect_timeout=s.connect_timeout,
            synchronous_commit=s.worker_synchronous_commit,
        )
        slot = JobSlot()
        proc, pipe = self.spawner(spec, slot)
        child = Child(spec=spec, proc=proc, pipe=pipe, slot=slot, started_at=now)
        self.children[index] = child
        self.sel.register(pipe, selectors.EVENT_READ, ("pipe", child))
        self.sel.register(proc.sentinel, selectors.EVENT_READ, ("exit", child))
        self.metrics.children.set(len(self.children))

    def _reap(self, child: Child) -> None:
        child.proc.join(timeout=1.0)
        self._on_messages(child)  # a last Report or BootFailed may still be in the pipe
        self.sel.unregister(child.pipe)
        self.sel.unregister(child.proc.sentinel)
        child.pipe.close()
        del self.children[child.spec.index]
        self.metrics.children.set(len(self.children))
        how = describe_exit(child.proc.exitcode)
        now = self.clock()
        if child.boot_error is not None:
            self._boot_failed(child)
        self._settle_jobs(child, how)
        clean = child.proc.exitcode == 0 and (child.stopping or child.retiring)
        if not clean:
            log.warning("child %d (pid %s) died: %s", child.spec.index, child.pid, how)
        self._schedule_respawn(child, now, clean)

    def _settle_jobs(self, child: Child, how: str) -> None:
        """Fail the dead child's job in hand as an attempt; release what it never started."""
        current = child.current_job()
        try:
            conn = self._control()
            if current is not None and child.kill_job not in (None, current.job_id):
                current = None  # killed for the job before this one: not this job's fault
            if current is not None and child.kill_reason != "shutdown":
                kind = AttemptKind.TIMEOUT if child.kill_reason else AttemptKind.WORKER_DEATH
                error = child.kill_reason or f"worker died: {how}"
                delay = self._death_backoff(conn, current.job_id, current.attempt)
                ended = db.end_attempt(
                    conn,
                    self.schema,
                    [current.job_id],
                    worker_id=child.worker_id,
                    error=error,
                    kind=kind,
                    delay=delay,
                )
                for e in ended:
                    label = (
                        self.metrics.timeouts
                        if kind is AttemptKind.TIMEOUT
                        else self.metrics.deaths
                    )
                    label.labels(e.job_type).inc()
                    log.warning(
                        "job %s id=%s type=%s attempt=%d worker=%s error=%s",
                        "retry" if e.new_state.value == "pending" else "failed",
                        e.job_id,
                        e.job_type,
                        current.attempt,
                        child.worker_id,
                        error,
                    )
            released = db.release(conn, self.schema, worker_id=child.worker_id)
            if released:
                log.info("released %d jobs of child %d", len(released), child.spec.index)
        except DatabaseError as exc:
            # the heartbeat stopped with the child: the rescuer will reclaim its jobs
            log.warning("could not settle jobs of dead child %d: %s", child.spec.index, exc)
            self._drop_control()

    def _death_backoff(self, conn: db.Conn, job_id: JobId, attempt: int) -> float:
        try:
            handler = self.registry.handlers.get(db.get_job(conn, self.schema, job_id).type)
        except DatabaseError:
            return 0.0
        return 0.0 if handler is None else handler.backoff(attempt, self.rng)

    def _boot_failed(self, child: Child) -> None:
        self.boot_failures += 1
        error = child.boot_error or "unknown"
        if child.boot_app_error:
            self.fatal = Fatal(ExitCode.APP_LOAD, f"error: child could not load the app: {error}")
        elif self.boot_failures >= MAX_BOOT_FAILURES:
            self.fatal = Fatal(
                ExitCode.FAILURE,
                f"error: {self.boot_failures} children failed to start in a row: {error}",
            )
        if self.fatal is not None:
            self._begin_shutdown("fatal")

    def _schedule_respawn(self, child: Child, now: float, clean: bool) -> None:
        index = child.spec.index
        if self.stopping or index >= self.target:
            return
        if clean or now - child.started_at > 10.0:
            self.crashes[index] = 0
        else:
            self.crashes[index] = self.crashes.get(index, 0) + 1
        n = self.crashes[index]
        # the first crash respawns at once; a crash loop backs off up to 10 s
        self.respawn_at[index] = now + (0.0 if n <= 1 else min(10.0, 0.1 * 2 ** (n - 1)))
        self.metrics.restarts.inc()

    # ---- timers ----

    def _tick(self, now: float) -> None:
        if self.stopping:
            self._enforce_shutdown(now)
        else:
            self._listen(now)
            self._spawn_missing(now)
        self._enforce_timeouts(now)
        if self.activity.due(now):
            self.activity.run_once(now)
        if self.next_due is not None and now >= self.next_due:
            self.next_due = None
            self._wake(1)
        if now >= self.next_poll and not self.stopping:
            self.next_poll = now + self.settings.poll_interval * self.rng.uniform(0.8, 1.2)
            self._poll()

    def _poll(self) -> None:
        """The fallback behind notifications, and the maintenance that rides on it."""
        self._wake(1)
        try:
            conn = self._control()
            rescued = self.rescuer.run_once(conn)
            if rescued.ended:
                self.metrics.rescued.inc(len(rescued.ended))
            due = db.next_due(conn, self.schema, self.types)
            if due is not None:
                self.next_due = self.clock() + max(0.0, due)
            self.metrics.update_queue(db.queue_stats(conn, self.schema, active_only=True))
            if self.pruner is not None and self.clock() >= self.next_prune:
                pruned = self.pruner.run_once(conn)
                self.metrics.record_pruned(pruned.succeeded, pruned.failed)
                self.next_prune = self.clock() + (0.0 if pruned.more else PRUNE_EVERY)
            self.db_ok = True
        except DatabaseError as exc:
            log.warning("maintenance round failed: %s", exc)
            self._drop_control()

    def _enforce_timeouts(self, now: float) -> None:
        for child in list(self.children.values()):
            if child.term_sent_at is not None:
                if not child.kill_sent and now - child.term_sent_at > KILL_GRACE:
                    child.signal(signal.SIGKILL)
                    child.kill_sent = True
                continue
            job = child.current_job()
            if job is None or job.timeout is None:
                continue
            if time.monotonic() - job.started > job.timeout:
                log.warning(
                    "job id=%s outran its timeout of %g s: killing child %d",
                    job.job_id,
                    job.timeout,
                    child.spec.index,
                )
                child.kill_reason = f"timeout after {job.timeout:g} s"
                child.kill_job = job.job_id
                child.term_sent_at = now
                child.signal(signal.SIGTERM)

    def _enforce_shutdown(self, now: float) -> None:
        if self.shutdown_deadline is None or now < self.shutdown_deadline:
            return
        for child in self.children.values():
            if not child.kill_sent:
                log.warning("child %d still busy at shutdown_timeout: killing it", child.spec.index)
                child.kill_reason = "shutdown"
                child.signal(signal.SIGKILL)
                child.kill_sent = True

    # ---- database ----

    def _control(self) -> db.Conn:
        if self.conn is None or self.conn.closed:
            self.conn = db.connect(self.dsn, application_name="pgq-supervisor")
        return self.conn

    def _drop_control(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.db_ok = False

    # ---- health ----

    def healthy(self) -> bool:
        return self.clock() - self.last_loop < 10.0

    def ready(self) -> bool:
        return self.db_ok and self.listener.connected and not self.stopping

    def _close(self) -> None:
        for child in list(self.children.values()):
            child.kill_reason = "shutdown"  # our own exit: not the job's fault
            child.signal(signal.SIGKILL)
            child.proc.join(timeout=5)
            self._settle_jobs(child, "killed at exit")
        self.listener.close()
        self._drop_control()
        signal.set_wakeup_fd(-1)
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        self.sel.close()
