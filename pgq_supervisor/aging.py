"""Priority aging of a job type (issue 24): a pending job's priority rises by one for every
`every` seconds it has waited since it was enqueued or last raised, up to `max_priority`, so a
steady stream of higher priorities cannot starve it. Domain type only: the supervisor's
maintenance/aging.py raises the priorities."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from pgq_supervisor.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Aging:
    every: float  # seconds of waiting per step of one priority
    max_priority: int  # aging raises no job past this

    @classmethod
    def parse(cls, type_: str, aging: object) -> Aging:
        """`(every, max_priority)`: every seconds or a timedelta > 0, max_priority an integer;
        ConfigError otherwise."""
        if isinstance(aging, tuple | list) and len(aging) == 2:
            every, top = aging
            if isinstance(every, timedelta):
                every = every.total_seconds()
            if (
                isinstance(every, int | float)
                and not isinstance(every, bool)
                and math.isfinite(every)
                and every > 0
                and isinstance(top, int)
                and not isinstance(top, bool)
                and -(2**31) <= top < 2**31
            ):
                return cls(float(every), top)
        raise ConfigError(
            f"handler {type_!r}: aging must be (every, max_priority) with every seconds or a"
            f" timedelta > 0 and max_priority an integer, got {aging!r}"
        )
