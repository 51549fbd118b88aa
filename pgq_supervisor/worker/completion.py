"""The one place a child writes what became of the jobs it holds (after River's job completer).

    claim() ─▶ jobs held ─▶ runs.py ─▶ Settlement ─▶ settle()
      │        (heartbeat)                            ├ Ran, a success: buffered, written later
      │                                               ├ Ran, a failure: end_attempt, at once
      │                                               ├ Committed (a `conn` handler's success,
      │                                               │   in its transaction): recorded
      │                                               ├ Lost: recorded, nothing written
      │                                               └ TimedOut: end_attempt as a timeout
      ├ buffered successes of one lease: in the claim's own statement
      flush() ─ the others: one statement per lease
      release() ─ claimed but never started: back to pending, no attempt consumed

Every write is fenced by the job's lease: a job that another worker owns now comes out LOST
and nothing is written. Every job settled here leaves the heartbeat, and its `Outcome` waits in
`take_outcomes()`. A buffered success is a job still `running` under a live heartbeat, so a
crash before it is written reruns the job rather than losing it (measured on 2 cores: one
write per job caps the queue near 2,000 jobs/s; one statement per batch drains 40,000).

The completer holds no connection: the caller passes its own to each call, and reconnecting is
the caller's business. A call that raises DatabaseError settles nothing it was about to write;
after a reconnect, `recover()` writes the buffer or, if it cannot, forgets it (those jobs run
again: the heartbeat releases them, or the rescuer once their heartbeat is stale).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple, assert_never

from pgq_supervisor import db
from pgq_supervisor.db import workflows
from pgq_supervisor.display import plural
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.jobs import (
    AttemptKind,
    Job,
    JobId,
    JobState,
    JsonValue,
    LeaseToken,
    OutcomeKind,
)
from pgq_supervisor.registry import ClaimPolicy
from pgq_supervisor.worker.executor import Failure, Ran
from pgq_supervisor.worker.heartbeat import Heartbeat
from pgq_supervisor.worker.runs import Committed, Lost, Settlement, TimedOut

log = logging.getLogger(__name__)


class Outcome(NamedTuple):
    """How one attempt of a held job ended, once written (or found lost)."""

    job: Job
    kind: OutcomeKind
    duration: float
    error: str | None = None


# the kinds of attempt a child ends: a run's failures, and an async job it cancelled at its
# timeout (a snooze ends none: _snooze; nor does a workflow's pause: _suspend)
_EndKind = Literal[AttemptKind.ERROR, AttemptKind.PERMANENT, AttemptKind.TIMEOUT]


def _allows_retry(kind: _EndKind) -> bool:
    match kind:
        case AttemptKind.ERROR | AttemptKind.TIMEOUT:
            return True
        case AttemptKind.PERMANENT:
            return False
        case _:
            assert_never(kind)


class Completer:
    """Writes the outcomes of one worker's jobs, each call on the connection it is given.

    `flush_every`: how long buffered successes may wait for a claim to ride on before
    `flush_if_due()` writes them anyway. One thread drives it (the worker's main thread;
    handlers run elsewhere report through it), but for `flush`: the heartbeat thread may call
    it, on its own connection, while a job runs long (unstarted.py). So the buffer changes
    under a lock: a report, a claim and a flush take it.
    """

    def __init__(
        self,
        schema: str,
        worker_id: str,
        *,
        heartbeat: Heartbeat | None = None,
        flush_every: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        ephemeral: frozenset[str] = frozenset(),
    ) -> None:
        """`ephemeral`: the job types whose successes delete their jobs (db.succeed)."""
        self.schema = schema
        self.ephemeral = ephemeral
        self.worker_id = worker_id
        self.heartbeat = heartbeat
        self.flush_every = flush_every
        self.clock = clock
        self._successes: list[Ran] = []
        self._written_at = clock()
        self._outcomes: list[Outcome] = []
        self._lock = threading.RLock()  # the buffer and the outcomes (see the class docstring)

    @property
    def buffered(self) -> int:
        """Successes run but not yet written."""
        return len(self._successes)

    def take_outcomes(self) -> list[Outcome]:
        """The outcomes settled since the last call, in the order they were settled."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
        return outcomes

    # ---- claiming, with the buffer riding on it ----

    def claim(self, conn: db.Conn, policy: ClaimPolicy, limit: int) -> list[Job]:
        """Claim up to `limit` jobs of `policy.types` and hold them in the heartbeat.

        Buffered successes of one lease are written by the claim's own statement (one
        commit for both); any others are flushed first.
        """
        with self._lock:
            return self._claim(conn, policy, limit)

    def _claim(self, conn: db.Conn, policy: ClaimPolicy, limit: int) -> list[Job]:
        lease = self._rider()
        if lease is None:
            self.flush(conn)
            jobs = db.claim(
                conn,
                self.schema,
                worker_id=self.worker_id,
                types=policy.types,
                max_retry_counts=policy.max_retry_counts,
                limit=limit,
            )
        else:
            held, jobs = db.succeed_and_claim(
                conn,
                self.schema,
                lease,
                [(r.job.id, r.result) for r in self._successes],
                worker_id=self.worker_id,
                types=policy.types,
                max_retry_counts=policy.max_retry_counts,
                limit=limit,
                ephemeral=self._ephemeral(self._successes),
            )
            self._settle_buffered(lease, held)
        self._written_at = self.clock()
        if jobs and self.heartbeat is not None:
            self.heartbeat.hold(jobs[0].lease, [j.id for j in jobs])  # one claim, one lease
        return jobs

    def _rider(self) -> LeaseToken | None:
        """The buffer's lease if it can ride on a claim: all of one lease. (Bundled jobs ride
        too: the bundle trigger locks their bundles in id order at the end of the statement,
        after its job rows, schema/0024.)"""
        if not self._successes:
            return None
        lease = self._successes[0].job.lease
        for ran in self._successes:
            if ran.job.lease != lease:
                return None
        return lease

    # ---- what a run came to ----

    def settle(self, conn: db.Conn, settlement: Settlement) -> None:
        """Write what a run came to (runs.py), on `conn`: a success is buffered (written by
        the next claim or flush), anything else is written, or was already, now."""
        # the hot path, a plain success (one per job), before the match: a class pattern
        # costs several times a type check (measured: ~700 instructions against ~170)
        if type(settlement) is Ran and settlement.failure is None:
            with self._lock:
                self._successes.append(settlement)
            return
        match settlement:
            case Ran(job, _, failure, took):
                if failure is None:
                    with self._lock:
                        self._successes.append(settlement)
                else:
                    self._write_failure(conn, job, failure, took)
            case Committed(job, took):  # in its handler's transaction already
                self._succeeded(job, took)
            case Lost(job, took):
                self._lost(job, took)
            case TimedOut(job, timeout, took, delay):
                # cancelled in the child: its attempt ends as a timeout (the supervisor's
                # kind for a job killed at its timeout), retried if it has attempts left
                error = f"timeout after {timeout:g} s"
                self._end_attempt(conn, job, took, error, None, AttemptKind.TIMEOUT, delay)
            case _:
                assert_never(settlement)

    def _write_failure(self, conn: db.Conn, job: Job, failure: Failure, took: float) -> None:
        kind = failure.kind
        if kind is AttemptKind.SNOOZED:
            if failure.suspends:  # a workflow's sleep, wait or step retry
                self._suspend(conn, job, failure, took)
            else:
                self._snooze(conn, job, failure, took)
            return
        self._end_attempt(conn, job, took, failure.message, failure.data, kind, failure.retry_delay)

    def _snooze(self, conn: db.Conn, job: Job, failure: Failure, took: float) -> None:
        """Back to pending after the snooze's delay, no attempt counted (fenced by its lease);
        failed with the failure's message if its type's max_snoozes is spent."""
        delay = failure.retry_delay
        ended = db.snooze(
            conn,
            self.schema,
            job.id,
            lease=job.lease,
            delay=delay,
            max_snoozes=failure.max_snoozes,
            error=failure.message,
        )
        if not ended:
            self._lost(job, took)
            return
        snoozed = ended[0].new_state is JobState.PENDING
        log.log(
            logging.INFO if snoozed else logging.ERROR,
            "job %s id=%s type=%s attempt=%d duration=%.3fs worker=%s%s",
            "snoozed" if snoozed else "failed",
            job.id,
            job.type,
            job.attempt,
            took,
            self.worker_id,
            f" due_in={delay:g}s" if snoozed else f" error={failure.message}",
        )
        outcome = OutcomeKind.SNOOZED if snoozed else OutcomeKind.FAILED
        self._outcomes.append(Outcome(job, outcome, took, None if snoozed else failure.message))
        self._drop(job.lease, [job.id])

    def _suspend(self, conn: db.Conn, job: Job, failure: Failure, took: float) -> None:
        """A workflow's sleep, wait or step retry: its run ends, its job is pending again (due
        after the delay, or at the signal), fenced by its lease; no attempt, no max_snoozes
        (schema/0020). Said as what it is: `workflow sleeping 5 s (sleep 'nap') id=...`."""
        ended = workflows.suspend(
            conn, self.schema, job.id, lease=job.lease, delay=failure.retry_delay,
            wait=failure.wait,
        )  # fmt: skip
        if not ended:
            self._lost(job, took)
            return
        log.info(
            "%s id=%s type=%s duration=%.3fs worker=%s",
            failure.message,
            job.id,
            job.type,
            took,
            self.worker_id,
        )
        self._outcomes.append(Outcome(job, OutcomeKind.SUSPENDED, took))
        self._drop(job.lease, [job.id])

    def _end_attempt(
        self,
        conn: db.Conn,
        job: Job,
        took: float,
        error: str,
        data: JsonValue,
        kind: _EndKind,
        delay: float,
    ) -> None:
        """End `job`'s attempt as `kind`, fenced by its lease: retried after `delay` if its
        kind allows it and it has attempts left, else failed."""
        timeout = kind is AttemptKind.TIMEOUT
        ended = db.end_attempt(
            conn,
            self.schema,
            [job.id],
            lease=job.lease,
            error=error,
            error_data=data,
            kind=kind,
            allow_retry=_allows_retry(kind),
            delay=delay,
        )
        if not ended:
            self._lost(job, took)
            return
        retried = ended[0].new_state is JobState.PENDING
        log.log(
            logging.WARNING if retried or timeout else logging.ERROR,
            "job %s id=%s type=%s attempt=%d duration=%.3fs worker=%s error=%s%s",
            "retry" if retried else "failed",
            job.id,
            job.type,
            job.attempt,
            took,
            self.worker_id,
            error,
            f" retry_in={delay:.2f}s" if retried and not timeout else "",
        )
        outcome = OutcomeKind.RETRIED if retried else OutcomeKind.FAILED
        self._outcomes.append(Outcome(job, outcome, took, error))
        self._drop(job.lease, [job.id])

    # ---- writing the buffer ----

    def flush_if_due(self, conn: db.Conn) -> None:
        """Flush when successes have waited `flush_every` for a claim (a long batch)."""
        if self._successes and self.clock() - self._written_at > self.flush_every:
            self.flush(conn)

    def flush(self, conn: db.Conn) -> None:
        """Write every buffered success: one statement per lease (its bundles are counted by
        the statement's trigger, schema/0024). On DatabaseError, what is not written stays
        buffered: flush again after reconnecting (fenced writes cannot complete a job twice)."""
        with self._lock:
            self._flush(conn)

    def _flush(self, conn: db.Conn) -> None:
        while self._successes:
            lease = self._successes[0].job.lease
            results = [(r.job.id, r.result) for r in self._successes if r.job.lease == lease]
            gone = self._ephemeral([r for r in self._successes if r.job.lease == lease])
            held = db.succeed(conn, self.schema, lease, results, gone)
            self._settle_buffered(lease, held)
        self._written_at = self.clock()

    def _ephemeral(self, successes: Sequence[Ran]) -> list[JobId]:
        if not self.ephemeral:  # the usual case: nothing to look at
            return []
        return [r.job.id for r in successes if r.job.type in self.ephemeral]

    def recover(self, conn: db.Conn) -> None:
        """After a database error: write the buffer on `conn` if it can, else forget it (the
        jobs stay `running` and will run again: never lost, never completed twice)."""
        try:
            self.flush(conn)
        except DatabaseError as exc:
            log.warning(
                "could not write %s (their jobs will run again): %s",
                plural(len(self._successes), "success", "successes"),
                exc,
            )
            self.discard()

    def discard(self) -> None:
        """Forget the buffered successes: their jobs will run again. With a heartbeat, it
        releases them from its thread (fenced, without an attempt, retried until it lands):
        the child's beats keep every job it owns alive (schema/0025), so a job merely left out
        of the heartbeat would stay running until the child exits. Without one, they leave
        and the rescuer returns them."""
        with self._lock:
            successes, self._successes = self._successes, []
        if self.heartbeat is not None:
            self.heartbeat.release_later([r.job for r in successes])
            return
        by_lease: dict[LeaseToken, list[JobId]] = {}
        for ran in successes:
            by_lease.setdefault(ran.job.lease, []).append(ran.job.id)
        for lease, ids in by_lease.items():
            self._drop(lease, ids)

    def release(self, conn: db.Conn, jobs: Sequence[Job]) -> None:
        """Jobs claimed but not started go back without consuming an attempt. Never raises:
        if the write fails the heartbeat keeps them alive and releases them from its thread
        (without a heartbeat, the rescuer returns them)."""
        if not jobs:
            return
        ids = [j.id for j in jobs]
        try:
            db.release(conn, self.schema, ids=ids, lease=jobs[0].lease)
        except DatabaseError as exc:
            log.warning("could not release %s claimed (retrying): %s", plural(len(ids), "job"), exc)
            if self.heartbeat is not None:
                self.heartbeat.release_later(jobs)
                return
        self._drop(jobs[0].lease, ids)

    # ---- settling ----

    def _settle_buffered(self, lease: LeaseToken, held: set[JobId]) -> None:
        """The buffered successes of `lease` were written: `held` are the ids that landed."""
        mine = [r for r in self._successes if r.job.lease == lease]
        self._successes = [r for r in self._successes if r.job.lease != lease]
        for job, _, _, took in mine:
            if job.id in held:
                self._succeeded(job, took, drop=False)
            else:
                self._lost(job, took, drop=False)
        self._drop(lease, [r.job.id for r in mine])

    def _succeeded(self, job: Job, took: float, *, drop: bool = True) -> None:
        log.debug(
            "job succeeded id=%s type=%s attempt=%d duration=%.3fs worker=%s",
            job.id,
            job.type,
            job.attempt,
            took,
            self.worker_id,
        )
        self._outcomes.append(Outcome(job, OutcomeKind.SUCCEEDED, took))
        if drop:
            self._drop(job.lease, [job.id])

    def _lost(self, job: Job, took: float, *, drop: bool = True) -> None:
        log.warning(
            "job lease lost id=%s type=%s attempt=%d worker=%s: another worker owns it now;"
            " nothing was written",
            job.id,
            job.type,
            job.attempt,
            self.worker_id,
        )
        self._outcomes.append(Outcome(job, OutcomeKind.LOST, took, "lease lost"))
        if drop:
            self._drop(job.lease, [job.id])

    def _drop(self, lease: LeaseToken, ids: list[JobId]) -> None:
        if self.heartbeat is not None:
            self.heartbeat.drop(lease, ids)
