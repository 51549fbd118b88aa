"""Debounce (schema/0019): `replace=True` with a unique_key replaces the payload, start_at and
priority of the pending job that holds the key. A running holder is not touched: the new job
is dropped, or waits behind it (it depends on the running job, with
on_dependency_failure="run", and holds the key in `debounce_key`).

The holder is looked up and replaced under the key's advisory lock (the one dedup windows
take, schema/0018), held until the caller's transaction ends, and the job inserted in that
transaction: racing producers of one key replace one job, never insert two."""

from __future__ import annotations

import dataclasses
from typing import Literal

from psycopg.rows import tuple_row

from pgq_supervisor.db import enqueueing
from pgq_supervisor.db.connection import statement, wrapped
from pgq_supervisor.db.option_params import DebounceKeyParams, DebounceParams
from pgq_supervisor.db.plans import Plan, atomic, execute, fetch_one
from pgq_supervisor.errors import InvalidInput
from pgq_supervisor.jobs import JobId, NewJob
from pgq_supervisor.jsontext import dump_payload

# What a debounced enqueue does when the job holding its key is running.
ReplaceRunning = Literal["wait", "drop"]


def check(job: NewJob) -> None:
    """InvalidInput unless `replace` comes with what it needs and nothing it contradicts,
    and the job is one enqueueing would take (before the first statement)."""
    enqueueing.check_job(job)
    if job.unique_key is None:
        raise InvalidInput("replace=True needs a unique_key (the key of the job it replaces)")
    if job.unique_for is not None or job.unique_states is not None:
        raise InvalidInput("replace=True cannot be combined with unique_for or unique_states")
    if job.depends_on or job.ordered_key is not None:
        raise InvalidInput("replace=True cannot be combined with depends_on or ordered_key")
    if job.replace_running not in ("wait", "drop"):
        raise InvalidInput(f"replace_running must be 'wait' or 'drop', got {job.replace_running!r}")


def _params(job: NewJob) -> DebounceParams:
    assert job.unique_key is not None
    return {
        "key": job.unique_key,
        "payload": dump_payload(job.payload),
        "start_at": job.start_at,
        "priority": job.priority,
    }


def _behind(job: NewJob, running: JobId) -> NewJob:
    """The job that waits behind `running`: it runs once that one ends, however it ends."""
    return dataclasses.replace(
        job, unique_key=None, replace=False, depends_on=[running], on_dependency_failure="run"
    )


def enqueue(schema: str, job: NewJob) -> Plan[JobId]:
    check(job)
    return (yield from atomic(_replace_or_enqueue(schema, job, _params(job))))


def _replace_or_enqueue(schema: str, job: NewJob, params: DebounceParams) -> Plan[JobId]:
    with wrapped():
        row = yield from fetch_one(statement("debounce_holder", schema), params, tuple_row)
    if row is None:
        return (yield from enqueueing.enqueue(schema, dataclasses.replace(job, replace=False)))
    action, holder = str(row[0]), JobId(row[1])
    if action == "replaced" or job.replace_running == "drop":
        return holder
    waiting = yield from enqueueing.enqueue(schema, _behind(job, holder))
    key: DebounceKeyParams = {"id": waiting, "key": job.unique_key}
    with wrapped():
        yield from execute(statement("set_debounce_key", schema), key)
    return waiting
