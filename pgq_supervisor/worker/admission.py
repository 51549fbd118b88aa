"""What the in-flight loop (inflight.py) may claim and start, and what goes back unstarted.

A type's own `concurrency` cap leaves the type out of the next claim while it is full, and a
claim of capped types only takes what their caps have room for. Jobs claimed beyond a cap (by a
claim that also took other types) wait here, queued, held and heart-beaten, for
`release_unstarted_after` at most: then they go back for another child.

Jobs named by RunAlone (released from the death of a child that held several, verdicts.py) run
with nothing else in flight: the child stops starting and claiming until its jobs in flight are
done, then runs that job by itself.

A mixin of InFlightWorker, which sets the state below in its __init__; it keeps the loop's
hot path free of an extra attribute lookup per job.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Final

from pgq_supervisor import db
from pgq_supervisor.ipc import ChildSpec, RunAloneSet
from pgq_supervisor.jobs import Job, JobId, LeaseToken
from pgq_supervisor.registry import ClaimPolicy, Registry
from pgq_supervisor.worker.completion import Completer

log = logging.getLogger(__name__)

CLAIM_EVERY: Final = 0.01  # with any slot free, claim at least this often


class Admission:
    """Capacity, type caps, run-alone and the queue of jobs claimed but not started."""

    spec: ChildSpec
    registry: Registry
    completer: Completer
    conn: db.Conn
    clock: Callable[[], float]
    capacity: int
    limit: int  # the jobs in flight allowed now (capacity, or adaptive.py's)
    caps: dict[str, int]  # a type's own cap, where lower than the child's
    policies: dict[tuple[str, ...], ClaimPolicy]
    running: Mapping[JobId, object]  # the jobs in flight
    per_type: dict[str, int]  # jobs in flight per type
    queued: deque[Job]  # claimed, waiting for a type's cap or to run alone
    claimed_at: dict[LeaseToken, float]  # when each claim of a queued job was
    started: int  # jobs started: with max_jobs, claims stop at the jobs left to start
    run_alone: RunAloneSet  # named by RunAlone: the oldest are forgotten first
    alone: JobId | None  # the job running alone now
    last_claim: float

    def _start(self, job: Job) -> None:
        raise NotImplementedError

    def _free(self) -> int:
        """Slots a claim may fill: none past the jobs left to start before max_jobs."""
        free = self.limit - len(self.running) - len(self.queued)
        if self.spec.max_jobs is not None:
            free = min(free, self.spec.max_jobs - self.started - len(self.queued))
        return free

    def _claim_due(self) -> bool:
        if self.alone is not None or (
            self.run_alone and any(j.id in self.run_alone for j in self.queued)
        ):
            return False  # a job waits to run alone: let the others drain
        free = self._free()
        if free <= 0:
            return False
        return (
            free >= max(1, self.limit // 4)
            or not self.running
            or self.clock() - self.last_claim >= CLAIM_EVERY
        )

    def _held(self) -> dict[str, int]:
        """Jobs held per type: in flight or queued."""
        held = dict(self.per_type)
        for job in self.queued:
            held[job.type] = held.get(job.type, 0) + 1
        return held

    def _claim_policy(self) -> ClaimPolicy | None:
        """The types a claim may take now: those below their cap (None: none are)."""
        if not self.caps:
            types = self.spec.types
        else:
            held = self._held()
            types = tuple(t for t in self.spec.types if held.get(t, 0) < self.caps.get(t, 1 << 30))
            if not types:
                return None
        policy = self.policies.get(types)
        if policy is None:
            policy = self.policies[types] = self.registry.claim_policy(types)
        return policy

    def _cap_room(self, types: tuple[str, ...]) -> int | None:
        """When every type of a claim is capped, the jobs their caps have room for: no more
        are claimed, or they would wait here behind the jobs in flight (None: no bound)."""
        if not self.caps or any(t not in self.caps for t in types):
            return None
        held = self._held()
        return sum(max(0, self.caps[t] - held.get(t, 0)) for t in types)

    def _start_queued(self) -> None:
        if not self.queued or self.alone is not None:
            return
        kept: deque[Job] = deque()
        while self.queued:
            job = self.queued.popleft()
            if job.id in self.run_alone:
                if self.running:
                    kept.append(job)
                    kept.extend(self.queued)  # nothing else starts before it
                    self.queued.clear()
                    break
                self.alone = job.id
                log.info("job id=%s runs alone (released from a shared death)", job.id)
                self._start(job)
                kept.extend(self.queued)
                self.queued.clear()
                break
            cap = self.caps.get(job.type)
            if cap is not None and self.per_type.get(job.type, 0) >= cap:
                kept.append(job)
                continue
            self._start(job)
        self.queued = kept

    def _release_waiting(self) -> float | None:
        """Queued jobs that have waited `release_unstarted_after` since their claim go back
        (for another child to run), but for one waiting to run alone: it waits for the jobs in
        flight by design. Returns the seconds until the next is due (None: none waits)."""
        if not self.queued:
            self.claimed_at.clear()
            return None
        now = self.clock()
        after = self.spec.release_unstarted_after
        due: list[Job] = []
        kept: deque[Job] = deque()
        next_in: float | None = None
        for job in self.queued:
            left = self.claimed_at.get(job.lease, now) + after - now
            if left <= 0 and job.id not in self.run_alone:
                due.append(job)
                continue
            kept.append(job)
            if job.id not in self.run_alone:
                next_in = left if next_in is None else min(next_in, left)
        if due:
            self.queued = kept
            self._release(due)
        if len(self.claimed_at) > len(self.queued):  # claims none of whose jobs wait now
            leases = {j.lease for j in self.queued}
            self.claimed_at = {k: v for k, v in self.claimed_at.items() if k in leases}
        return next_in

    def _run_alone(self, job_ids: list[JobId]) -> None:
        self.run_alone.add(job_ids)

    def _release(self, jobs: list[Job]) -> None:
        """Claimed but never started: back to pending without an attempt (by lease)."""
        by_lease: dict[object, list[Job]] = {}
        for job in jobs:
            by_lease.setdefault(job.lease, []).append(job)
        for group in by_lease.values():
            self.completer.release(self.conn, group)
