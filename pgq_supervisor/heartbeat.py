"""The child's heartbeat thread: keeps `worker_alive_at` fresh on every job the child holds.

It has its own connection (cursors on one connection share one transaction, and the job
connection is busy running handlers). Every write is fenced by the lease. A heartbeat proves
that the process lives, not that the job progresses: job timeouts are the supervisor's.

The same thread writes the progress handlers report (progress.py): `progress` wakes it, and
it writes each job's latest value at most every quarter second, fenced by the lease too.

When a beat fails (the server restarted, say) the connection is dropped and the next beat
comes after a jittered backoff, from well under the interval up to it: the children of every
pod do not reconnect in lockstep, and none waits longer than a beat once the server is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pgq_supervisor import db
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.jobs import JobId, LeaseToken
from pgq_supervisor.progress import ProgressBuffer, write_due

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        connect: Callable[[], db.Conn],
        schema: str,
        interval: float,
        worker_id: str,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        self._connect = connect
        self._schema = schema
        self._interval = interval
        self._worker_id = worker_id
        self._lock = threading.Lock()
        self._held: dict[LeaseToken, set[JobId]] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()  # a progress report, or the stop
        self.progress = ProgressBuffer(on_put=self._wake.set)
        self._conn: db.Conn | None = None
        self._backoff = backoff or Backoff(initial=min(0.5, interval), maximum=interval)
        self._thread = threading.Thread(target=self._run, name="pgq-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=self._interval + 5)
        if self._conn is not None:
            self._conn.close()

    def hold(self, lease: LeaseToken, ids: list[JobId]) -> None:
        with self._lock:
            self._held.setdefault(lease, set()).update(ids)

    def drop(self, lease: LeaseToken, ids: list[JobId]) -> None:
        with self._lock:
            held = self._held.get(lease)
            if held is not None:
                held.difference_update(ids)
                if not held:
                    del self._held[lease]
        self.progress.forget(ids)

    def holding(self) -> int:
        """How many jobs are held (kept alive) now."""
        with self._lock:
            return sum(len(ids) for ids in self._held.values())

    def beat_once(self) -> int:
        """One round of fenced heartbeats; returns how many jobs are still held."""
        with self._lock:
            snapshot = {lease: list(ids) for lease, ids in self._held.items()}
        if not snapshot:
            return 0
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        alive = 0
        for lease, ids in snapshot.items():
            # A job whose row another transaction holds (this worker's own completion,
            # usually) is skipped rather than waited for, and comes back as kept: it stays
            # held, and is beaten next time if it was not settled after all.
            kept = db.heartbeat(self._conn, self._schema, ids, lease)
            alive += len(kept)
            lost = [i for i in ids if i not in kept]
            # Usually a race with the main thread, which completed these jobs between our
            # snapshot and this update; a real loss is reported by the fenced write that
            # fails, so this stays quiet.
            for job_id in lost:
                log.debug("heartbeat: job %s no longer held by %s", job_id, self._worker_id)
            self.drop(lease, lost)
        return alive

    def write_progress(self) -> int:
        """Write the progress values that are due (throttled, fenced); returns how many landed.
        A failed write drops its values: progress is a hint, the next report replaces it."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            return len(write_due(self.progress, self._conn, self._schema))
        except DatabaseError as exc:
            log.warning("progress write failed: %s", exc)
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return 0

    def tick(self) -> float:
        """One round of beats; returns the seconds until the next: the interval, or after a
        failure a backoff (the connection is made afresh then)."""
        try:
            self.beat_once()
        except DatabaseError as exc:
            delay = self._backoff.failed()
            log.warning("heartbeat failed, retrying in %.2f s: %s", delay, exc)
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return delay
        self._backoff.succeeded()
        return self._interval

    def _run(self) -> None:
        next_beat = time.monotonic() + self._interval
        while not self._stop.is_set():
            progress_in = self.progress.next_due()
            wait = next_beat - time.monotonic()
            if progress_in is not None:
                wait = min(wait, progress_in)
            self._wake.wait(max(0.0, wait))
            self._wake.clear()
            if self._stop.is_set():
                break
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.tick()
            if self.progress.next_due() == 0.0:
                self.write_progress()
