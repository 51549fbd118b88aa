"""Owns the supervisor's single LISTEN connection; reconnects with backoff.

It listens on two channels: pgq_job_available (a job type has work: wake a child) and
pgq_job_cancel (a running job was cancelled: stop the child that holds it). Notifications are
hints: after every (re)LISTEN the supervisor wakes every child, because whatever was sent while
we were not listening is lost; a jittered poll backs up both channels.
"""

from __future__ import annotations

import logging
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
CANCEL = "pgq_job_cancel"  # payload: {"job_id": ..., "worker_id": ...} (see cancels.py)
CHANNELS = (AVAILABLE, CANCEL)


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
    ) -> None:
        self._dsn = dsn
        self._prepare_threshold = prepare_threshold
        self._conn: db.Conn | None = None
        self.backoff = Backoff(initial=0.25, maximum=5.0, clock=clock, rng=rng)

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def fileno(self) -> int | None:
        return self._conn.fileno() if self.connected and self._conn is not None else None

    def connect(self) -> bool:
        """Try to (re)connect and LISTEN unless backing off. True if it just (re)connected."""
        if self.connected or not self.backoff.ready():
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
        return True

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
