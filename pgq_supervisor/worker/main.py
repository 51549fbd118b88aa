"""A child's entry point: load the app, open its job and heartbeat connections (both or
neither, retrying), then run the one-at-a-time
Worker (sync.py) or, with concurrency > 1 or async handlers, the InFlightWorker
(inflight.py). See the package docstring for the child as a whole."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import signal
import sys
from multiprocessing.connection import Connection

from setproctitle import getproctitle, setproctitle

from pgq_supervisor import db
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.errors import AppLoadError, DatabaseError, ExitCode
from pgq_supervisor.ipc import BootFailed, ChildSpec, JobSlot
from pgq_supervisor.logs import setup_logging
from pgq_supervisor.registry import load_registry
from pgq_supervisor.signals import ChildSignals
from pgq_supervisor.worker.base import HEARTBEAT_APP
from pgq_supervisor.worker.inflight import InFlightWorker, uses_loop
from pgq_supervisor.worker.sync import Worker


def child_main(spec: ChildSpec, pipe: Connection, slot: JobSlot) -> None:
    """Entry point of a spawned child. Exits 0 when told to stop, or CHILD_BOOT_FAILURE."""
    getproctitle()  # first: see cli.main
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signals = ChildSignals(slot)  # before booting: a SIGTERM while it boots is a stop too
    signals.install()
    setup_logging(spec.log_level, spec.log_format, hide=[spec.dsn])
    setproctitle(f"pgq-worker[{spec.index}] booting")
    try:
        registry = load_registry(spec.app)
    except AppLoadError as exc:
        pipe.send(BootFailed(str(exc), app_error=True))
        sys.exit(ExitCode.CHILD_BOOT_FAILURE)
    try:
        conn, heartbeat_conn = connect_retrying(
            spec.dsn,
            spec.connect_timeout,
            spec.synchronous_commit,
            prepare_threshold=spec.prepare_threshold,
        )
    except DatabaseError as exc:
        pipe.send(BootFailed(str(exc), app_error=False))
        sys.exit(ExitCode.CHILD_BOOT_FAILURE)
    _trim_heap()

    worker = InFlightWorker if uses_loop(spec, registry) else Worker
    worker(spec, registry, pipe, slot, conn, signals=signals, heartbeat_conn=heartbeat_conn).run()
    sys.exit(0)


def _trim_heap() -> None:
    """Give the memory that booting freed (imports, validation set-up) back to the system, so
    an idle child costs less; glibc keeps it otherwise."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def connect_retrying(
    dsn: str,
    timeout: float,
    synchronous_commit: bool,
    *,
    prepare_threshold: int | None = db.PREPARE_THRESHOLD,
) -> tuple[db.Conn, db.Conn]:
    """The job connection and the heartbeat's, retrying with a jittered backoff for up to
    `timeout` seconds. Both or neither: a child that could claim jobs but not keep them alive
    would see them rescued from under it, and one that holds a connection while it waits for
    the other takes a slot the application may need."""

    def both() -> tuple[db.Conn, db.Conn]:
        def one(name: str) -> db.Conn:
            return db.connect(
                dsn,
                application_name=name,
                synchronous_commit=synchronous_commit,
                prepare_threshold=prepare_threshold,
            )

        conn = one("pgq-worker")
        try:
            return conn, one(HEARTBEAT_APP)
        except DatabaseError:
            conn.close()
            raise

    backoff = Backoff(initial=0.1, maximum=2.0)
    return backoff.retry(both, retry_on=DatabaseError, deadline=backoff.clock() + timeout)
