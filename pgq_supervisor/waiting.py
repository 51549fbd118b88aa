"""Waiting for jobs to finish: `wait`, `wait_many` and their async twins.

No lost wake-up: LISTEN on pgq_job_stopped first, then read the states, then sleep until a
notification names some of the jobs still waited on and re-read only those. Every path that
ends a job notifies that channel in the ending transaction (success, failure for good,
cancel, a rescue or death that ends in failure; the bundle trigger's on_complete job is a job
like any other). Notifications are hints, and a dropped notification (or a server restart on
another path) must not leave a waiter asleep forever, so every SAFETY_RECHECK seconds every
job still waited on is read again: a handful of cheap reads a minute, not a poll.

The connection must not be inside a transaction: LISTEN takes effect only at commit, and
notifications are delivered only between transactions. An idle connection that is not in
autocommit mode (a pool's, say) is switched to autocommit for the wait and switched back;
one inside a transaction is refused with InvalidInput. The channels are UNLISTENed after.

`on_progress(record)` is called, on the waiting thread, with the fresh record of a job whose
handler reported progress (pgq_job_progress names it), at most once per notification batch.
"""

from __future__ import annotations

import contextlib
import difflib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import psycopg
from psycopg.pq import TransactionStatus

from pgq_supervisor import db
from pgq_supervisor.errors import DatabaseError, InvalidInput, JobNotFound
from pgq_supervisor.frameworks import AsyncConnLike, ConnLike, as_psycopg, as_psycopg_async
from pgq_supervisor.ids import job_id as parse_job_id
from pgq_supervisor.ids import job_ids as parse_job_ids
from pgq_supervisor.jobs import IdLike, JobId, JobRecord, JobState, stale_after

STOPPED_CHANNEL = "pgq_job_stopped"
PROGRESS_CHANNEL = "pgq_job_progress"
SAFETY_RECHECK = 5.0  # seconds between re-reads of every job still waited on
# A timeout names the pending types no live supervisor serves (the supervisor table,
# schema/0010: a live one refreshed its row within three of the default heartbeat intervals)
UNSERVED_SEEN_WITHIN = stale_after()
MAX_SERVED_NAMED = 10  # served types a timeout names

OnProgress = Callable[[JobRecord], None]


def _channels(on_progress: OnProgress | None) -> list[str]:
    return [STOPPED_CHANNEL] + ([PROGRESS_CHANNEL] if on_progress is not None else [])


def _check_idle(status: TransactionStatus) -> None:
    if status != TransactionStatus.IDLE:
        raise InvalidInput(
            "wait needs a connection outside a transaction (LISTEN takes effect at commit and"
            " notifications arrive between transactions): commit first, or use another"
            " connection"
        )


@contextlib.contextmanager
def _listening(conn: db.Conn, channels: list[str]) -> Iterator[None]:
    _check_idle(conn.info.transaction_status)
    was_autocommit = conn.autocommit
    try:
        with db.wrapped():
            conn.autocommit = True
        for channel in channels:
            db.listen(conn, channel)
        yield
    finally:
        if not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error, DatabaseError):
                for channel in channels:
                    db.unlisten(conn, channel)
                conn.autocommit = was_autocommit


@contextlib.asynccontextmanager
async def _listening_async(conn: db.AsyncConn, channels: list[str]) -> AsyncIterator[None]:
    _check_idle(conn.info.transaction_status)
    was_autocommit = conn.autocommit
    try:
        with db.wrapped():
            await conn.set_autocommit(True)
        for channel in channels:
            await db.listen_async(conn, channel)
        yield
    finally:
        if not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error, DatabaseError):
                for channel in channels:
                    await db.unlisten_async(conn, channel)
                await conn.set_autocommit(was_autocommit)


class _Waiting:
    """The bookkeeping of one wait, shared by the sync and async loops."""

    def __init__(self, ids: Sequence[JobId], timeout: float | None) -> None:
        if timeout is not None and timeout < 0:
            raise InvalidInput(f"timeout must be >= 0, got {timeout}")
        self.ids = list(ids)
        self.remaining: set[JobId] = set(ids)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        self.read_all_at = time.monotonic()

    def to_check(self, stopped: set[JobId]) -> set[JobId]:
        """The jobs to read again: those named, or all of them once SAFETY_RECHECK has passed
        since the last full read (however busy the channel is with other jobs)."""
        if time.monotonic() - self.read_all_at >= SAFETY_RECHECK:
            self.read_all_at = time.monotonic()
            return set(self.remaining)
        return stopped

    def settle(self, checked: set[JobId], states: dict[JobId, JobState]) -> None:
        """`states` were read for `checked`: drop the finished ones; an unknown one fails."""
        missing = checked - states.keys()
        if missing:
            raise JobNotFound(f"no job with id {min(missing, key=str)}")
        self.remaining -= {i for i in checked if states[i].is_terminal}

    def sleep_for(self) -> float | None:
        """How long to wait for a notification now; None when time is up."""
        if self.deadline is None:
            return SAFETY_RECHECK
        left = self.deadline - time.monotonic()
        return None if left <= 0 else min(left, SAFETY_RECHECK)

    def unfinished(self) -> list[JobId]:
        return sorted(self.remaining, key=str)

    def timed_out(self, coverage: tuple[Sequence[str], Sequence[str]]) -> TimeoutError:
        """The error of a timeout; `coverage`: (the pending types of the jobs still waited on
        that no live supervisor serves, the types the live ones serve). A misspelt type waits
        forever: say so, and what is served (did you mean one of them?)."""
        unserved, served = coverage
        n = len(self.remaining)
        hint = ""
        if unserved:
            names = ", ".join(repr(t) for t in unserved)
            like = [m for t in unserved for m in difflib.get_close_matches(t, served, n=1)]
            shown = ", ".join(repr(t) for t in served[:MAX_SERVED_NAMED])
            more = len(served) - MAX_SERVED_NAMED
            hint = (
                f"; no supervisor seen in the last {UNSERVED_SEEN_WITHIN:g} s serves"
                f" type{'s' if len(unserved) != 1 else ''} {names}"
                + (f" (did you mean {like[0]!r}?)" if like else "")
                + (
                    f"; served: {shown}{f' and {more} more' if more > 0 else ''}"
                    if served
                    else "; no supervisor is live"
                )
            )
        return TimeoutError(
            f"{n} job{'s' if n != 1 else ''} still unfinished after {self.timeout} s"
            f" (e.g. {min(self.remaining, key=str)}){hint}"
        )

    def named(self, notes: list[psycopg.Notify]) -> tuple[set[JobId], set[JobId]]:
        """(stopped, progressed): the jobs waited on that the notifications name."""
        stopped: set[JobId] = set()
        progressed: set[JobId] = set()
        for note in notes:
            into = stopped if note.channel == STOPPED_CHANNEL else progressed
            for text in note.payload.split(","):
                with contextlib.suppress(ValueError):
                    job_id = JobId(uuid.UUID(text))
                    if job_id in self.remaining:
                        into.add(job_id)
        return stopped, progressed

    def records(self, found: dict[JobId, JobRecord]) -> list[JobRecord]:
        for job_id in self.ids:
            if job_id not in found:
                raise JobNotFound(f"no job with id {job_id}")
        return [found[i] for i in self.ids]


