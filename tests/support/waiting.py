"""Waiting on a condition with a deadline: the one way a test waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
FIRST_POLL, SLOWEST_POLL = 0.01, 0.05  # seconds between polls, unless the caller says
DEADLINE = 30.0  # seconds: far beyond what any condition takes on a loaded two-core machine


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout: float = DEADLINE,
    interval: float | None = None,
) -> T:
    """Poll `check` until it returns something truthy and return it; fail the test after
    `timeout` seconds, naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    pause = FIRST_POLL if interval is None else interval
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(pause)  # polling a condition with a deadline
        if interval is None:
            # a wait of more than a few tenths of a second polls less often: each poll may be a
            # new connection or a `ps`, taken from the two cores the processes under test need
            pause = min(pause * 1.25, SLOWEST_POLL)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


def until(check: Callable[[], object], what: str = "condition") -> None:
    """`wait_for` with the arguments the other way round and no value."""
    wait_for(what, check)
