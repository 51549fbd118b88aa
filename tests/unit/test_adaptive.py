"""worker/adaptive.py: the jobs in flight of an async child at the defaults, on a fake clock
and a fake CPU clock; and which children adapt (supervisor/children.py)."""

from __future__ import annotations

import pgq_supervisor as pgq
from pgq_supervisor.settings import load_settings
from pgq_supervisor.worker.adaptive import (
    ADAPTIVE_MOST,
    EVERY,
    START,
    InFlightLimit,
    adaptive_in_flight,
)


class Clocks:
    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def window(self, cpu_share: float) -> None:
        span = EVERY * 1.001  # a window just past EVERY (sums of floats fall short of it)
        self.wall += span
        self.cpu += span * cpu_share


def test_waiting_jobs_with_work_behind_them_double_the_limit_up_to_the_most() -> None:
    c = Clocks()
    limit = InFlightLimit(200, lambda: c.wall, lambda: c.cpu)
    assert limit.limit == START
    seen = []
    for _ in range(6):
        limit.claimed(asked=limit.limit, got=limit.limit, held=limit.limit)  # more waits
        c.window(cpu_share=0.1)
        seen.append(limit.tick(in_flight=limit.limit))
    assert seen == [64, 128, 200, 200, 200, 200]


def test_no_growth_without_work_behind_or_below_the_limit() -> None:
    c = Clocks()
    limit = InFlightLimit(1000, lambda: c.wall, lambda: c.cpu)
    limit.claimed(asked=START, got=5, held=5)  # the queue had only 5
    c.window(cpu_share=0.1)
    assert limit.tick(in_flight=5) == START
    limit.claimed(asked=10, got=10, held=10)  # all it asked, but far below the limit
    c.window(cpu_share=0.1)
    assert limit.tick(in_flight=10) == START


def test_a_busy_cpu_shrinks_the_limit_down_to_one() -> None:
    c = Clocks()
    limit = InFlightLimit(1000, lambda: c.wall, lambda: c.cpu)
    seen = []
    for _ in range(12):
        limit.claimed(asked=limit.limit, got=limit.limit, held=limit.limit)
        c.window(cpu_share=1.0)
        seen.append(limit.tick(in_flight=limit.limit))
    assert seen[:3] == [24, 18, 13] and seen[-1] == 1
    # between LOW and HIGH it holds
    limit = InFlightLimit(1000, lambda: c.wall, lambda: c.cpu)
    limit.claimed(asked=START, got=START, held=START)
    c.window(cpu_share=0.8)
    assert limit.tick(in_flight=START) == START


def test_only_async_children_without_a_concurrency_adapt() -> None:
    registry = pgq.Registry()

    @registry.handler("a")
    async def a(payload: object) -> None:
        return None

    @registry.handler("s")
    def s(payload: object) -> None:
        return None

    defaults = load_settings()
    assert adaptive_in_flight(defaults, registry, ["a"]) == ADAPTIVE_MOST
    assert adaptive_in_flight(defaults, registry, ["a", "s"]) == 0  # one at a time, as before
    assert adaptive_in_flight(defaults, registry, ["s"]) == 0
    assert adaptive_in_flight(load_settings(concurrency=1), registry, ["a"]) == 0  # as given
    assert adaptive_in_flight(load_settings(concurrency=50), registry, ["a"]) == 0
