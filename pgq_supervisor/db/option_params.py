"""Parameter types of the statements behind the job options of docs/job-options.md (snooze,
dedup windows, debounce, priority aging); params.PARAMS registers them with the others."""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from pgq_supervisor.jobs import JobId, LeaseToken


class SnoozeParams(TypedDict):
    id: JobId
    lease: LeaseToken
    delay: float
    max_snoozes: int
    error: str


class UniqueHoldersParams(TypedDict):
    """`unique_holders`: per job, its key, window (s) and counted finished states ('a,b')."""

    keys: list[str | None]
    windows: list[float]
    states: list[str]


class DebounceParams(TypedDict):
    key: str
    payload: str
    start_at: datetime | None
    priority: int


class DebounceKeyParams(TypedDict):
    id: JobId
    key: str | None


class AgePrioritiesParams(TypedDict):
    type: str
    every: float
    max_priority: int
    limit: int


class OrderedLinkParams(TypedDict):
    ids: list[JobId]
    keys: list[str]
