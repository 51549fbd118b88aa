"""Progress a handler reports: checked and encoded at once, written later, throttled, fenced.

    handler ── job.report_progress(v) ──▶ encode (InvalidInput now, in the handler)
                                           └▶ sink.put(job, text)
    worker: sink = Heartbeat.progress (a ProgressBuffer), written by the heartbeat thread on
            its own connection: the job connection may be inside a `conn` handler's
            transaction, where a write would only show at commit
    testing: a Recorder, written at once on the caller's connection

A ProgressBuffer keeps the latest value per job and hands a job's value out at most once per
`min_interval`: reports in a tight loop cost one write each quarter second, and the last one
reported is written within `min_interval` (or superseded by the job's completion, after
which the fenced write lands nowhere). Every write names the job's lease.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from pgq_supervisor import db
from pgq_supervisor.errors import InvalidInput
from pgq_supervisor.jobs import PROGRESS_REPORTER, Job, JobId, JsonObject, JsonValue, LeaseToken

MAX_PROGRESS_BYTES = 8192
MIN_INTERVAL = 0.25

Write = tuple[JobId, LeaseToken, str]


def encode(value: object) -> str:
    """`value` as JSON text if it is a number in [0, 1] or a JSON object of at most
    MAX_PROGRESS_BYTES; else InvalidInput."""
    if isinstance(value, bool) or not isinstance(value, int | float | dict):
        raise InvalidInput(
            f"progress must be a number from 0 to 1 or a JSON object, not {type(value).__name__}"
        )
    if isinstance(value, int | float) and not (math.isfinite(value) and 0 <= value <= 1):
        raise InvalidInput(f"progress must be from 0 to 1, got {value!r}")
    text = db.dump_json(value, "progress")
    if len(text.encode()) > MAX_PROGRESS_BYTES:
        raise InvalidInput(
            f"progress is {len(text.encode())} bytes as JSON; at most {MAX_PROGRESS_BYTES}"
        )
    return text


class ProgressSink(Protocol):
    def put(self, job: Job, text: str) -> None: ...


@contextmanager
def reporting(sink: ProgressSink | None) -> Iterator[None]:
    """Bind `job.report_progress` to `sink` for the handler run inside (its thread only)."""
    if sink is None:
        yield
        return

    def report(job: Job, value: float | JsonObject) -> None:
        sink.put(job, encode(value))

    token = PROGRESS_REPORTER.set(report)
    try:
        yield
    finally:
        PROGRESS_REPORTER.reset(token)


class ProgressBuffer:
    """The latest unwritten value of each job, given out for writing at most once per
    `min_interval` per job. Thread-safe: handlers put, the writer thread takes."""

    def __init__(
        self,
        min_interval: float = MIN_INTERVAL,
        *,
        on_put: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_interval = min_interval
        self._on_put = on_put
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: dict[JobId, tuple[LeaseToken, str]] = {}
        self._written_at: dict[JobId, float] = {}

    def put(self, job: Job, text: str) -> None:
        with self._lock:
            new = job.id not in self._latest
            self._latest[job.id] = (job.lease, text)
        # A value already waiting has its write scheduled: waking the writer for every report
        # of a tight loop would only make it spin.
        if new and self._on_put is not None:
            self._on_put()

    def next_due(self) -> float | None:
        """Seconds until some value may be written (0: now), None if none is waiting."""
        with self._lock:
            if not self._latest:
                return None
            now = self._clock()
            return max(
                0.0,
                min(self._written_at.get(i, -math.inf) + self.min_interval for i in self._latest)
                - now,
            )

    def take_due(self) -> list[Write]:
        """The values that may be written now; each job's clock restarts from now."""
        with self._lock:
            now = self._clock()
            due = [
                (job_id, lease, text)
                for job_id, (lease, text) in self._latest.items()
                if now - self._written_at.get(job_id, -math.inf) >= self.min_interval
            ]
            for job_id, _, _ in due:
                del self._latest[job_id]
                self._written_at[job_id] = now
        return due

    def forget(self, ids: list[JobId]) -> None:
        """These jobs are settled: a value still waiting would be fenced out anyway."""
        with self._lock:
            for job_id in ids:
                self._latest.pop(job_id, None)
                self._written_at.pop(job_id, None)


def write_due(buffer: ProgressBuffer, conn: db.Conn, schema: str) -> set[JobId]:
    """Write what `buffer` says is due, fenced; returns the jobs written. A value the database
    refuses (a stale lease) is dropped: the job is someone else's now."""
    return db.set_progress(conn, schema, buffer.take_due())


class Recorder:
    """A sink for `pgq.testing`: every value, in order, per job; written at once, fenced, on
    `conn` when given (a `conn` handler's value then commits with it)."""

    def __init__(self, conn: db.Conn | None = None, schema: str = db.DEFAULT_SCHEMA) -> None:
        self.conn = conn
        self.schema = schema
        self.values: dict[JobId, list[JsonValue]] = {}

    def put(self, job: Job, text: str) -> None:
        value: JsonValue = json.loads(text)
        self.values.setdefault(job.id, []).append(value)
        if self.conn is not None:
            db.set_progress(self.conn, self.schema, [(job.id, job.lease, text)])
