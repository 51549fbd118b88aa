"""What a dead child leaves behind, settled by the supervisor on its control connection.

The job in hand (the child's shared slot names it, its attempt and its type) ends as a failed
attempt: a timeout when the supervisor killed the child for that job, a worker death otherwise.
Its retry delay comes from the handler of the slot's type, so learning it costs no query. The
jobs the child had claimed but not started go back without consuming an attempt, and so does
the job in hand of a child killed for shutdown: that was not the job's fault. A child killed
because its job was cancelled ends no attempt at all: the cancel ended that job already (a
fenced end_attempt would change nothing), and whatever else it held is released.

A child with many jobs in flight (inflight.py) names them all in its slot. When it is killed
for one of them (a timeout, a cancel), that one is settled as above and the others go back
without an attempt. When it dies by itself (SIGKILL, OOM, a segfault) holding several, nobody
can tell which one killed it, so none of them is charged: all go back without an attempt, and
each is marked to run alone (`Settled.run_alone`; the supervisor tells its children, RunAlone)
before a death counts against it. A job that kills its child every time so dies alone the
next time, and that death is charged as a worker death: after its attempts it ends `failed`,
while its neighbours, run alone once, succeed.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from pgq_supervisor import db
from pgq_supervisor.ipc import SlotView
from pgq_supervisor.jobs import AttemptKind, EndedAttempt, JobId, JobState
from pgq_supervisor.registry import Registry
from pgq_supervisor.supervisor.children import CANCELLED, SHUTDOWN, Child
from pgq_supervisor.supervisor.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Settled:
    ended: tuple[EndedAttempt, ...]  # the job in hand, if its attempt counted
    released: tuple[JobId, ...]  # back to pending, attempt not consumed
    run_alone: tuple[JobId, ...] = ()  # released from a death that held several: run alone


@dataclass(frozen=True, slots=True)
class Deaths:
    schema: str
    registry: Registry
    metrics: Metrics
    rng: random.Random

    def settle(self, conn: db.Conn, child: Child, how: str) -> Settled:
        """Settle the jobs of `child`, which exited (`how`: 'SIGKILL', 'exit code 1', ...).
        Raises DatabaseError; whatever it could not settle the rescuer reclaims later."""
        return settle(conn, self.schema, child, how, self.registry, self.metrics, self.rng)


def settle(
    conn: db.Conn,
    schema: str,
    child: Child,
    how: str,
    registry: Registry,
    metrics: Metrics,
    rng: random.Random,
) -> Settled:
    in_hand = child.current_jobs()
    current = in_hand[0] if len(in_hand) == 1 else None
    if child.kill_job is not None:
        # killed for that job: it alone is settled as killed (if it is still in hand; if not,
        # it ended first and the death is no job's fault)
        current = next((v for v in in_hand if v.job_id == child.kill_job), None)
    shared = shared_death(child, in_hand)
    if shared:
        log.warning(
            "child %d died (%s) holding %d jobs: none is charged; each runs alone next",
            child.spec.index,
            how,
            len(shared),
        )
    ended: list[EndedAttempt] = []
    if current is not None and child.kill_reason == CANCELLED:
        log.info(
            "job cancelled id=%s type=%s attempt=%d worker=%s: child %d stopped (%s)",
            current.job_id,
            current.job_type,
            current.attempt,
            child.worker_id,
            child.spec.index,
            how,
        )
    elif current is not None and child.kill_reason != SHUTDOWN:
        kind = AttemptKind.TIMEOUT if child.kill_reason else AttemptKind.WORKER_DEATH
        error = child.kill_reason or f"worker died: {how}"
        ended = db.end_attempt(
            conn,
            schema,
            [current.job_id],
            worker_id=child.worker_id,
            error=error,
            kind=kind,
            delay=retry_delay(current, registry, rng),
        )
        counter = metrics.timeouts if kind is AttemptKind.TIMEOUT else metrics.deaths
        for e in ended:
            counter.labels(e.job_type).inc()
            log.warning(
                "job %s id=%s type=%s attempt=%d worker=%s error=%s",
                "retry" if e.new_state is JobState.PENDING else "failed",
                e.job_id,
                e.job_type,
                current.attempt,
                child.worker_id,
                error,
            )
    released = db.release(conn, schema, worker_id=child.worker_id)
    if released:
        log.info("released %d jobs of child %d", len(released), child.spec.index)
    return Settled(tuple(ended), tuple(released), shared)


def shared_death(child: Child, in_hand: list[SlotView] | None = None) -> tuple[JobId, ...]:
    """The jobs of a child that died by itself holding several: released uncharged, to run
    alone next. Empty for a kill (timeout, cancel, shutdown) or a death holding one job."""
    if child.kill_reason is not None or child.kill_job is not None:
        return ()
    views = child.current_jobs() if in_hand is None else in_hand
    return tuple(v.job_id for v in views) if len(views) > 1 else ()


def retry_delay(job: SlotView, registry: Registry, rng: random.Random) -> float:
    """The retry delay of the job a child died holding, by the handler of its type."""
    if job.job_type is None:
        return 0.0
    return registry.policy(job.job_type).retry_delay(job.attempt, rng)
