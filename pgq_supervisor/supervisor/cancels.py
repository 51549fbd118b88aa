"""Which children hold a job that was cancelled while running, so the loop can stop them.

The cancel itself already happened in the database (the `cancel` statement): the job is
`cancelled` and its worker fenced out, so nothing a child does with it can land any more.
What is left is freeing the child. Two paths mark a child's job as cancelled:

- pgq_job_cancel names the job and the worker that held it: the child with that worker id
  (or, failing that, the one whose slot shows the job) is marked once the control connection
  has read that the job is cancelled (`confirm`). Any role that may connect can NOTIFY on any
  channel, so a notification is only a hint: one for a job the database does not show
  cancelled is ignored (logged at debug), and nothing is stopped on its word;
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
from collections.abc import Iterable
from dataclasses import dataclass

from pgq_supervisor import db, ids
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.jobs import JobId
from pgq_supervisor.supervisor.children import Child, ChildState
from pgq_supervisor.supervisor.maintenance import ControlConnection, ControlDown

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CancelRequest:
    job_id: JobId
    worker_id: str | None


def parse(payload: str) -> CancelRequest | None:
    """A pgq_job_cancel payload, or None (logged) if it is not one."""
    try:
        data = json.loads(payload)
        job_id = ids.job_id(data["job_id"])
        worker = data.get("worker_id")
    except (ValueError, KeyError, TypeError, AttributeError):
        log.debug("ignored a malformed pgq_job_cancel notification: %.200r", payload)
        return None
    return CancelRequest(job_id, worker if isinstance(worker, str) else None)


def _stoppable(child: Child) -> bool:
    return child.state not in (ChildState.TERMINATING, ChildState.KILLED)


def holder(children: Iterable[Child], request: CancelRequest) -> Child | None:
    """The child a request names: by its worker id, else by the job in its slot (None: not one
    of ours)."""
    candidates = [c for c in children if _stoppable(c)]
    for child in candidates:
        if child.worker_id == request.worker_id:
            return child
    for child in candidates:
        if any(view.job_id == request.job_id for view in child.current_jobs()):
            return child
    return None


def mark(children: Iterable[Child], request: CancelRequest) -> Child | None:
    """Mark the job on the child that holds it; returns that child (None: not one of ours).
    The caller has read in the database that the job is cancelled (`confirm`)."""
    child = holder(children, request)
    if child is not None:
        child.cancelled.add(request.job_id)
    return child


def confirm(
    control: ControlConnection,
    schema: str,
    children: Iterable[Child],
    requests: Iterable[CancelRequest],
) -> bool:
    """Mark the requests whose job the database shows cancelled on the children that hold
    them; the others are ignored (logged at debug: anyone may send one). Requests naming none
    of our children cost no query. False when the database could not be asked (nothing is
    marked: the poll asks again)."""
    children = list(children)
    ours = [r for r in requests if holder(children, r) is not None]
    if not ours:
        return True
    try:
        found = control.run(lambda conn: db.cancelled_among(conn, schema, [r.job_id for r in ours]))
    except ControlDown:
        return False  # the connection logged why
    except DatabaseError as exc:
        log.warning("could not check a pgq_job_cancel notification: %s", exc)
        return False
    for request in ours:
        if request.job_id in found:
            mark(children, request)
        else:
            log.debug(
                "ignored a pgq_job_cancel notification for job id=%s: not cancelled in the"
                " database",
                request.job_id,
            )
    return True


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
