"""Runs a held job's handler and writes its outcome, fenced by the job's lease.

Shared by the worker child and by `pgq_supervisor.testing`. Successes of handlers that do not
take `conn` are buffered and written in one statement by `flush()` (PERF-NOTES: one write per
job caps the queue near 2,000 jobs/s); until then the jobs stay `running` under a live
heartbeat, so a crash before the flush reruns them rather than losing them. Failures are
written at once, in one statement each.
"""

from __future__ import annotations

import json
import logging
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import pydantic

from pgq_supervisor import db
from pgq_supervisor.errors import InvalidInput, LeaseLost, PermanentError
from pgq_supervisor.jobs import (
    AttemptKind,
    Job,
    JobId,
    JobState,
    JsonValue,
    LeaseToken,
    OutcomeKind,
)
from pgq_supervisor.registry import Handler, Registry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    job: Job
    kind: OutcomeKind
    duration: float
    error: str | None = None


def _result_json(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    return db.dump_json(value, "handler result")


class Executor:
    """Executes jobs on one connection (autocommit) for one worker id."""

    def __init__(
        self,
        conn: db.Conn,
        schema: str,
        registry: Registry,
        worker_id: str,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conn = conn
        self.schema = schema
        self.registry = registry
        self.worker_id = worker_id
        self.rng = rng or random.Random()
        self.clock = clock
        self._pending: list[tuple[Job, str | None, float]] = []

    @property
    def buffered(self) -> int:
        return len(self._pending)

    def run(self, job: Job) -> Outcome | None:
        """Run `job`. Returns its outcome, or None while its success is buffered for flush()."""
        handler = self.registry.handlers.get(job.type)
        start = self.clock()
        # DEBUG: two lines per job at INFO cost a third of the throughput (activity.py logs
        # a periodic summary instead); failures and retries stay WARNING/ERROR below.
        log.debug(
            "job start id=%s type=%s attempt=%d worker=%s",
            job.id,
            job.type,
            job.attempt,
            self.worker_id,
        )
        if handler is None:
            return self._fail(job, handler, InvalidInput(f"no handler for {job.type!r}"), start)
        try:
            payload = handler.validate(job.payload)
            if handler.wants_conn:
                return self._run_in_transaction(job, handler, payload, start)
            result = _result_json(self._call(handler, job, payload))
        except Exception as exc:  # the handler's failure is the job's outcome, never ours
            return self._fail(job, handler, exc, start)
        self._pending.append((job, result, self.clock() - start))
        return None

    def _call(self, handler: Handler, job: Job, payload: object) -> object:
        kwargs: dict[str, object] = {}
        if handler.wants_job:
            kwargs["job"] = job
        if handler.wants_conn:
            kwargs["conn"] = self.conn
        return handler.func(payload, **kwargs)

    def _run_in_transaction(
        self, job: Job, handler: Handler, payload: object, start: float
    ) -> Outcome:
        """The handler's own writes and the job's completion commit together, or not at all."""
        try:
            with self.conn.transaction():
                # the handler's own writes are user data: durable even when bookkeeping is not
                db.durable_commit(self.conn)
                result = _result_json(self._call(handler, job, payload))
                if not db.succeed(self.conn, self.schema, job.lease, [(job.id, result)]):
                    raise LeaseLost(f"job {job.id} lost its lease")
        except LeaseLost:
            return self._lost_logged(job, self.clock() - start)
        except Exception as exc:
            return self._fail(job, handler, exc, start)
        return self._succeeded(job, self.clock() - start)

    def flush(self) -> list[Outcome]:
        """Write buffered successes, one statement per lease (bundles locked first, in order).

        On a database error the unwritten successes stay buffered: flush again after
        reconnecting (the writes are fenced, so a retry can never double-complete a job).
        """
        outcomes: list[Outcome] = []
        while self._pending:
            lease = self._pending[0][0].lease
            items = [it for it in self._pending if it[0].lease == lease]
            bundles = [j.bundle_id for j, _, _ in items if j.bundle_id is not None]
            results = [(j.id, r) for j, r, _ in items]
            if bundles:
                with self.conn.transaction():
                    db.lock_bundles(self.conn, self.schema, bundles, [r[0] for r in results], lease)
                    held = db.succeed(self.conn, self.schema, lease, results)
            else:
                held = db.succeed(self.conn, self.schema, lease, results)
            outcomes.extend(self.settle_buffered(lease, held))
        return outcomes

    def buffered_for_claim(self) -> tuple[LeaseToken, list[tuple[JobId, str | None]]] | None:
        """The buffer, if it can ride on the next claim: one lease and no bundled job."""
        if not self._pending:
            return None
        lease = self._pending[0][0].lease
        if any(j.lease != lease or j.bundle_id is not None for j, _, _ in self._pending):
            return None
        return lease, [(j.id, r) for j, r, _ in self._pending]

    def settle_buffered(self, lease: LeaseToken, held: set[JobId]) -> list[Outcome]:
        """After the successes of `lease` were written: `held` are the ids that landed."""
        items = [it for it in self._pending if it[0].lease == lease]
        self._pending = [it for it in self._pending if it[0].lease != lease]
        outcomes = []
        for job, _, took in items:
            if job.id in held:
                outcomes.append(self._succeeded(job, took))
            else:
                outcomes.append(self._lost_logged(job, took))
        return outcomes

    def discard_buffered(self) -> list[Job]:
        """Forget buffered successes (their jobs will run again); returns their jobs."""
        jobs = [j for j, _, _ in self._pending]
        self._pending = []
        return jobs

    def _succeeded(self, job: Job, took: float) -> Outcome:
        log.debug(
            "job succeeded id=%s type=%s attempt=%d duration=%.3fs worker=%s",
            job.id,
            job.type,
            job.attempt,
            took,
            self.worker_id,
        )
        return Outcome(job, OutcomeKind.SUCCEEDED, took)

    def _lost_logged(self, job: Job, took: float) -> Outcome:
        log.warning(
            "job lease lost id=%s type=%s attempt=%d worker=%s: another worker owns it now;"
            " nothing was written",
            job.id,
            job.type,
            job.attempt,
            self.worker_id,
        )
        return Outcome(job, OutcomeKind.LOST, took, "lease lost")

    def _fail(self, job: Job, handler: Handler | None, exc: Exception, start: float) -> Outcome:
        took = self.clock() - start
        permanent = isinstance(exc, PermanentError | InvalidInput) or handler is None
        message = f"{type(exc).__name__}: {exc}"
        data: dict[str, object] = {"exception": type(exc).__name__}
        if isinstance(exc, PermanentError) and exc.data is not None:
            data["data"] = exc.data
        if not permanent:
            data["traceback"] = "".join(traceback.format_exception(exc))[-4000:]
        delay = 0.0 if handler is None else handler.backoff(job.attempt, self.rng)
        ended = db.end_attempt(
            self.conn,
            self.schema,
            [job.id],
            lease=job.lease,
            error=message,
            error_data=_jsonable(data),
            kind=AttemptKind.PERMANENT if permanent else AttemptKind.ERROR,
            allow_retry=not permanent,
            delay=delay,
        )
        if not ended:
            return self._lost_logged(job, took)
        retried = ended[0].new_state is JobState.PENDING
        log.log(
            logging.WARNING if retried else logging.ERROR,
            "job %s id=%s type=%s attempt=%d duration=%.3fs worker=%s error=%s%s",
            "retry" if retried else "failed",
            job.id,
            job.type,
            job.attempt,
            took,
            self.worker_id,
            message,
            f" retry_in={delay:.2f}s" if retried else "",
        )
        kind = OutcomeKind.RETRIED if retried else OutcomeKind.FAILED
        return Outcome(job, kind, took, message)


def _jsonable(data: dict[str, object]) -> JsonValue:
    """error_data travels as JSON; a value that is not JSON (say PermanentError data) is kept
    as its repr rather than losing the error."""
    out: dict[str, JsonValue] = {}
    for key, value in data.items():
        try:
            out[key] = json.loads(db.dump_json(value))
        except InvalidInput:
            out[key] = repr(value)
    return out
