"""A job type's policy: how long an attempt may run, how many retries, how long to wait
before each (RetryPolicy or a custom Backoff). Resolved once, at registration (registry.py);
the worker, the executor and the supervisor ask it rather than each working it out."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from pgq_supervisor.errors import ConfigError
from pgq_supervisor.jobs import Job

DEFAULT_MAX_RETRY_COUNT = 3
# A handler snoozing its job more often than this waits for something that does not come.
DEFAULT_MAX_SNOOZES = 100


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter: retry n waits uniform(0, min(cap, base * 2**(n-1)))."""

    base: float = 1.0
    cap: float = 300.0

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ConfigError(f"retry base and cap must be >= 0, got {self.base}, {self.cap}")

    def __call__(self, attempt: int, rng: random.Random) -> float:
        """Delay before the retry that follows failed attempt `attempt` (1-based)."""
        # the exponent is clamped: 2**1024 overflows, and a job may retry more often than that
        ceiling = min(self.cap, self.base * math.pow(2.0, min(max(0, attempt - 1), 1000)))
        return rng.uniform(0.0, ceiling)


# A custom policy: (failed attempt number, rng) -> seconds to wait.
Backoff = Callable[[int, random.Random], float]


@dataclass(frozen=True, slots=True)
class Policy:
    """What a job type's handler allows: how long an attempt may run, how many retries, and
    how long to wait before each."""

    timeout: float | None
    max_retry_count: int
    backoff: Backoff
    max_snoozes: int = DEFAULT_MAX_SNOOZES  # pgq.Snooze: past this many, the job fails

    def timeout_for(self, job: Job) -> float | None:
        """The job's own timeout if it was enqueued with one, else the handler's."""
        return job.timeout or self.timeout

    def retry_delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before the retry that follows failed attempt `attempt` (1-based)."""
        return self.backoff(attempt, rng)


def _no_retry(attempt: int, rng: random.Random) -> float:
    return 0.0


# A job whose type has no handler here: it fails at once, under its own timeout if any.
UNHANDLED = Policy(timeout=None, max_retry_count=0, backoff=_no_retry)


@dataclass(frozen=True, slots=True)
class ClaimPolicy:
    """The arrays a claim passes: the types a worker takes and each one's retry budget (the
    claim stores it on jobs enqueued without their own)."""

    types: tuple[str, ...]
    max_retry_counts: tuple[int, ...]
