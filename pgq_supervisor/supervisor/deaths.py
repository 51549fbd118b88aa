"""A dead child's Verdict (verdicts.py), written by the supervisor on its control connection:
the charged attempt ends (a timeout or a worker death, fenced by the child's worker id), and
everything else the child held goes back to pending without consuming an attempt. What it
means was decided by `verdicts.judge`; this only runs the statements and logs what they did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pgq_supervisor import db
from pgq_supervisor.display import plural
from pgq_supervisor.jobs import AttemptKind, EndedAttempt, JobId, JobState
from pgq_supervisor.supervisor.metrics import Metrics
from pgq_supervisor.supervisor.verdicts import Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Settled:
    ended: tuple[EndedAttempt, ...]  # the charged attempt, if it was still running
    released: tuple[JobId, ...]  # back to pending, attempt not consumed


def settle(
    conn: db.Conn, schema: str, worker_id: str, verdict: Verdict, metrics: Metrics
) -> Settled:
    """Write `verdict` for the dead child `worker_id`. Raises DatabaseError; whatever it could
    not settle the rescuer reclaims later."""
    ended: list[EndedAttempt] = []
    charge = verdict.charge
    if charge is not None:
        ended = db.end_attempt(
            conn,
            schema,
            [charge.job.job_id],
            worker_id=worker_id,
            error=charge.error,
            kind=charge.kind,
            delay=charge.delay,
        )
        counter = metrics.timeouts if charge.kind is AttemptKind.TIMEOUT else metrics.deaths
        for e in ended:
            counter.labels(e.job_type).inc()
            log.warning(
                "job %s id=%s type=%s attempt=%d worker=%s error=%s",
                "retry" if e.new_state is JobState.PENDING else "failed",
                e.job_id,
                e.job_type,
                charge.job.attempt,
                worker_id,
                charge.error,
            )
    released = db.release(conn, schema, worker_id=worker_id)
    if released:
        log.info("released %s of worker %s", plural(len(released), "job"), worker_id)
    return Settled(tuple(ended), tuple(released))
