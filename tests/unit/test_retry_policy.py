"""RetryPolicy: exponential backoff with full jitter. No database."""

from __future__ import annotations

import random

import pytest

from pgq_supervisor.errors import ConfigError
from pgq_supervisor.registry import RetryPolicy


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(0, 2.0), (1, 2.0), (2, 4.0), (3, 8.0), (5, 32.0), (6, 50.0), (60, 50.0)],
)
def test_delay_stays_within_the_exponential_ceiling(attempt: int, ceiling: float) -> None:
    policy = RetryPolicy(base=2.0, cap=50.0)
    rng = random.Random(1234)
    delays = [policy(attempt, rng) for _ in range(500)]
    assert all(0.0 <= d <= ceiling for d in delays)
    # full jitter: the delays spread over the whole range, not bunched at the ceiling
    assert min(delays) < ceiling * 0.1
    assert max(delays) > ceiling * 0.9


def test_same_seed_same_delays() -> None:
    policy = RetryPolicy()
    first = [policy(n, random.Random(7)) for n in range(1, 6)]
    again = [policy(n, random.Random(7)) for n in range(1, 6)]
    assert first == again


def test_zero_base_means_retry_at_once() -> None:
    policy = RetryPolicy(base=0.0)
    assert {policy(n, random.Random(n)) for n in range(1, 10)} == {0.0}


def test_huge_attempt_numbers_do_not_overflow() -> None:
    assert 0.0 <= RetryPolicy(base=1.0, cap=300.0)(10_000, random.Random(0)) <= 300.0


@pytest.mark.parametrize(("base", "cap"), [(-1.0, 10.0), (1.0, -0.5)])
def test_negative_settings_are_config_errors(base: float, cap: float) -> None:
    with pytest.raises(ConfigError, match="must be >= 0"):
        RetryPolicy(base=base, cap=cap)
