"""Waiting on a condition with a deadline: the one way a test waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
DEADLINE = 30.0  # seconds: far beyond what any condition takes on a loaded two-core machine


def wait_for(
    what: str, check: Callable[[], T | None], timeout: float = DEADLINE, interval: float = 0.01
) -> T:
    """Poll `check` until it returns something truthy and return it; fail the test after
    `timeout` seconds, naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)  # polling a condition with a deadline
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


def until(check: Callable[[], object], what: str = "condition") -> None:
    """`wait_for` with the arguments the other way round and no value."""
    wait_for(what, check)
