"""What every child runs jobs with, whichever worker it is (sync.Worker,
inflight.InFlightWorker): its heartbeat, executor and completer, its connections, its
RSS. Both workers import it; it imports neither."""

from __future__ import annotations

import contextlib
import logging
import os
from multiprocessing.connection import Connection
from typing import Final

from pgq_supervisor import db
from pgq_supervisor.ipc import ChildSpec, Retiring
from pgq_supervisor.registry import Registry
from pgq_supervisor.signals import ChildSignals
from pgq_supervisor.worker.completion import Completer
from pgq_supervisor.worker.executor import Executor
from pgq_supervisor.worker.heartbeat import Heartbeat

log = logging.getLogger(__name__)

REPORT_EVERY: Final = 0.25


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


def connect_child(spec: ChildSpec, application_name: str) -> db.Conn:
    """A connection of the child (its job connection, its heartbeat's) as the spec says."""
    return db.connect(
        spec.dsn,
        application_name=application_name,
        synchronous_commit=spec.synchronous_commit,
        prepare_threshold=spec.prepare_threshold,
    )


def child_parts(spec: ChildSpec, registry: Registry) -> tuple[Heartbeat, Executor, Completer]:
    """What every child runs jobs with, whichever worker it is: the heartbeat (on its own
    connection), the executor and the completer."""
    heartbeat = Heartbeat(
        lambda: connect_child(spec, "pgq-heartbeat"),
        spec.schema,
        spec.heartbeat_interval,
        spec.worker_id,
    )
    # the heartbeat thread writes progress too: on its own connection, never inside a
    # `conn` handler's transaction
    executor = Executor(registry, spec.worker_id, progress=heartbeat.progress)
    completer = Completer(
        spec.schema, spec.worker_id, heartbeat=heartbeat, flush_every=REPORT_EVERY
    )
    return heartbeat, executor, completer