def wait(
    conn: ConnLike,
    job_id: IdLike,
    timeout: float | None = None,
    *,
    on_progress: OnProgress | None = None,
    schema: str | None = None,
) -> JobRecord:
    """Block until the job is succeeded, failed or cancelled; return its record.

    `job_id` is a UUID or its string form. A job already finished returns at once.
    TimeoutError after `timeout` seconds, JobNotFound for an unknown id (or one deleted
    meanwhile), InvalidInput for an id that is not one or if `conn` is in a transaction.
    """
    one = [parse_job_id(job_id)]
    return wait_many(conn, one, timeout, on_progress=on_progress, schema=schema)[0]


def wait_many(
    conn: ConnLike,
    ids: Sequence[IdLike],
    timeout: float | None = None,
    *,
    on_progress: OnProgress | None = None,
    schema: str | None = None,
) -> list[JobRecord]:
    """`wait` for every job of `ids` (one connection, one LISTEN); records in input order."""
    job_ids = parse_job_ids(ids)
    conn = as_psycopg(conn)
    s = schema or db.default_schema()
    w = _Waiting(job_ids, timeout)
    with _listening(conn, _channels(on_progress)):
        w.settle(set(w.remaining), db.job_states(conn, s, list(w.remaining)))
        while w.remaining:
            pause = w.sleep_for()
            if pause is None:
                unserved = db.unserved_types(conn, s, w.unfinished(), UNSERVED_SEEN_WITHIN)
                raise w.timed_out(unserved)
            with db.wrapped():
                notes = list(conn.notifies(timeout=pause, stop_after=1))
            stopped, progressed = w.named(notes)
            if progressed and on_progress is not None:
                for record in db.get_jobs(conn, s, sorted(progressed, key=str)).values():
                    on_progress(record)
            check = w.to_check(stopped)
            if check:
                w.settle(check, db.job_states(conn, s, list(check)))
        return w.records(db.get_jobs(conn, s, w.ids))


async def wait_async(
    conn: AsyncConnLike,
    job_id: IdLike,
    timeout: float | None = None,
    *,
    on_progress: OnProgress | None = None,
    schema: str | None = None,
) -> JobRecord:
    """`wait` on a psycopg.AsyncConnection."""
    one = [parse_job_id(job_id)]
    records = await wait_many_async(conn, one, timeout, on_progress=on_progress, schema=schema)
    return records[0]


async def wait_many_async(
    conn: AsyncConnLike,
    ids: Sequence[IdLike],
    timeout: float | None = None,
    *,
    on_progress: OnProgress | None = None,
    schema: str | None = None,
) -> list[JobRecord]:
    """`wait_many` on a psycopg.AsyncConnection."""
    job_ids = parse_job_ids(ids)
    conn = await as_psycopg_async(conn)
    s = schema or db.default_schema()
    w = _Waiting(job_ids, timeout)
    async with _listening_async(conn, _channels(on_progress)):
        w.settle(set(w.remaining), await db.job_states_async(conn, s, list(w.remaining)))
        while w.remaining:
            pause = w.sleep_for()
            if pause is None:
                unserved = await db.unserved_types_async(
                    conn, s, w.unfinished(), UNSERVED_SEEN_WITHIN
                )
                raise w.timed_out(unserved)
            with db.wrapped():
                notes = [n async for n in conn.notifies(timeout=pause, stop_after=1)]
            stopped, progressed = w.named(notes)
            if progressed and on_progress is not None:
                found = await db.get_jobs_async(conn, s, sorted(progressed, key=str))
                for record in found.values():
                    on_progress(record)
            check = w.to_check(stopped)
            if check:
                w.settle(check, await db.job_states_async(conn, s, list(check)))
        return w.records(await db.get_jobs_async(conn, s, w.ids))
