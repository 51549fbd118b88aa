"""The one backoff every connection attempt uses: growth, cap, jitter, reset, deadlines."""

from __future__ import annotations

import random

import pytest

from pgq_supervisor.backoff import Backoff


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_delays_grow_to_the_cap_within_their_jitter_and_reset() -> None:
    clock = FakeClock()
    b = Backoff(initial=0.1, maximum=2.0, jitter=0.25, clock=clock, rng=random.Random(1))
    delays = [b.failed() for _ in range(8)]
    for delay, nominal in zip(delays, [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0], strict=True):
        assert nominal * 0.75 <= delay <= min(nominal * 1.25, 2.0)
    assert b.failures == 8 and not b.ready()
    clock.now = b.retry_at
    assert b.ready()
    b.succeeded()
    assert b.failures == 0 and b.ready()
    assert 0.075 <= b.failed() <= 0.125


def test_jitter_spreads_children_that_fail_together() -> None:
    firsts = {round(Backoff(rng=random.Random(seed)).failed(), 6) for seed in range(20)}
    assert len(firsts) == 20


def test_retry_returns_after_failures_and_raises_at_the_deadline() -> None:
    clock = FakeClock()
    calls: list[float] = []

    def flaky() -> str:
        calls.append(clock.now)
        if len(calls) < 4:
            raise ConnectionError("not yet")
        return "connected"

    b = Backoff(initial=0.1, clock=clock, rng=random.Random(2))
    assert b.retry(flaky, retry_on=ConnectionError, sleep=clock.sleep) == "connected"
    assert len(calls) == 4 and b.failures == 0

    def never() -> str:
        calls.append(clock.now)
        raise ConnectionError("down")

    start = clock.now
    with pytest.raises(ConnectionError, match="down"):
        b.retry(never, retry_on=ConnectionError, deadline=start + 3.0, sleep=clock.sleep)
    assert clock.now <= start + 3.0  # never sleeps past the deadline


def test_retry_gives_up_at_once_when_told() -> None:
    clock = FakeClock()
    calls = 0

    def wrong_password() -> None:
        nonlocal calls
        calls += 1
        raise PermissionError("password authentication failed")

    with pytest.raises(PermissionError):
        Backoff(clock=clock).retry(
            wrong_password, retry_on=PermissionError, give_up=lambda e: True, sleep=clock.sleep
        )
    assert calls == 1


@pytest.mark.parametrize(
    ("initial", "maximum", "multiplier", "jitter"),
    [(0, 5, 2, 0.25), (3, 2, 2, 0.25), (0.1, 5, 0.5, 0.25), (0.1, 5, 2, 1.0)],
)
def test_invalid_schedules_are_refused(
    initial: float, maximum: float, multiplier: float, jitter: float
) -> None:
    with pytest.raises(ValueError):
        Backoff(initial=initial, maximum=maximum, multiplier=multiplier, jitter=jitter)
