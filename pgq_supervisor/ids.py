"""Job and bundle ids as callers hand them over: a `uuid.UUID`, or its string form (as the
CLI prints it, as it arrives in a URL or a form). Every public call that takes an id parses
it here, so each takes the same spellings and refuses the same way: InvalidInput naming the
argument, before anything is read or written."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from pgq_supervisor.errors import InvalidInput
from pgq_supervisor.jobs import BundleId, IdLike, JobId

__all__ = ["IdLike", "bundle_id", "job_id", "job_ids"]


def _parse(value: object, argument: str, what: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value.strip())
        except ValueError:
            pass
    shown = value if not isinstance(value, str) or len(value) <= 60 else f"{value[:60]}..."
    raise InvalidInput(f"{argument}: {shown!r} is not a {what} id (a UUID or its string form)")


def job_id(value: object, argument: str = "job_id") -> JobId:
    """`value` as a JobId: a UUID as it is, a string parsed; else InvalidInput naming
    `argument`."""
    return JobId(_parse(value, argument, "job"))


def bundle_id(value: object, argument: str = "id") -> BundleId:
    """`value` as a BundleId, as `job_id` parses it."""
    return BundleId(_parse(value, argument, "bundle"))


def job_ids(values: Iterable[object], argument: str = "ids") -> list[JobId]:
    """Each of `values` as a JobId, in order. A lone string is refused (it is not a sequence
    of ids, however iterable)."""
    if isinstance(values, str | bytes):
        raise InvalidInput(f"{argument} must be a sequence of job ids, not a string")
    return [job_id(v, f"{argument}[{i}]") for i, v in enumerate(values)]
