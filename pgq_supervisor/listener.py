"""Owns the supervisor's single LISTEN connection; reconnects with backoff.

Notifications are hints: after every (re)LISTEN the supervisor wakes every child, because
whatever was sent while we were not listening is lost; a jittered poll backs them up too.
"""

from __future__ import annotations

import logging

import psycopg

from pgq_supervisor import db
from pgq_supervisor.errors import DatabaseError

log = logging.getLogger(__name__)

CHANNEL = "pgq_job_available"


class Listener:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: db.Conn | None = None
        self._retry_at = 0.0
        self._delay = 0.25
        self.connected_since: float | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def fileno(self) -> int | None:
        return self._conn.fileno() if self.connected and self._conn is not None else None

    def connect(self, now: float) -> bool:
        """Try to (re)connect and LISTEN unless backing off. True if it just (re)connected."""
        if self.connected or now < self._retry_at:
            return False
        try:
            conn = db.connect(self._dsn, application_name="pgq-supervisor-listen")
            with db.wrapped():
                conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(CHANNEL)))
        except DatabaseError as exc:
            self._retry_at = now + self._delay
            log.warning("LISTEN connection failed, retrying in %.1f s: %s", self._delay, exc)
            self._delay = min(self._delay * 2, 5.0)
            return False
        self._conn = conn
        self._delay = 0.25
        self.connected_since = now
        log.info("listening on %s", CHANNEL)
        return True

    def read(self) -> list[str]:
        """Payloads (job types) of notifications that arrived. Drops the connection on error."""
        if self._conn is None:
            return []
        pgconn = self._conn.pgconn
        out: list[str] = []
        try:
            pgconn.consume_input()
            while (n := pgconn.notifies()) is not None:
                out.append(n.extra.decode("utf-8", "replace"))
        except psycopg.Error as exc:
            log.warning("LISTEN connection lost: %s", exc)
            self.close()
        return out

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self.connected_since = None
