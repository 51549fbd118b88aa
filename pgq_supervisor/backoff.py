"""One jittered backoff for every connection attempt (after psycopg_pool's ConnectionAttempt).

After a PostgreSQL restart every child of every pod reconnects at once; jitter spreads them so
they do not retry in lockstep. Time is injected, so the schedule is testable without sleeping.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Backoff:
    """Delays that grow by `multiplier` from `initial` up to `maximum`, each spread by ±`jitter`
    (a fraction of the delay). `failed()` schedules the next attempt; `succeeded()` resets.

    Non-blocking callers (the supervisor's loop) ask `ready()`; blocking ones use `retry()`.
    """

    def __init__(
        self,
        *,
        initial: float = 0.1,
        maximum: float = 5.0,
        multiplier: float = 2.0,
        jitter: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"need 0 < initial <= maximum, got {initial}, {maximum}")
        if multiplier < 1 or not 0 <= jitter < 1:
            raise ValueError(
                f"need multiplier >= 1 and 0 <= jitter < 1, got {multiplier}, {jitter}"
            )
        self.initial = initial
        self.maximum = maximum
        self.multiplier = multiplier
        self.jitter = jitter
        self.clock = clock
        self.rng = rng or random.Random()
        self._next = initial
        self.failures = 0
        self.retry_at = 0.0

    def failed(self) -> float:
        """Record a failed attempt; returns the delay before the next one."""
        delay = self._next * self.rng.uniform(1 - self.jitter, 1 + self.jitter)
        delay = min(delay, self.maximum)
        self._next = min(self._next * self.multiplier, self.maximum)
        self.failures += 1
        self.retry_at = self.clock() + delay
        return delay

    def succeeded(self) -> None:
        self._next = self.initial
        self.failures = 0
        self.retry_at = 0.0

    def ready(self) -> bool:
        """May the next attempt be made now?"""
        return self.clock() >= self.retry_at

    def retry(
        self,
        attempt: Callable[[], T],
        *,
        retry_on: type[Exception] | tuple[type[Exception], ...],
        deadline: float | None = None,
        give_up: Callable[[Exception], bool] = lambda exc: False,
        sleep: Callable[[float], object] = time.sleep,
    ) -> T:
        """Call `attempt` until it returns, sleeping between failures.

        Raises the last error when `give_up(error)` says retrying cannot help, or when the next
        attempt would start after `deadline` (on this backoff's clock; None = no deadline).
        """
        while True:
            try:
                result = attempt()
            except retry_on as exc:
                delay = self.failed()
                if give_up(exc) or (deadline is not None and self.retry_at > deadline):
                    raise
                sleep(delay)
                continue
            self.succeeded()
            return result
