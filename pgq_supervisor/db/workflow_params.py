"""Parameter types of the workflow statements (schema/0020); params.PARAMS registers them."""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from pgq_supervisor.jobs import JobId, LeaseToken


class NoWorkflowParams(TypedDict):
    pass


class WorkflowIdParams(TypedDict):
    id: JobId


class WorkflowRecordParams(TypedDict):
    id: JobId
    lease: LeaseToken
    seq: int
    name: str
    kind: str
    state: str
    result: str | None  # JSON text
    error: str | None
    tries: int
    wake_at: datetime | None
    wake_in: float | None
    duration: float | None
    finished: bool


class WorkflowSuspendParams(TypedDict):
    id: JobId
    lease: LeaseToken
    delay: float
    wait: str | None


class WorkflowSignalParams(TypedDict):
    id: JobId
    name: str
    payload: str | None  # JSON text


class WorkflowAdoptParams(TypedDict):
    id: JobId
    parent: JobId


WORKFLOW_PARAMS: dict[str, type] = {
    "workflow_history": WorkflowIdParams,
    "workflow_signals": WorkflowIdParams,
    "workflow_record": WorkflowRecordParams,
    "workflow_suspend": WorkflowSuspendParams,
    "workflow_signal": WorkflowSignalParams,
    "workflow_adopt": WorkflowAdoptParams,
    "workflow_steps": WorkflowIdParams,
    "workflows_paused": NoWorkflowParams,
}
