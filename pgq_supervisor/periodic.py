"""Periodic schedules and their tick arithmetic. No database, no processes.

A schedule names a job (type, payload, priority) and when to enqueue it: a cron expression
(5 fields, or 6 with seconds first; parsed by `cronsim`) in a timezone, or a fixed interval
`every`. Its ticks are the instants it is due. Time here is always an aware datetime; the
scheduler passes the database's clock so every supervisor agrees on what is due.

Interval ticks are anchored on the Unix epoch (UTC): `every=timedelta(hours=1)` ticks on the
hour, whichever supervisor computes it. Cron ticks follow the wall clock of the schedule's
timezone, with Debian cron's rules at DST transitions (cronsim's):
- spring forward: a fixed-time job whose time falls in the skipped hour runs once, right after
  the jump (`30 2 * * *` in Europe/Berlin on the last Sunday of March runs at 03:00);
- fall back: a fixed-time job in the repeated hour runs once, at its first occurrence;
- jobs that run more often than hourly (`*/30 * * * *`) follow real time: every half hour, the
  repeated hour included.

After downtime (ticks in the past that were never enqueued) only the most recent missed tick is
enqueued, or the `catch_up` most recent ones when the schedule has catch_up = N > 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from pgq_supervisor.errors import ConfigError, InvalidInput
from pgq_supervisor.jobs import JsonValue
from pgq_supervisor.jsontext import dump_payload

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")  # no "@": it ends the name in a tick's key


@dataclass(frozen=True, slots=True)
class Schedule:
    """One periodic job. Build it with `Schedule.make` (which checks everything) or through
    `Registry.periodic`."""

    name: str
    type: str
    cron: str | None
    every: timedelta | None
    timezone: str = "UTC"
    payload: JsonValue = None
    priority: int = 0
    catch_up: int = 0
    zone: ZoneInfo = field(default=ZoneInfo("UTC"), compare=False, repr=False)

    @classmethod
    def make(
        cls,
        name: str,
        *,
        type: str,
        cron: str | None = None,
        every: timedelta | None = None,
        timezone: str = "UTC",
        payload: JsonValue = None,
        priority: int = 0,
        catch_up: int = 0,
    ) -> Schedule:
        """A checked schedule; ConfigError naming it when something is wrong."""
        if not _NAME_RE.match(name):
            raise ConfigError(f"periodic {name!r}: a name is 1-100 letters, digits or _ . : -")

        def bad(why: str) -> ConfigError:
            return ConfigError(f"periodic {name!r}: {why}")

        if (cron is None) == (every is None):
            raise bad("give exactly one of cron= or every=")
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise bad(f"unknown timezone {timezone!r}") from None
        if cron is not None:
            try:
                CronSim(cron, datetime.now(zone))
            except CronSimError as exc:
                raise bad(f"invalid cron {cron!r}: {exc}") from None
        if every is not None:
            if every < timedelta(seconds=1) or every % timedelta(seconds=1):
                raise bad(f"every must be a whole number of seconds >= 1 s, got {every}")
            if timezone != "UTC":
                raise bad("timezone applies to cron only (intervals are anchored on UTC)")
        if catch_up < 0:
            raise bad(f"catch_up must be >= 0, got {catch_up}")
        if not -(2**31) <= priority < 2**31:
            raise bad(f"priority must fit in 32 bits, got {priority}")
        try:
            # what jsonb would refuse, or over the payload cap, makes every enqueue of it fail
            dump_payload(payload)
        except InvalidInput as exc:
            raise bad(str(exc)) from None
        return cls(name, type, cron, every, timezone, payload, priority, catch_up, zone)

    @property
    def when(self) -> str:
        """The cron expression, or `every <interval>`, for people."""
        return self.cron if self.cron is not None else f"every {self.every}"

    @property
    def keep(self) -> int:
        """How many of the most recent missed ticks one run enqueues."""
        return max(1, self.catch_up)

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after `after` (UTC)."""
        if self.every is not None:
            k = (after - EPOCH) // self.every + 1
            return EPOCH + k * self.every
        assert self.cron is not None
        return next(CronSim(self.cron, after.astimezone(self.zone))).astimezone(UTC)

    def due_ticks(self, after: datetime, now: datetime) -> list[datetime]:
        """The ticks t with after < t <= now to enqueue, oldest first: the `keep` most recent."""
        found: list[datetime] = []
        if self.every is not None:
            last = EPOCH + ((now - EPOCH) // self.every) * self.every
            while last > after and len(found) < self.keep:
                found.append(last)
                last -= self.every
        else:
            assert self.cron is not None
            # backwards from just after `now`: cronsim's iteration excludes its start
            ticks = CronSim(self.cron, (now + _MICRO).astimezone(self.zone), reverse=True)
            for tick in ticks:
                utc = tick.astimezone(UTC)
                if utc <= after or len(found) >= self.keep:
                    break
                found.append(utc)
        return found[::-1]
