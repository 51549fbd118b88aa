"""The supervisor: one selector loop that owns the children.

    pgq-supervisor [N procs]
    │  selector over: signal wake-up fd · LISTEN connection · each child's pipe and exit
    │                 sentinel; it waits until the next timer is due, 0.1 s at most
    ├── listener: LISTEN pgq_job_available ── one notification wakes one idle child
    │             LISTEN pgq_job_cancel ── stop the child holding a cancelled job (cancels.py)
    ├── control connection: settle dead children's jobs; the timers' database work
    ├── timers (maintenance/):   poll wake · due jobs · rate windows · rescue · queue metrics
    │                            · prune · summary · cancel check (the poll behind
    │                            pgq_job_cancel) · register (this supervisor's row in the
    │                            supervisor table, for the dashboard and `workers`) · the
    │                            look for supervisors whose session lock was freed · aging
    │                            · vacuum health (with metrics) · unserved types (a type
    │                            enqueued that no live supervisor serves: one warning)
    ├── pgq-worker[0] ─ job connection + heartbeat thread (see worker/)
    ├── pgq-worker[1]
    └── ...

One turn of the loop (`run_once`): wait on the selector → dispatch each ready source → handle
the recorded signals → enforce timeouts and kills → top up the children → run the timers that
are due. Signal handlers only record the signal. A child whose job outruns its timeout, or
whose job in hand was cancelled, gets SIGTERM, then SIGKILL (Child.enforce). Shutdown sends
Stop to every child, waits up to `shutdown_timeout`, then kills the rest. What a child's exit
means (which attempt ends, which jobs go back or run alone, whether it was a crash) is
verdicts.judge's to say; the loop acts on the verdict and deaths.py writes it.

Time is the injected clock throughout. Children stamp a job's start with time.monotonic()
(CLOCK_MONOTONIC is system-wide), so outside tests the clock is time.monotonic; a test's fake
clock drives timeouts by stamping its fake children's slots with its own time.
"""

from __future__ import annotations

import logging
import os
import random
import selectors
import signal
import time
from collections.abc import Callable
from typing import assert_never

from setproctitle import setproctitle

from pgq_supervisor.display import plural
from pgq_supervisor.errors import DatabaseError, ExitCode
from pgq_supervisor.ipc import BootFailed, Idle, Ready, Report, Retiring, RunAloneSet, Wake
from pgq_supervisor.jobs import JobId
from pgq_supervisor.registry import Registry
from pgq_supervisor.settings import Settings
from pgq_supervisor.signals import RecordedSignals
from pgq_supervisor.supervisor import cancels, deaths
from pgq_supervisor.supervisor.children import (
    SHUTDOWN,
    Child,
    Fatal,
    Respawns,
    Spawner,
    child_spec,
    spawn_process,
    start_child,
    tell_run_alone,
    wake_idle,
)
from pgq_supervisor.supervisor.listener import AVAILABLE, CANCEL, DUE, Listener, parse_due
from pgq_supervisor.supervisor.maintenance import (
    DUE_WAKE,
    RATE_DUE,
    ControlConnection,
    Services,
    Timer,
    maintenance_timers,
)
from pgq_supervisor.supervisor.maintenance.registration import Registration
from pgq_supervisor.supervisor.metrics import Metrics
from pgq_supervisor.supervisor.sources import (
    ExitSource,
    ListenSource,
    PipeSource,
    SignalSource,
    Source,
)
from pgq_supervisor.supervisor.verdicts import DeadChild, Verdict, judge
from pgq_supervisor.worker.adaptive import adaptive_in_flight

log = logging.getLogger(__name__)

TICK = 0.1  # the longest wait: timeouts and respawns are judged at least this often
IN_FLIGHT_EVERY = 1.0  # how often the in-flight gauge reads the children's slots


