"""A child's batch while it runs, shared by two threads, so no job waits behind a slow one.

    main thread (worker/sync.py)                pgq-heartbeat thread (heartbeat.py)
      load(batch) after a claim                    wakes at due(): the job in hand's start
      take(now) → the next job, or None              + release_after
      finish() → the rest, to release              cut(now) → the jobs not started, to release
                                                     (and it writes the batch's successes)

A claim takes a batch and the main thread runs it in order; every job of it is `running` in
the database from the claim on, and the successes of those it ran wait for the next claim to
be written. While one job runs long, the jobs behind it would wait with it, out of every other
worker's reach, and those before it would look unfinished. So once the job in hand has run
`release_after`, the heartbeat thread (its own connection) gives the rest back and writes the
buffered successes. One lock decides, job by job: a job is taken by the main thread or cut by
the heartbeat thread, never both.

The main thread pays a lock and a shared-memory write per job (`on_held`: the count the
supervisor shows as "claimed, not started"). The heartbeat thread is woken only when a batch
of several jobs arrives while it sleeps with nothing to watch; otherwise it looks again at each
due time. A batch of one needs no watching: a claim writes the successes before it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pgq_supervisor.jobs import Job


class Unstarted:
    def __init__(
        self, release_after: float, on_held: Callable[[int], None] = lambda n: None
    ) -> None:
        self.release_after = release_after
        self._on_held = on_held  # told the count of jobs held and not started, under the lock
        self._lock = threading.Lock()
        self._jobs: list[Job] = []
        self._next = 0  # the index of the next job to start
        self._end = 0  # jobs from here on were cut (or there are none)
        self._since = 0.0  # when the job in hand started (or the batch arrived): monotonic
        self._watched = False  # a batch of several jobs, not cut yet
        self._asleep = True  # the watcher found nothing to watch and waits to be woken
        self._wake: Callable[[], None] = lambda: None

    def watched_by(self, wake: Callable[[], None]) -> None:
        """The heartbeat thread watches: `wake` rouses it when a batch arrives while it sleeps."""
        self._wake = wake

    # ---- the main thread ----

    def load(self, jobs: list[Job], now: float) -> None:
        """A claim's batch, in the order to run it; the last one's jobs were all finished."""
        with self._lock:
            self._jobs = jobs
            self._next, self._end, self._since = 0, len(jobs), now
            self._on_held(len(jobs))
            self._watched = len(jobs) > 1
            wake = self._asleep and self._watched
            if wake:
                self._asleep = False
        if wake:
            self._wake()

    def take(self, now: float) -> Job | None:
        """The next job to start (it starts at `now`), or None: the batch is done, or cut."""
        with self._lock:
            i = self._next
            if i >= self._end:
                return None
            self._next, self._since = i + 1, now
            self._on_held(self._end - i - 1)
            return self._jobs[i]

    def finish(self) -> list[Job]:
        """The batch ends: its jobs neither started nor cut, for the caller to release."""
        with self._lock:
            rest = self._jobs[self._next : self._end]
            self._jobs, self._next, self._end = [], 0, 0
            self._watched = False
            self._on_held(0)
            return rest

    # ---- the watcher (the heartbeat thread) ----

    def due(self) -> float | None:
        """When the job in hand will have run `release_after` (monotonic), or None: no batch
        to watch, and the watcher sleeps until one arrives."""
        with self._lock:
            if not self._watched:
                self._asleep = True
                return None
            return self._since + self.release_after

    def cut(self, now: float) -> list[Job] | None:
        """If the job in hand has run `release_after` by `now`: the jobs not started (maybe
        none), which are the caller's to release from here on (the main thread skips them).
        None if it has not. Once cut, the batch is watched no more: it ends with that job."""
        with self._lock:
            if not self._watched or now < self._since + self.release_after:
                return None
            jobs = self._jobs[self._next : self._end]
            self._end = self._next
            self._watched = False
            self._on_held(0)
            return jobs
