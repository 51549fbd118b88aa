"""Reclaims jobs whose heartbeat went stale (a whole pod died, a child hung), and, within
seconds, the jobs of supervisors whose session lock was freed (their process died: schema/0016)
once their heartbeat has gone quiet too (`quiet`, 1.5 heartbeat intervals: a lock is also
freed when a living pod loses its LISTEN session, and its children still beat).

Staleness is judged by the database clock, so supervisors with skewed clocks agree. Safe with
many supervisors: the rescue statements skip rows another transaction holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pgq_supervisor import db
from pgq_supervisor.jobs import EndedAttempt, JobState

log = logging.getLogger(__name__)

# Seconds between looks for supervisors whose lock was freed: one read of the supervisor table
# and pg_locks, so a dead pod's jobs run again within a second or two.
LOOK_EVERY = 0.5


@dataclass(frozen=True, slots=True)
class RescueResult:
    ended: tuple[EndedAttempt, ...]  # each rescued job: pending again, or failed if out of tries


class Rescuer:
    def __init__(
        self, schema: str, dead_after: float, *, quiet: float = 1.5, limit: int = 1000
    ) -> None:
        """`quiet`: the heartbeat age past which a gone supervisor's job is taken back (1.5
        heartbeat intervals: a beat missed and the next one late; 1.5 for the default of 1 s)."""
        if dead_after <= 0 or quiet <= 0:
            raise ValueError("dead_after and quiet must be > 0")
        self.schema = schema
        self.dead_after = dead_after
        self.quiet = quiet
        self.limit = limit

    def run_once(self, conn: db.Conn) -> RescueResult:
        """One round on an autocommit connection: at most `limit` jobs. Raises DatabaseError."""
        ended = db.rescue(conn, self.schema, dead_after=self.dead_after, limit=self.limit)
        for e in ended:
            log.warning(
                "rescued job id=%s type=%s attempt=%d: no heartbeat for %g s -> %s",
                e.job_id,
                e.job_type,
                e.retry_count + (e.new_state is JobState.FAILED),
                self.dead_after,
                e.new_state.value,
            )
        return RescueResult(tuple(ended))

    def run_orphans(self, conn: db.Conn, me: str) -> RescueResult:
        """Reclaim the running jobs of the other supervisors whose lock is free, on an
        autocommit connection; `me`: this supervisor's id. Raises DatabaseError."""
        gone = db.supervisors_gone(conn, self.schema, me=me)
        if not gone:
            return RescueResult(())
        ended = db.rescue_orphans(conn, self.schema, gone, quiet=self.quiet)
        if ended:
            log.warning("supervisor(s) %s gone (session lock freed)", ", ".join(gone))
        else:  # its children still beat (or it has none running): judged again next look
            log.debug("supervisor(s) %s: session lock free, no quiet job", ", ".join(gone))
        for e in ended:
            log.warning(
                "rescued job id=%s type=%s attempt=%d: its supervisor is gone -> %s",
                e.job_id,
                e.job_type,
                e.retry_count + (e.new_state is JobState.FAILED),
                e.new_state.value,
            )
        return RescueResult(tuple(ended))
