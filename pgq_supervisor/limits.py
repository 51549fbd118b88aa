"""A type's rate and concurrency limits, as `Registry.handler` parses them (no I/O)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from pgq_supervisor.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `max_starts` starts of a type per `period` seconds, across every supervisor: no
    window of `period` seconds (by the jobs' started_at, the database clock) holds more. The
    window slides in steps of period / 20 (schema/0007), so a full window frees up at most
    that much later than it could."""

    max_starts: int
    period: float

    @classmethod
    def parse(cls, type_: str, rate: object) -> Rate:
        """`(N, period)` with N a positive integer and period seconds or a timedelta, > 0;
        ConfigError otherwise."""
        if isinstance(rate, tuple | list) and len(rate) == 2:
            n, period = rate
            if isinstance(period, timedelta):
                period = period.total_seconds()
            if (
                isinstance(n, int)
                and not isinstance(n, bool)
                and n > 0
                and isinstance(period, int | float)
                and not isinstance(period, bool)
                and math.isfinite(period)
                and period > 0
            ):
                return cls(n, float(period))
        raise ConfigError(
            f"handler {type_!r}: rate must be (max_starts, period) with max_starts an integer"
            f" > 0 and period seconds or a timedelta > 0, got {rate!r}"
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """Concurrency limits of a type, across every supervisor (schema/0008): at most `global_`
    of its jobs running at once, and at most `per_key` running with one concurrency_key (jobs
    of one key start in claim order). None: no such limit."""

    global_: int | None
    per_key: int | None

    @classmethod
    def parse(cls, type_: str, global_: object, per_key: object) -> Limits | None:
        """None when neither is given; ConfigError unless each given one is an integer > 0."""
        for name, value in (("global_concurrency", global_), ("key_concurrency", per_key)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value <= 0
            ):
                raise ConfigError(
                    f"handler {type_!r}: {name} must be an integer > 0, got {value!r}"
                )
        if global_ is None and per_key is None:
            return None
        assert global_ is None or isinstance(global_, int)
        assert per_key is None or isinstance(per_key, int)
        return cls(global_, per_key)
