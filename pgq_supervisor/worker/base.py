"""What every child runs jobs with, whichever worker it is (sync.Worker,
inflight.InFlightWorker): its heartbeat, executor and completer, its connections, its
RSS; and BaseWorker, what both loops share (the pipe's messages, reconnecting, reports,
retiring, leaving). Both workers import it; it imports neither."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Final, TypedDict, Unpack, assert_never

from setproctitle import setproctitle

from pgq_supervisor import db
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.display import plural
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.ipc import (
    CancelJob,
    ChildSpec,
    JobSlot,
    Report,
    Retiring,
    RunAlone,
    Stop,
    ToChild,
    Wake,
)
from pgq_supervisor.jobs import JobId
from pgq_supervisor.registry import Registry
from pgq_supervisor.signals import ChildSignals
from pgq_supervisor.worker.completion import Completer
from pgq_supervisor.worker.executor import Executor
from pgq_supervisor.worker.heartbeat import Heartbeat
from pgq_supervisor.workflows import tally

log = logging.getLogger(__name__)

REPORT_EVERY: Final = 0.25
# Jobs no heartbeat reached for this part of dead_after are given up (heartbeat.py): the
# supervisor has the rest to stop the child and release them before the rescuer's next round.
GIVE_UP_AT: Final = 0.5
HEARTBEAT_DOWN_POLL: Final = 0.1  # how often a child with no heartbeat asks if it is back


def stop_on_sigterm(
    signals: ChildSignals | None, pipe: Connection, worker_id: str, stopping: bool
) -> bool:
    """Empty `signals`; True if a SIGTERM was recorded: the child then stops as if told to, and
    unless it is stopping already it says so to the supervisor (Retiring: a clean exit, a
    child replaced at once when the supervisor is not stopping itself)."""
    if signals is None:
        return False
    signals.drain()
    if not signals.take():
        return False
    if not stopping:
        log.info("worker %s: SIGTERM: finishing the jobs in hand, then leaving", worker_id)
        with contextlib.suppress(OSError):
            pipe.send(Retiring("SIGTERM"))
    return True


def rss_mb() -> float:
    with open("/proc/self/statm", "rb") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


HEARTBEAT_APP: Final = "pgq-heartbeat"


def connect_child(spec: ChildSpec, application_name: str) -> db.Conn:
    """A connection of the child (its job connection, its heartbeat's) as the spec says."""
    return db.connect(
        spec.dsn,
        application_name=application_name,
        synchronous_commit=spec.synchronous_commit,
        prepare_threshold=spec.prepare_threshold,
    )


def child_parts(
    spec: ChildSpec, registry: Registry, slot: JobSlot, heartbeat_conn: db.Conn | None = None
) -> tuple[Heartbeat, Executor, Completer]:
    """What every child runs jobs with, whichever worker it is: the heartbeat (on its own
    connection, `heartbeat_conn` if opened at boot), the executor and the completer."""
    heartbeat = Heartbeat(
        lambda: connect_child(spec, HEARTBEAT_APP),
        spec.schema,
        spec.heartbeat_interval,
        spec.worker_id,
        conn=heartbeat_conn,
        give_up_after=spec.dead_after * GIVE_UP_AT,
        on_give_up=slot.mark_heartbeat_lost,
    )
    # the heartbeat thread writes progress too: on its own connection, never inside a
    # `conn` handler's transaction
    executor = Executor(registry, spec.worker_id, progress=heartbeat.progress, schema=spec.schema)
    completer = Completer(
        spec.schema,
        spec.worker_id,
        heartbeat=heartbeat,
        flush_every=REPORT_EVERY,
        ephemeral=registry.ephemeral_types(),
    )
    return heartbeat, executor, completer


class Options(TypedDict, total=False):
    """A worker's settings beyond its parts: a child sets `signals`, tests the rest."""

    clock: Callable[[], float]  # time.monotonic: the slot's stamps are compared with it
    error_backoff: Backoff | None  # after a database error
    connect_backoff: Backoff | None  # between attempts to connect again
    connect: Callable[[], db.Conn] | None  # the job connection, as the spec says
    signals: ChildSignals | None  # the child's SIGTERM
    heartbeat_conn: db.Conn | None  # the heartbeat's connection, opened at boot


class BaseWorker:
    """What both loops share: the child's parts and connection, the pipe's messages, the one
    reconnect policy, reports, retiring, the title and leaving. A loop implements `run` and
    the hooks its messages need (`_woken`, `_cancel`, `_run_alone`); see sync.py, inflight.py."""

    def __init__(
        self, spec: ChildSpec, registry: Registry, pipe: Connection, slot: JobSlot,
        conn: db.Conn, **options: Unpack[Options],
    ) -> None:  # fmt: skip
        self.spec = spec
        self.registry = registry
        self.pipe = pipe
        self.slot = slot
        self.conn = conn
        self.clock = options.get("clock", time.monotonic)
        self.heartbeat, self.executor, self.completer = child_parts(
            spec, registry, slot, options.get("heartbeat_conn")
        )
        # errors that repeat (a schema not migrated, the database away) must not spin; reset
        # by a claim
        self.error_backoff = options.get("error_backoff") or Backoff(initial=0.1, maximum=5.0)
        self.connect_backoff = options.get("connect_backoff") or Backoff(initial=0.2, maximum=5.0)
        # the job connection, opened again after it is lost (a test points it elsewhere)
        self.connect = options.get("connect") or (lambda: connect_child(spec, "pgq-worker"))
        self.signals = options.get("signals")
        self.stopping = False
        self.waiting_heartbeat = False  # claims wait for the heartbeat's connection
        self.jobs_done = 0
        self.latencies: list[float] = []  # wake latencies since the last report
        self.woken_at: float | None = None  # when the Wake we have not claimed for was sent
        self.last_report = self.clock()
        self.title = ""

    # ---- the pipe ----

    def _handle(self, msg: ToChild) -> None:
        match msg:
            case Wake(sent_at):
                self._woken(sent_at)
            case Stop():
                self.stopping = True
            case CancelJob(job_id):
                self._cancel(job_id)
            case RunAlone():
                self._run_alone(msg.job_ids())
            case _:
                assert_never(msg)

    def _woken(self, sent_at: float) -> None:
        self.woken_at = sent_at

    def _cancel(self, job_id: JobId) -> None:
        """One job only: the supervisor kills the child for a cancelled job in hand."""

    def _run_alone(self, job_ids: list[JobId]) -> None:
        """One job only: every job runs alone."""

    def _read_pipe_messages(self) -> bool:
        """Handle what the supervisor sent; False when it is gone (then the child stops)."""
        try:
            while self.pipe.poll(0):
                self._handle(self.pipe.recv())
        except (EOFError, OSError):
            if not self.stopping:
                log.info("worker %s: the supervisor is gone; finishing", self.spec.worker_id)
            self.stopping = True
            return False
        return True

    def _take_sigterm(self) -> None:
        self.stopping |= stop_on_sigterm(
            self.signals, self.pipe, self.spec.worker_id, self.stopping
        )

    # ---- the database ----

    def _recovering(self, exc: DatabaseError) -> Iterator[float]:
        """The one policy after a database error, for both loops: back off; if the connection
        is gone, connect again with the jittered backoff until connected or told to stop; then
        let the completer write its buffer, or forget it (those jobs run again). Yields each
        wait: the loop sleeps it its own way, waking for a Stop or a SIGTERM."""
        log.warning("worker %s database error: %s", self.spec.worker_id, exc)
        yield self.error_backoff.failed()
        if self.conn.closed or self.conn.broken:
            self.conn.close()
            while not self.stopping:
                try:
                    self.conn = self.connect()
                except DatabaseError as again:
                    delay = self.connect_backoff.failed()
                    log.info(
                        "worker %s cannot connect, next try in %.2f s: %s",
                        self.spec.worker_id, delay, again,
                    )  # fmt: skip
                    yield delay
                    continue
                self.connect_backoff.succeeded()
                log.info("worker %s reconnected", self.spec.worker_id)
                break
        self.completer.recover(self.conn)

    def _heartbeat_down(self) -> bool:
        """No claim while the heartbeat cannot reach the database: a job claimed then could
        not be kept alive, and the rescuer would take it from under its worker. The heartbeat
        thread reconnects with its backoff; the loop asks again after HEARTBEAT_DOWN_POLL."""
        if self.heartbeat.up:
            if self.waiting_heartbeat:
                self.waiting_heartbeat = False
                log.info("worker %s: heartbeat connection back: claiming", self.spec.worker_id)
            return False
        if not self.waiting_heartbeat:
            self.waiting_heartbeat = True
            log.warning(
                "worker %s: no heartbeat connection: no claim until it is back",
                self.spec.worker_id,
            )
        return True

    # ---- reporting, retiring and leaving ----

    def _set_title(self, what: str) -> None:
        title = f"pgq-worker[{self.spec.index}] {what}"
        if title != self.title:
            self.title = title
            setproctitle(title)

    def _measure_wake(self) -> None:
        """A claim found jobs: how long since the Wake that asked for it."""
        if self.woken_at is not None:
            self.latencies.append(self.clock() - self.woken_at)
            self.woken_at = None

    def _report(self) -> None:
        outcomes = self.completer.take_outcomes()
        latencies, self.latencies = self.latencies, []
        self.last_report = self.clock()
        steps = tally.take()
        if outcomes or latencies or steps:
            ended = ((o.job.type, o.kind, o.duration) for o in outcomes)
            self.pipe.send(Report.of(ended, latencies, steps))

    def _retire_if_due(self) -> None:
        """max_jobs_per_child or max_memory_per_child reached: say so, and stop."""
        if self.stopping:
            return
        reason = None
        if self.spec.max_jobs is not None and self.jobs_done >= self.spec.max_jobs:
            reason = (
                f"ran {plural(self.jobs_done, 'job')} (max_jobs_per_child={self.spec.max_jobs})"
            )
        elif self.spec.max_memory_mb is not None and (rss := rss_mb()) > self.spec.max_memory_mb:
            reason = f"RSS {rss:.0f} MiB > max_memory_per_child={self.spec.max_memory_mb} MiB"
        if reason:
            log.info("worker %s retiring: %s", self.spec.worker_id, reason)
            with contextlib.suppress(OSError):
                self.pipe.send(Retiring(reason))
            self.stopping = True

    def _exit(self) -> None:
        """Successes waiting for a claim that will not come are written now; then the last
        report, and the connections close."""
        try:
            self.completer.flush(self.conn)
        except DatabaseError as exc:
            n = self.completer.buffered
            log.warning(
                "could not write %s before exit: %s", plural(n, "success", "successes"), exc
            )
        # the supervisor may be gone; then nobody is left to report to
        with contextlib.suppress(OSError):
            self._report()
        self.heartbeat.stop()
        self.conn.close()
