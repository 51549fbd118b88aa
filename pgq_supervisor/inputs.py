"""Checks of the public calls' scalar arguments, run before the first statement: a value the
database would refuse (a boolean for an integer column, a NUL or a lone surrogate in text, a key
too long for its index) would otherwise be a DatabaseError that aborts the caller's transaction,
or a raw TypeError/UnicodeEncodeError. Each raises InvalidInput naming the argument. No I/O."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime

from pgq_supervisor.errors import InvalidInput
from pgq_supervisor.jobs import NewJob, check_type_name

INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1  # the integer columns' range
SURROGATE_RE = re.compile("[\ud800-\udfff]")
# A key of the queue's (concurrency_key, tenant, ordered_key, a signal's or a workflow step's
# name): 1 to 200 characters, the CHECK of each column that stores one (schema/0008, 0021, ...)
MAX_KEY = 200
# well within a btree entry's limit (about 2700 bytes; the key is indexed with created_at)
MAX_UNIQUE_KEY_BYTES = 1024
MAX_ORIGIN = 1000


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}..."


def check_text(
    value: object, what: str, *, max_chars: int | None = None, max_bytes: int | None = None
) -> str:
    """`value` if it is a str PostgreSQL can store in text within the limits: no NUL, no lone
    surrogate (it has no UTF-8), at most `max_chars` characters and `max_bytes` bytes of
    UTF-8."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__} {_shown(value)}")
    if "\x00" in value:
        raise InvalidInput(f"{what} contains a NUL character, which text cannot store")
    if SURROGATE_RE.search(value):
        raise InvalidInput(f"{what} contains a lone surrogate, which has no UTF-8")
    if max_chars is not None and len(value) > max_chars:
        raise InvalidInput(f"{what} must be at most {max_chars} characters, got {len(value)}")
    if max_bytes is not None and len(value.encode()) > max_bytes:
        raise InvalidInput(
            f"{what} must be at most {max_bytes} bytes in UTF-8, got {len(value.encode())}"
        )
    return value


def check_key(value: object, what: str) -> str:
    """`value` if it is a key: a str of 1 to MAX_KEY characters that text can store (no NUL,
    no lone surrogate: check_text's errors)."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_KEY:
        raise InvalidInput(
            f"{what} must be a string of 1 to {MAX_KEY} characters, got {_shown(value)}"
        )
    return check_text(value, what)


def check_int(value: object, what: str, lo: int = INT4_MIN, hi: int = INT4_MAX) -> int:
    """`value` if it is an int (not a bool) from `lo` to `hi`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{what} must be an integer, got {type(value).__name__} {_shown(value)}")
    if not lo <= value <= hi:
        raise InvalidInput(f"{what} must be from {lo} to {hi}, got {value}")
    return value


def check_seconds(value: object, what: str) -> float:
    """`value` if it is a finite number of seconds > 0 (an int or a float, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{what} must be a number of seconds, got {_shown(value)}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidInput(f"{what} must be > 0 seconds, got {value}")
    return float(value)


def check_moment(value: object, what: str) -> datetime:
    """`value` if it is a timezone-aware datetime (a date or a str is not)."""
    if not isinstance(value, datetime):
        raise InvalidInput(
            f"{what} must be a timezone-aware datetime, got {type(value).__name__} {_shown(value)}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(f"{what} must be timezone-aware")
    return value


def not_utf8(args: Sequence[str]) -> str | None:
    """What is wrong with the first command-line argument that is not UTF-8 (Python keeps its
    bytes as lone surrogates, which nothing downstream could encode), or None."""
    for i, arg in enumerate(args, 1):
        if SURROGATE_RE.search(arg):
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            return f"argument {i} is not valid UTF-8: {shown[:60]}"
    return None


def check_new_job(job: NewJob) -> None:
    """Every field of `job` a statement takes, each an InvalidInput naming it (the payload and
    depends_on are the enqueue's own: dump_json, _dependencies)."""
    try:
        check_type_name(job.type)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    check_int(job.priority, "priority")  # a bool is no priority (True would abort the caller)
    if job.max_retry_count is not None:
        check_int(job.max_retry_count, "max_retry_count", 0)
    if job.timeout is not None:
        check_seconds(job.timeout, "timeout")
    if job.start_at is not None:
        check_moment(job.start_at, "start_at")
    if job.unique_key is not None:
        check_text(job.unique_key, "unique_key", max_bytes=MAX_UNIQUE_KEY_BYTES)
    if job.origin is not None:
        check_text(job.origin, "origin", max_chars=MAX_ORIGIN)
    if job.on_dependency_failure not in ("cancel", "run"):
        raise InvalidInput(
            f"on_dependency_failure must be 'cancel' or 'run', got {job.on_dependency_failure!r}"
        )
    if job.concurrency_key is not None:
        check_key(job.concurrency_key, "concurrency_key")
    if job.tenant is not None:
        check_key(job.tenant, "tenant")
