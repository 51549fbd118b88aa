"""The workflow statements (schema/0020): a run's history and signals, its fenced step rows,
its suspension, pgq.signal, and the steps as `show` lists them. Sync and async twins where an
async workflow needs them."""

from __future__ import annotations

from datetime import datetime

from psycopg.rows import scalar_row, tuple_row

from pgq_supervisor.db import rows
from pgq_supervisor.db.connection import AsyncConn, Conn, cursor, cursor_async, statement, wrapped
from pgq_supervisor.db.workflow_params import (
    WorkflowAdoptParams,
    WorkflowIdParams,
    WorkflowRecordParams,
    WorkflowSignalParams,
    WorkflowSuspendParams,
)
from pgq_supervisor.jobs import EndedAttempt, JobId, LeaseToken
from pgq_supervisor.steps import Recorded, SignalRecord, StepRecord, StepView

STEP_RECORD = rows.NamedRow(StepRecord)
RECORDED = rows.NamedRow(Recorded)
SIGNAL_RECORD = rows.NamedRow(SignalRecord)
STEP_VIEW = rows.NamedRow(StepView)


def history(conn: Conn, schema: str, job_id: JobId) -> tuple[list[StepRecord], list[SignalRecord]]:
    """The workflow's steps in order, and the signals sent to it."""
    params: WorkflowIdParams = {"id": job_id}
    with wrapped():
        with cursor(conn, STEP_RECORD) as cur:
            steps = cur.execute(statement("workflow_history", schema), params).fetchall()
        with cursor(conn, SIGNAL_RECORD) as cur:
            signals = cur.execute(statement("workflow_signals", schema), params).fetchall()
    return steps, signals


async def history_async(
    conn: AsyncConn, schema: str, job_id: JobId
) -> tuple[list[StepRecord], list[SignalRecord]]:
    params: WorkflowIdParams = {"id": job_id}
    with wrapped():
        async with cursor_async(conn, STEP_RECORD) as cur:
            await cur.execute(statement("workflow_history", schema), params)
            steps = await cur.fetchall()
        async with cursor_async(conn, SIGNAL_RECORD) as cur:
            await cur.execute(statement("workflow_signals", schema), params)
            signals = await cur.fetchall()
    return steps, signals


def record(conn: Conn, schema: str, params: WorkflowRecordParams) -> Recorded | None:
    """Write a step row, fenced by the lease; None: not written (the lease is lost, or the step
    already succeeded under another run): whatever the transaction did must be rolled back."""
    with wrapped(), cursor(conn, RECORDED) as cur:
        return cur.execute(statement("workflow_record", schema), params).fetchone()


async def record_async(
    conn: AsyncConn, schema: str, params: WorkflowRecordParams
) -> Recorded | None:
    with wrapped():
        async with cursor_async(conn, RECORDED) as cur:
            await cur.execute(statement("workflow_record", schema), params)
            return await cur.fetchone()


def suspend(
    conn: Conn, schema: str, job_id: JobId, *, lease: LeaseToken, delay: float, wait: str | None
) -> list[EndedAttempt]:
    """Put the workflow to sleep for `delay` seconds (or until the signal `wait`), no attempt
    counted. No row: the lease was lost and nothing was written."""
    params: WorkflowSuspendParams = {
        "id": job_id,
        "lease": lease,
        "delay": max(0.0, delay),
        "wait": wait,
    }
    with wrapped(), cursor(conn, rows.ENDED_ATTEMPT) as cur:
        return cur.execute(statement("workflow_suspend", schema), params).fetchall()


def signal(conn: Conn, schema: str, job_id: JobId, name: str, payload: str | None) -> bool | None:
    """Send a signal (payload as JSON text): True sent, False that name was sent before, None
    no such job."""
    params: WorkflowSignalParams = {"id": job_id, "name": name, "payload": payload}
    with wrapped(), cursor(conn, scalar_row) as cur:
        sent = cur.execute(statement("workflow_signal", schema), params).fetchone()
    return sent if isinstance(sent, bool) else None


async def signal_async(
    conn: AsyncConn, schema: str, job_id: JobId, name: str, payload: str | None
) -> bool | None:
    params: WorkflowSignalParams = {"id": job_id, "name": name, "payload": payload}
    with wrapped():
        async with cursor_async(conn, scalar_row) as cur:
            await cur.execute(statement("workflow_signal", schema), params)
            sent = await cur.fetchone()
    return sent if isinstance(sent, bool) else None


def adopt(conn: Conn, schema: str, child: JobId, parent: JobId) -> None:
    """Make `child`'s end a signal to the workflow `parent`."""
    params: WorkflowAdoptParams = {"id": child, "parent": parent}
    with wrapped(), cursor(conn, scalar_row) as cur:
        cur.execute(statement("workflow_adopt", schema), params)


async def adopt_async(conn: AsyncConn, schema: str, child: JobId, parent: JobId) -> None:
    params: WorkflowAdoptParams = {"id": child, "parent": parent}
    with wrapped():
        async with cursor_async(conn, scalar_row) as cur:
            await cur.execute(statement("workflow_adopt", schema), params)


def steps(conn: Conn, schema: str, job_id: JobId) -> list[StepView]:
    """The steps of a workflow job (none for other jobs)."""
    params: WorkflowIdParams = {"id": job_id}
    with wrapped(), cursor(conn, STEP_VIEW) as cur:
        return cur.execute(statement("workflow_steps", schema), params).fetchall()


def record_params(
    job_id: JobId,
    lease: LeaseToken,
    seq: int,
    name: str,
    kind: str,
    state: str,
    *,
    result: str | None = None,
    error: str | None = None,
    tries: int = 0,
    wake_at: datetime | None = None,
    wake_in: float | None = None,
    duration: float | None = None,
) -> WorkflowRecordParams:
    """workflow_record's parameters; a step is finished unless it sleeps or waits."""
    return {
        "id": job_id, "lease": lease, "seq": seq, "name": name, "kind": kind, "state": state,
        "result": result, "error": error, "tries": tries, "wake_at": wake_at,
        "wake_in": wake_in, "duration": duration,
        "finished": state not in ("sleeping", "waiting"),
    }  # fmt: skip


def paused(conn: Conn, schema: str) -> dict[tuple[str, str], int]:
    """Pending workflows by (type, what they are paused on: sleeping, waiting, retrying)."""
    with wrapped(), cursor(conn, tuple_row) as cur:
        found = cur.execute(statement("workflows_paused", schema)).fetchall()
    return {(str(t), str(state)): int(n) for t, state, n in found}