class Supervisor:
    def __init__(
        self, settings: Settings, registry: Registry, dsn: str, *, metrics: Metrics | None = None,
        spawner: Spawner = spawn_process, clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None, services: Services | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.registry = registry
        self.dsn = dsn
        self.schema = settings.db_schema
        self.types = tuple(settings.types or registry.types)
        self.adaptive = adaptive_in_flight(settings, registry, self.types)
        self.metrics = metrics or Metrics()
        self.spawner = spawner
        self.clock = clock
        self.rng = rng or random.Random()
        self.target = settings.procs
        self.children: dict[int, Child] = {}
        self.respawns = Respawns(clock, self.rng, self.metrics.boot_failures.inc)
        self.missed_wakes = 0
        self.stopping = False
        self.shutdown_deadline: float | None = None
        self.exit_code = ExitCode.OK
        self.fatal: Fatal | None = None
        self.signals = RecordedSignals()
        self.signal_handlers: dict[signal.Signals, Callable[[], None]] = {
            signal.SIGTERM: self.handle_sigterm,
            signal.SIGINT: self.handle_sigint,
            signal.SIGTTIN: self.handle_sigttin,
            signal.SIGTTOU: self.handle_sigttou,
        }
        self.control = ControlConnection(
            dsn, clock=clock, rng=self.rng, prepare_threshold=settings.prepare_threshold
        )
        self.registration = Registration(self.control, self.schema, self.rng)
        # LISTEN is session state (and holds our lock): behind a pooler it needs a direct one
        self.listener = Listener(
            settings.listen_dsn or dsn,
            clock=clock,
            rng=self.rng,
            prepare_threshold=settings.prepare_threshold,
            lock=(self.schema, self.registration.id),
        )
        now = clock()
        self.services = services or Services.from_settings(
            settings, self.metrics, now, registry.schedules_for(self.types), types=self.types
        )
        self.timers = maintenance_timers(
            settings, self.types, self.services, self.control, self.metrics, self.wake,
            now=now, rng=self.rng, rated=sorted(registry.rates(self.types)), clock=clock,
            me=self.registration.id,
            agings=registry.agings(self.types),
        )  # fmt: skip
        self.timers.add(
            Timer(
                "cancel-check",
                lambda now: cancels.poll(self.control, self.schema, self.children.values()),
                settings.poll_interval,
                in_shutdown=True,
            )
        )
        self.sel = selectors.DefaultSelector()
        self.last_loop = now
        self.in_flight_at = now
        # jobs released from a death of a child that held several: each child that may run
        # several at once is told (RunAlone), and so is every child spawned later
        self.run_alone = RunAloneSet()
        self.timers.add(
            Timer("register", self._register, settings.heartbeat_interval, in_shutdown=True)
        )

    # ---- the loop ----

    def run(self) -> int:
        """Run until shut down. Returns the process exit code."""
        self.install_signals()
        self._set_title()
        log.info(
            "supervisor pid=%d serving %s with %s (schema %s)",
            os.getpid(),
            ",".join(self.types),
            plural(self.target, "proc"),
            self.schema,
        )
        try:
            self._top_up(self.clock())
            while not self.finished:
                self.run_once()
        finally:
            self.close()
        self.services.activity.run_once(self.clock())
        if self.fatal is not None:
            log.error("%s", self.fatal.message)
            return int(self.fatal.code)
        log.info("supervisor stopped")
        return int(self.exit_code)

    @property
    def finished(self) -> bool:
        return self.stopping and not self.children

    def run_once(self, timeout: float | None = None) -> None:
        """One turn of the loop. `timeout`: the longest wait for a source (None: until the next
        timer, TICK at most)."""
        now = self.last_loop = self.clock()
        if timeout is None:
            timeout = min(TICK, max(0.0, self.timers.next_at(stopping=self.stopping) - now))
        for key, _ in self.sel.select(timeout):
            self._dispatch(key.data)
        self._handle_signals()
        now = self.clock()
        self._enforce(now)
        self._top_up(now)
        self.timers.run_due(now, stopping=self.stopping)

    def _dispatch(self, source: Source) -> None:
        match source:
            case SignalSource():
                self.signals.drain()
            case ListenSource():
                self._on_notifications()
            case PipeSource(child):
                self._on_messages(child)
            case ExitSource(child):
                self._reap(child)
            case _:
                assert_never(source)

    # ---- signals: the handler records, the loop acts ----

    def install_signals(self) -> None:
        """Record signals for the loop (main thread only); `close` restores them."""
        self.sel.register(self.signals.install(), selectors.EVENT_READ, SignalSource())

    def _handle_signals(self) -> None:
        for sig in self.signals.take():
            self.signal_handlers[sig]()

    def handle_sigterm(self) -> None:
        self._begin_shutdown("SIGTERM")

    def handle_sigint(self) -> None:
        if self.stopping:
            log.warning("second SIGINT: stopping now; running jobs are released")
            self.exit_code = ExitCode.INTERRUPTED
            for child in self.children.values():
                child.kill(SHUTDOWN)
        else:
            self._begin_shutdown("SIGINT")

    def handle_sigttin(self) -> None:
        self.target += 1
        log.info("SIGTTIN: %s", plural(self.target, "proc"))
        self._set_title()

    def handle_sigttou(self) -> None:
        if self.target <= 1:
            return
        self.target -= 1
        log.info("SIGTTOU: %s", plural(self.target, "proc"))
        self._set_title()
        for index, child in self.children.items():
            if index >= self.target:
                child.stop()

    def _set_title(self) -> None:
        setproctitle(f"pgq-supervisor [{plural(self.target, 'proc')}]")

    def _begin_shutdown(self, why: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        timeout = self.settings.shutdown_timeout
        self.shutdown_deadline = self.clock() + timeout
        log.info("%s: stopping; running jobs get %.0f s to finish", why, timeout)
        self._unlisten()
        for child in self.children.values():
            child.stop()

    # ---- wake-ups ----

    def _listen(self) -> None:
        if not self.listener.connect():
            return
        fd = self.listener.fileno()
        if fd is not None:
            self.sel.register(fd, selectors.EVENT_READ, ListenSource())
        # notifications sent while we were not listening are lost: everyone looks, and the
        # children's jobs are checked for cancels at once
        self.wake(len(self.children))
        self.timers.by_name["cancel-check"].arm(self.clock())

    def _unlisten(self) -> None:
        fd = self.listener.fileno()
        if fd is not None:
            self.sel.unregister(fd)
        self.listener.stop_listening()  # the lock stays: the draining jobs are still ours

    def _on_notifications(self) -> None:
        fd = self.listener.fileno()
        notifications = self.listener.read()
        if not self.listener.connected and fd is not None:
            self.sel.unregister(fd)
        served = 0
        asks: list[cancels.CancelRequest] = []
        for n in notifications:
            if n.channel == AVAILABLE:
                served += n.payload in self.types
                if self.services.unserved is not None:  # a type not served here: anywhere?
                    self.services.unserved.heard(n.payload, self.clock())
            elif n.channel == DUE and (due := parse_due(n.payload)) is not None:
                if due[1] in self.types:  # wake a child when it comes due (schema/0026)
                    self.timers.run_soon(DUE_WAKE, self.clock() + due[0])
                elif self.services.unserved is not None:  # a delayed job's type, as above
                    self.services.unserved.heard(due[1], self.clock())
            elif n.channel == CANCEL and (request := cancels.parse(n.payload)) is not None:
                asks.append(request)
        # a cancel is acted on only once the database shows it (_enforce stops the child);
        # when it cannot be asked now, the poll asks as soon as the connection is back
        if asks and not cancels.confirm(self.control, self.schema, self.children.values(), asks):
            self.timers.run_soon("cancel-check", self.clock())
        if served:
            self.wake(served)

    def wake(self, n: int) -> None:
        """Wake up to n idle children; what cannot be delivered is owed to the next idle one."""
        if self.stopping:
            return
        n = wake_idle(self.children.values(), n, self.clock())
        # A child busy now claims again before it idles, unless its last claim raced this
        # notification: owe it one wake-up, bounded by the number of children.
        self.missed_wakes = min(self.missed_wakes + n, max(1, len(self.children)))

    # ---- child messages ----

    def _on_messages(self, child: Child) -> None:
        for msg in child.receive():  # which updates the child's own state
            match msg:
                case Report():
                    self.metrics.record(msg)
                    self.services.activity.record(msg.ended)
                    self.metrics.record_steps(msg.steps)
                case Idle():
                    # a claim found nothing: if a rate window held jobs back, learn when it
                    # frees a start (no-op without rated types)
                    self.timers.run_soon(RATE_DUE, self.clock())
                    if self.missed_wakes > 0 and not child.leaving:
                        self.missed_wakes -= 1
                        child.send(Wake(self.clock()))
                    else:
                        child.on_idle()
                case Ready():
                    self.respawns.child_ready(child.spec.index)
                    log.info("child %d ready pid=%d", child.spec.index, msg.pid)
                case Retiring() | BootFailed():
                    pass  # the child's own state (a clean exit; a boot failure: _reap)
                case _:
                    assert_never(msg)

    # ---- children ----

    def _top_up(self, now: float) -> None:
        if self.stopping:
            return
        self._listen()  # its own connections before children's: short of them, children wait
        self.control.connect()
        for index in range(self.target):
            if index not in self.children and self.respawns.due(index, now):
                self._spawn(index, now)

    def _spawn(self, index: int, now: float) -> None:
        worker_id = f"{self.registration.id}:{index}:{self.rng.getrandbits(32):08x}"
        spec = child_spec(self.settings, index, worker_id, self.dsn, self.types, self.adaptive)
        child = self.children[index] = start_child(spec, self.spawner, now, self.run_alone)
        self.sel.register(child.pipe, selectors.EVENT_READ, PipeSource(child))
        self.sel.register(child.proc.sentinel, selectors.EVENT_READ, ExitSource(child))
        self.metrics.children.set(len(self.children))

    def _enforce(self, now: float) -> None:
        """Kill what outlived its time: children at the shutdown deadline, jobs cancelled or
        past their timeout (SIGTERM), children that ignored SIGTERM for KILL_GRACE (SIGKILL)."""
        at_deadline = self.shutdown_deadline is not None and now >= self.shutdown_deadline
        if now - self.in_flight_at >= IN_FLIGHT_EVERY:
            self.in_flight_at = now
            for index, child in self.children.items():
                self.metrics.in_flight.labels(str(index)).set(len(child.current_jobs()))
        for child in self.children.values():
            child.enforce(now, at_deadline)

    def _reap(self, child: Child) -> None:
        child.proc.join(timeout=1.0)
        self._on_messages(child)  # a last Report, Retiring or BootFailed may be in the pipe
        self.sel.unregister(child.pipe)
        self.sel.unregister(child.proc.sentinel)
        child.pipe.close()
        del self.children[child.spec.index]
        self.metrics.children.set(len(self.children))
        now = self.clock()
        dead = DeadChild.of(child, stopping=self.stopping, wanted=child.spec.index < self.target)
        verdict = judge(dead, self.registry, self.rng)
        for line in verdict.logs:
            log.log(line.level, "%s", line.message)
        self._run_alone(verdict.run_alone)  # told before the release makes them claimable
        self._settle_jobs(child, verdict)
        if verdict.respawn:
            lived = now - child.started_at
            self.respawns.after_exit(child.spec.index, lived, not verdict.crash, now)
            self.metrics.restarts.inc()
        if verdict.boot_failure is not None:  # its backoff replaces after_exit's delay
            self.fatal = self.respawns.boot_failed(child.spec.index, verdict.boot_failure, now)
            if self.fatal is not None:
                self._begin_shutdown("fatal")

    def _run_alone(self, ids: tuple[JobId, ...]) -> None:
        """Remember these for the children spawned later, and tell those running now."""
        if ids:
            self.run_alone.add(ids)
            tell_run_alone(self.children.values(), ids)

    def _settle_jobs(self, child: Child, verdict: Verdict) -> None:
        try:
            worker_id = child.worker_id
            self.control.run(
                lambda conn: deaths.settle(conn, self.schema, worker_id, verdict, self.metrics)
            )
        except DatabaseError as exc:
            # the heartbeat stopped with the child: the rescuer will reclaim its jobs
            log.warning("could not settle jobs of dead child %d: %s", child.spec.index, exc)

    def _register(self, now: float) -> None:
        locked_on = self.listener.locked_on
        self.registration.register(self.target, self.types, self.children, locked_on=locked_on)

    # ---- health ----

    def healthy(self) -> bool:
        return self.clock() - self.last_loop < 10.0

    def ready(self) -> bool:  # database reachable, LISTEN up, every child could start
        up = self.control.ok and self.listener.connected and not self.stopping
        return up and not self.respawns.failing

    def close(self) -> None:
        """Kill the children left (releasing their jobs), close connections, restore signals."""
        for child in list(self.children.values()):
            child.kill(SHUTDOWN)  # our own exit: not the job's fault
            child.proc.join(timeout=5)
            dead = DeadChild.of(child, stopping=True, wanted=False)
            self._settle_jobs(child, judge(dead, self.registry, self.rng))
        self.registration.unregister()
        self.listener.close()
        self.control.close()
        self.signals.restore()
        self.sel.close()
