"""Owns the supervisor's single LISTEN connection; reconnects with backoff.

It listens on three channels: pgq_job_available (a job type has work: wake a child),
pgq_job_due (a job type has a delayed job coming due: wake a child then; schema/0026) and
pgq_job_cancel (a running job was cancelled: stop the child that holds it). Notifications are
hints: after every (re)LISTEN the supervisor wakes every child, because whatever was sent while
we were not listening is lost; a jittered poll backs up both channels.

The same session holds the supervisor's lock (schema/0016), whose release tells the other
supervisors at once that this one died. It is this connection's because LISTEN already needs a
real session (behind PgBouncer in transaction mode it goes to PostgreSQL directly, `listen_dsn`)
and because its loss is seen at once (the selector), and it reconnects on the next loop turn.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from pgq_supervisor import db
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.errors import DatabaseError

log = logging.getLogger(__name__)

AVAILABLE = "pgq_job_available"  # payload: a job type
DUE = "pgq_job_due"  # payload: "<seconds until due> <job type>" (parse_due)
CANCEL = "pgq_job_cancel"  # payload: {"job_id": ..., "worker_id": ...} (see cancels.py)
CHANNELS = (AVAILABLE, DUE, CANCEL)
LOCK_RETRY = 1.0  # seconds between tries of a lock an earlier session still holds


def parse_due(payload: str) -> tuple[float, str] | None:
    """(seconds until due, type) of a pgq_job_due payload; None for one that is not (anyone
    may NOTIFY: a bad one is dropped, and a good one can only bring a wake-up forward)."""
    seconds, sep, type_ = payload.partition(" ")
    try:
        delay = float(seconds)
    except ValueError:
        return None
    if not sep or not type_ or not math.isfinite(delay):
        return None
    return max(0.0, delay), type_


@dataclass(frozen=True, slots=True)
class Notification:
    channel: str
    payload: str


class Listener:
    def __init__(
        self,
        dsn: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        prepare_threshold: int | None = db.PREPARE_THRESHOLD,
        lock: tuple[str, str] | None = None,
    ) -> None:
        """`lock`: (schema, supervisor id) of the session lock to hold; None holds none."""
        self._dsn = dsn
        self._prepare_threshold = prepare_threshold
        self._conn: db.Conn | None = None
        self._clock = clock
        self.backoff = Backoff(initial=0.25, maximum=5.0, clock=clock, rng=rng)
        self._lock = lock
        self.locked_on: str | None = None  # the server epoch this session holds the lock in
        self._lock_tried_at = -float("inf")

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def fileno(self) -> int | None:
        return self._conn.fileno() if self.connected and self._conn is not None else None

    def connect(self) -> bool:
        """Try to (re)connect and LISTEN unless backing off. True if it just (re)connected.
        Connected already, it tries again for a lock an earlier session held (hold_lock)."""
        if self.connected:
            self.hold_lock()
            return False
        if not self.backoff.ready():
            return False
        try:
            conn = db.connect(
                self._dsn,
                application_name="pgq-supervisor-listen",
                prepare_threshold=self._prepare_threshold,
            )
            for channel in CHANNELS:
                db.listen(conn, channel)
        except DatabaseError as exc:
            delay = self.backoff.failed()
            log.warning("LISTEN connection failed, retrying in %.1f s: %s", delay, exc)
            return False
        self._conn = conn
        self.backoff.succeeded()
        log.info("listening on %s", ", ".join(CHANNELS))
        self._lock_tried_at = -float("inf")
        self.hold_lock()
        return True

    def hold_lock(self) -> None:
        """Take the session lock if it is wanted and not held yet, at most once a second: the
        session of a connection that broke may still hold it until the server notices."""
        if self._lock is None or self.locked_on or self._conn is None or self._conn.closed:
            return
        now = self._clock()
        if now - self._lock_tried_at < LOCK_RETRY:
            return
        first = self._lock_tried_at == -float("inf")
        self._lock_tried_at = now
        schema, id_ = self._lock
        try:
            self.locked_on = db.take_supervisor_lock(self._conn, schema, id_)
        except DatabaseError as exc:
            # not closed here: the supervisor's selector watches this socket, and a broken
            # one shows up there as readable (read() then closes it and the loop unregisters it)
            log.warning("could not take the supervisor lock: %s", exc)
            return
        if self.locked_on is None and first:
            # until it is free this supervisor's row says it holds no lock: its jobs are left
            # to the heartbeat timeout, as before the lock existed
            log.warning("supervisor lock still held by an earlier session; trying each second")

    def stop_listening(self) -> None:
        """UNLISTEN but keep the session, and so the lock, while the children drain."""
        if self._conn is None:
            return
        try:
            for channel in CHANNELS:
                db.unlisten(self._conn, channel)
        except DatabaseError:
            self.close()

    def read(self) -> list[Notification]:
        """The notifications that arrived, in order. Drops the connection on error."""
        if self._conn is None:
            return []
        pgconn = self._conn.pgconn
        out: list[Notification] = []
        try:
            pgconn.consume_input()
            while (n := pgconn.notifies()) is not None:
                out.append(
                    Notification(
                        n.relname.decode("utf-8", "replace"), n.extra.decode("utf-8", "replace")
                    )
                )
        except psycopg.Error as exc:
            log.warning("LISTEN connection lost: %s", exc)
            self.close()
        return out

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self.locked_on = None
