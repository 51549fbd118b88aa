"""The child's heartbeat thread: keeps every job the child holds alive, by one row of its own.

Each beat makes the child's row in `worker` fresh (schema/0025: a running job is alive while
its claim's stamp or its owner's row is younger than dead_after), and reads back which of the
jobs it holds still run under their lease; no job row is written (but while a supervisor of an
older version is registered, which judges jobs by their own worker_alive_at). It has its own
connection (cursors on one connection share one transaction, and the job connection is busy
running handlers). Every write is fenced by the lease. A heartbeat proves
that the process lives, not that the job progresses: job timeouts are the supervisor's.

The same thread writes the progress handlers report (progress.py): `progress` wakes it, and
it writes each job's latest value at most every quarter second, fenced by the lease too.

When the job in hand has run `release_after` (`watch`, unstarted.py), it gives back the claimed
jobs its child has not started (a release fenced by lease and ids, which notifies, so an idle
sibling claims them), and writes the successes its child buffered before that job (the
completer's flush, on this connection). A release that fails is tried again at the next
wake-up, the jobs held (heart-beaten) until it lands; successes not written stay buffered.

When a beat fails (the server restarted, say) the connection is dropped and the next beat
comes after a jittered backoff, from well under the interval up to it: the children of every
pod do not reconnect in lockstep, and none waits longer than a beat once the server is back.
It is made again even while no job is held: the child claims only while the heartbeat is `up`
(a job claimed with no way to keep it alive would be rescued from under its worker).

A job held that no beat could reach for `give_up_after` (a safe part of dead_after: the child
gets it from the supervisor) is given up: `on_give_up` asks the supervisor to stop the child
and release its jobs without an attempt, before the rescuer would take them and charge one
while the worker runs on, its work to be thrown away (issue 27).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from pgq_supervisor import db
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.display import plural
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.jobs import Job, JobId, LeaseToken
from pgq_supervisor.worker.progress import ProgressBuffer, write_due
from pgq_supervisor.worker.unstarted import Unstarted

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
        conn: db.Conn | None = None,
        give_up_after: float | None = None,
        on_give_up: Callable[[], None] = lambda: None,
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
        self._conn: db.Conn | None = conn  # opened at boot, with the job connection
        # when each claim's jobs were last known alive in the database (claimed, or beaten),
        # by time.monotonic: what the rescuer will judge them by
        self._fresh: dict[LeaseToken, float] = {}
        self._give_up_after = give_up_after
        self._on_give_up = on_give_up
        self.given_up = False
        self.up = True  # the last beat, or connecting, did not fail
        self._backoff = backoff or Backoff(initial=min(0.5, interval), maximum=interval)
        self._thread = threading.Thread(target=self._run, name="pgq-heartbeat", daemon=True)
        self._unstarted: Unstarted | None = None
        self._flush: Callable[[db.Conn], None] = lambda conn: None
        self._unreleased: list[Job] = []  # cut, but their release failed: tried again
        self._handed: list[Job] = []  # the main thread's failed releases (under _lock)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=self._interval + 5)
        if (self._unreleased or self._handed) and not self._thread.is_alive():
            # a last try: what stays held now is left to the rescuer, which charges an attempt
            try:
                self._release(self._take_handed())
            except Exception:
                log.exception("could not release claimed jobs at exit")
        if self._conn is not None and not self._conn.closed:
            try:  # it beats no more: its row goes (one killed first is swept within the hour)
                db.worker_gone(self._conn, self._schema, self._worker_id)
            except DatabaseError as exc:
                log.debug("could not delete the worker row of %s: %s", self._worker_id, exc)
            self._conn.close()

    def release_later(self, jobs: Sequence[Job]) -> None:
        """Claimed jobs the main thread could not release (a database error): kept alive here
        and released from this thread, instead of going stale and being charged by the rescuer."""
        with self._lock:
            self._handed.extend(jobs)
        self._wake.set()

    def _take_handed(self) -> list[Job]:
        with self._lock:
            handed, self._handed = self._handed, []
        return self._unreleased + handed

    def hold(self, lease: LeaseToken, ids: list[JobId]) -> None:
        with self._lock:
            self._held.setdefault(lease, set()).update(ids)
            self._fresh.setdefault(lease, time.monotonic())  # the claim stamped them

    def drop(self, lease: LeaseToken, ids: list[JobId]) -> None:
        with self._lock:
            held = self._held.get(lease)
            if held is not None:
                held.difference_update(ids)
                if not held:
                    del self._held[lease]
                    self._fresh.pop(lease, None)
        self.progress.forget(ids)

    def holding(self) -> int:
        """How many jobs are held (kept alive) now."""
        with self._lock:
            return sum(len(ids) for ids in self._held.values())

    def watch(self, unstarted: Unstarted, flush: Callable[[db.Conn], None]) -> None:
        """When the job in hand has run long: release `unstarted`'s jobs, and `flush` (the
        completer's, thread-safe) the successes buffered before it. Call before start()."""
        self._unstarted = unstarted
        self._flush = flush
        unstarted.watched_by(self._wake.set)

    def _release_in(self) -> float | None:
        """Seconds until the job in hand will have run long (None: no batch to watch)."""
        if self._unstarted is None:
            return None
        due = self._unstarted.due()
        return None if due is None else max(0.0, due - time.monotonic())

    def release_unstarted(self) -> int:
        """If the job in hand has run long: release the jobs not started and write the
        successes buffered before it; and retry any release that failed before. Returns how
        many jobs went back."""
        cut = None if self._unstarted is None else self._unstarted.cut(time.monotonic())
        jobs = self._take_handed() + (cut or [])
        released = self._release(jobs) if jobs else 0
        if cut is not None:
            try:
                self._flush(self._connection())
            except DatabaseError as exc:  # still buffered: the main thread writes them
                log.warning("could not write buffered successes: %s", exc)
                self._disconnect()
        return released

    def _release(self, jobs: list[Job]) -> int:
        """Release `jobs` (fenced by lease and ids); those that fail stay held, to retry."""
        by_lease: dict[LeaseToken, list[JobId]] = {}
        for job in jobs:
            by_lease.setdefault(job.lease, []).append(job.id)
        released = 0
        try:
            for lease, ids in by_lease.items():
                db.release(self._connection(), self._schema, ids=ids, lease=lease)
                self.drop(lease, ids)
                released += len(ids)
        except DatabaseError as exc:
            log.warning("could not release %s claimed, retrying: %s", plural(len(jobs), "job"), exc)
            self._disconnect()
        # what did not go back is still held (a job the beat found lost was dropped there)
        self._unreleased = [j for j in jobs if self._holds(j)]
        if released:
            log.debug(
                "released %s claimed, not started: the job in hand runs long",
                plural(released, "job"),
            )
        return released

    def _connection(self) -> db.Conn:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self.up = False

    def stale_for(self, now: float) -> float:
        """Seconds since the held job known alive the longest ago was last beaten (0: none
        held)."""
        with self._lock:
            oldest = min(self._fresh.values(), default=now)
        return now - oldest

    def _give_up_in(self) -> float | None:
        """Seconds until the held jobs must be given up, if no beat lands (None: never)."""
        if self._give_up_after is None or self.given_up:
            return None
        with self._lock:
            if not self._fresh:
                return None
            oldest = min(self._fresh.values())
        return max(0.0, oldest + self._give_up_after - time.monotonic())

    def _give_up_if_due(self) -> None:
        if self._give_up_in() != 0.0:
            return
        self.given_up = True
        log.warning(
            "worker %s: no heartbeat has reached the database for %.1f s: giving up %s"
            " before they are rescued",
            self._worker_id, self.stale_for(time.monotonic()), plural(self.holding(), "job"),
        )  # fmt: skip
        self._on_give_up()

    def _holds(self, job: Job) -> bool:
        with self._lock:
            return job.id in self._held.get(job.lease, ())

    def beat_once(self) -> int:
        """One heartbeat (fenced by the leases held); returns how many jobs are still held."""
        if self._conn is None or self._conn.closed:
            self.up = False
            self._conn = self._connect()  # even with nothing held: claims wait for it
        with self._lock:
            snapshot = {lease: list(ids) for lease, ids in self._held.items()}
        sent = time.monotonic()
        # One statement for every lease held: the child's own row in `worker` is made fresh,
        # which keeps all its jobs alive (schema/0025), and the jobs still running under their
        # lease come back.
        kept = db.beat(self._conn, self._schema, snapshot) if snapshot else {}
        alive = 0
        for lease, ids in snapshot.items():
            still = kept.get(lease, set())
            alive += len(still)
            lost = [i for i in ids if i not in still]
            # Usually a race with the main thread, which completed these jobs between our
            # snapshot and the beat; a real loss is reported by the fenced write that fails,
            # so this stays quiet.
            for job_id in lost:
                log.debug("heartbeat: job %s no longer held by %s", job_id, self._worker_id)
            self.drop(lease, lost)
            with self._lock:
                if lease in self._fresh:
                    self._fresh[lease] = sent
        self.up = True
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
            self._disconnect()
            return 0

    def tick(self) -> float:
        """One round of beats; returns the seconds until the next: the interval, or after a
        failure a backoff (the connection is made afresh then)."""
        try:
            self.beat_once()
        except DatabaseError as exc:
            delay = self._backoff.failed()
            log.warning("heartbeat failed, retrying in %.2f s: %s", delay, exc)
            self._disconnect()
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
            for due_in in (self._release_in(), self._give_up_in()):
                if due_in is not None:
                    wait = min(wait, due_in)
            self._wake.wait(max(0.0, wait))
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.tick()
                if self.progress.next_due() == 0.0:
                    self.write_progress()
                if self._unreleased or self._handed or self._release_in() == 0.0:
                    self.release_unstarted()
                self._give_up_if_due()
            except Exception:  # a bug, or an error that is not a DatabaseError: keep beating
                # A thread that died here would let every held job go stale: the rescuer
                # would charge them all, the one in hand too. Start afresh after a backoff.
                log.exception("heartbeat thread error; carrying on")
                self._disconnect()
                next_beat = time.monotonic() + self._backoff.failed()
