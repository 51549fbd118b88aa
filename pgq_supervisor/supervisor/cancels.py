"""Which children hold a job that was cancelled while running, so the loop can stop them.

The cancel itself already happened in the database (the `cancel` statement): the job is
`cancelled` and its worker fenced out, so nothing a child does with it can land any more.
What is left is freeing the child. Two paths mark a child's job as cancelled:

- pgq_job_cancel names the job and the worker that held it: the child with that worker id
  (or, failing that, the one whose slot shows the job) is marked at once;
- a poll on the control connection asks which of the jobs in the children's slots are
  cancelled, so a lost notification still stops the child within a poll interval.

The loop then stops a marked child when the marked job is in its slot
(Child.cancelled_in_hand): a job claimed but not started is stopped when it starts. A sync
handler cannot be interrupted inside its process, so the child is killed and respawned
(Child.stop_cancelled); an async job of a child with many in flight is instead cancelled by
the child, told so (CancelJob).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from pgq_supervisor import db
from pgq_supervisor.jobs import JobId
from pgq_supervisor.supervisor.children import Child, ChildState
from pgq_supervisor.supervisor.maintenance import ControlConnection

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CancelRequest:
    job_id: JobId
    worker_id: str | None


def parse(payload: str) -> CancelRequest | None:
    """A pgq_job_cancel payload, or None (logged) if it is not one."""
    try:
        data = json.loads(payload)
        job_id = JobId(uuid.UUID(str(data["job_id"])))
        worker = data.get("worker_id")
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("ignored a malformed pgq_job_cancel notification: %.200s", payload)
        return None
    return CancelRequest(job_id, worker if isinstance(worker, str) else None)


def _stoppable(child: Child) -> bool:
    return child.state not in (ChildState.TERMINATING, ChildState.KILLED)


def mark(children: Iterable[Child], request: CancelRequest) -> Child | None:
    """Mark the job on the child that holds it; returns that child (None: not one of ours)."""
    candidates = [c for c in children if _stoppable(c)]
    for child in candidates:
        if child.worker_id == request.worker_id:
            child.cancelled.add(request.job_id)
            return child
    for child in candidates:
        if any(view.job_id == request.job_id for view in child.current_jobs()):
            child.cancelled.add(request.job_id)
            return child
    return None


def jobs_in_hand(children: Iterable[Child]) -> dict[JobId, Child]:
    """The jobs in each stoppable child's slot: what the poll asks the database about."""
    held: dict[JobId, Child] = {}
    for child in children:
        if _stoppable(child):
            for view in child.current_jobs():
                held[view.job_id] = child
    return held


def poll(control: ControlConnection, schema: str, children: Iterable[Child]) -> None:
    """The poll behind pgq_job_cancel (a timer): mark the jobs in hand that were cancelled.
    Asks nothing while no child holds a job."""
    held = jobs_in_hand(children)
    if held:
        found = control.run(lambda conn: db.cancelled_among(conn, schema, list(held)))
        mark_found(held, found)


def mark_found(held: dict[JobId, Child], cancelled: Iterable[JobId]) -> None:
    """Mark the jobs the poll found cancelled on the children that held them."""
    for job_id in cancelled:
        child = held.get(job_id)
        if child is not None and job_id not in child.cancelled:
            log.info("job id=%s was cancelled (found by the poll)", job_id)
            child.cancelled.add(job_id)
