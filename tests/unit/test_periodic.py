"""Schedules: their ticks on an explicit clock (DST included), and every way to declare one
wrong being one ConfigError that names it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

import pgq_supervisor as pgq
from pgq_supervisor.errors import ConfigError
from pgq_supervisor.periodic import Schedule

BERLIN = ZoneInfo("Europe/Berlin")


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, us, tzinfo=UTC)


def cron(expr: str, tz: str = "UTC", catch_up: int = 0) -> Schedule:
    return Schedule.make("s", type="t", cron=expr, timezone=tz, catch_up=catch_up)


def every(seconds: float, catch_up: int = 0) -> Schedule:
    return Schedule.make("s", type="t", every=timedelta(seconds=seconds), catch_up=catch_up)


def forward(schedule: Schedule, start: datetime, n: int) -> list[datetime]:
    out, t = [], start
    for _ in range(n):
        t = schedule.next_tick(t)
        out.append(t)
    return out


# ---- ticks ----


def test_intervals_are_anchored_on_the_epoch_whoever_computes_them() -> None:
    s = every(3600)
    assert s.next_tick(utc(2026, 5, 1, 10, 17, 3)) == utc(2026, 5, 1, 11)
    assert s.next_tick(utc(2026, 5, 1, 11)) == utc(2026, 5, 1, 12)  # strictly after
    assert forward(every(2), utc(2026, 5, 1, 0, 0, 1), 3) == [
        utc(2026, 5, 1, 0, 0, 2), utc(2026, 5, 1, 0, 0, 4), utc(2026, 5, 1, 0, 0, 6),
    ]  # fmt: skip


def test_a_tick_at_now_is_due_and_only_ticks_after_the_last_one() -> None:
    s = every(10)
    now = utc(2026, 5, 1, 0, 1, 0)
    assert s.due_ticks(utc(2026, 5, 1, 0, 0, 55), now) == [now]
    assert s.due_ticks(now, now) == []
    c = cron("* * * * *")
    assert c.due_ticks(utc(2026, 5, 1, 0, 0, 30), now) == [now]
    assert c.due_ticks(now, now + timedelta(seconds=59)) == []


def test_after_downtime_only_the_most_recent_missed_tick_unless_catch_up() -> None:
    last, now = utc(2026, 5, 1, 0, 0, 0), utc(2026, 5, 1, 0, 0, 9, 500000)
    assert every(1).due_ticks(last, now) == [utc(2026, 5, 1, 0, 0, 9)]
    assert every(1, catch_up=1).due_ticks(last, now) == [utc(2026, 5, 1, 0, 0, 9)]
    assert every(1, catch_up=3).due_ticks(last, now) == [
        utc(2026, 5, 1, 0, 0, 7), utc(2026, 5, 1, 0, 0, 8), utc(2026, 5, 1, 0, 0, 9),
    ]  # fmt: skip
    # fewer missed than catch_up: all of them
    assert every(1, catch_up=30).due_ticks(last, utc(2026, 5, 1, 0, 0, 2)) == [
        utc(2026, 5, 1, 0, 0, 1), utc(2026, 5, 1, 0, 0, 2),
    ]  # fmt: skip
    nightly = cron("0 3 * * *", catch_up=2)
    assert nightly.due_ticks(utc(2026, 4, 1, 3), utc(2026, 5, 1, 12)) == [
        utc(2026, 4, 30, 3), utc(2026, 5, 1, 3),
    ]  # fmt: skip


def test_six_fields_put_seconds_first() -> None:
    s = cron("*/15 * * * * *")
    assert forward(s, utc(2026, 5, 1, 0, 0, 1), 3) == [
        utc(2026, 5, 1, 0, 0, 15), utc(2026, 5, 1, 0, 0, 30), utc(2026, 5, 1, 0, 0, 45),
    ]  # fmt: skip


def test_cron_follows_the_wall_clock_of_its_timezone() -> None:
    s = cron("0 9 * * MON-FRI", "America/New_York")
    # Friday 2026-05-01 09:00 EDT is 13:00 UTC; then Monday
    assert forward(s, utc(2026, 5, 1, 12), 2) == [utc(2026, 5, 1, 13), utc(2026, 5, 4, 13)]


def test_dst_spring_forward_a_time_in_the_skipped_hour_runs_once_right_after() -> None:
    # Europe/Berlin jumps from 02:00 to 03:00 CET->CEST on 2026-03-29 (01:00 UTC)
    s = cron("30 2 * * *", "Europe/Berlin")
    ticks = forward(s, utc(2026, 3, 27, 12), 3)
    assert [t.astimezone(BERLIN).strftime("%d %H:%M") for t in ticks] == [
        "28 02:30", "29 03:00", "30 02:30",
    ]  # fmt: skip
    # sub-hourly schedules follow real time: no tick in the hour that does not exist
    half = forward(cron("*/30 * * * *", "Europe/Berlin"), utc(2026, 3, 29, 0, 15), 4)
    assert half == [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 30),
                    utc(2026, 3, 29, 2)]  # fmt: skip


def test_dst_fall_back_a_time_in_the_repeated_hour_runs_once() -> None:
    # 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00 UTC); 02:30 happens twice
    s = cron("30 2 * * *", "Europe/Berlin")
    assert forward(s, utc(2026, 10, 24, 12), 2) == [
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]
    # looking back from after the repeated hour finds the same single tick
    assert s.due_ticks(utc(2026, 10, 24, 12), utc(2026, 10, 25, 6)) == [utc(2026, 10, 25, 0, 30)]
    # sub-hourly schedules run through both 02:xx hours: every half hour of real time
    half = forward(cron("*/30 * * * *", "Europe/Berlin"), utc(2026, 10, 24, 23, 45), 5)
    assert half == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1),
                    utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 2)]  # fmt: skip


# ---- declaring ----


def _registry() -> pgq.Registry:
    registry = pgq.Registry()

    @registry.handler("report")
    def report(payload: dict[str, int]) -> None: ...

    @registry.handler("any")
    def anything(payload: object) -> None: ...

    return registry


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron '61 \\* \\* \\* \\*'"),
        ({"cron": "* * * *"}, "invalid cron"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
        ({}, "give exactly one of cron= or every="),
        (
            {"cron": "* * * * *", "every": timedelta(seconds=5)},
            "give exactly one of cron= or every=",
        ),
        ({"every": timedelta(seconds=5), "catch_up": -1}, "catch_up must be >= 0"),
        ({"every": timedelta(milliseconds=1500)}, "whole number of seconds"),
        ({"every": timedelta(0)}, "whole number of seconds >= 1 s"),
        ({"every": timedelta(seconds=5), "timezone": "Europe/Berlin"}, "cron only"),
        ({"cron": "* * * * *", "type": "nope"}, "no handler for job type 'nope'"),
        ({"cron": "* * * * *", "payload": {"n": "x"}}, "payload for 'report' is invalid"),
        ({"cron": "* * * * *", "payload": {"n": float("nan")}}, "not JSON-serializable"),
        ({"cron": "* * * * *", "type": "any", "payload": "a\x00b"}, "NUL character"),
    ],
)
def test_an_invalid_schedule_is_one_config_error_naming_it(
    kwargs: dict[str, object], message: str
) -> None:
    registry = _registry()
    args: dict[str, object] = {"type": "report", "payload": {}, **kwargs}
    with pytest.raises(ConfigError, match=f"^periodic 'nightly': .*{message}"):
        registry.periodic("nightly", **args)  # type: ignore[arg-type]
    assert registry.schedules == {}


def test_declared_by_type_or_as_a_decorator_above_the_handler() -> None:
    registry = _registry()
    registry.periodic("hourly", every=timedelta(hours=1), type="report", payload={"n": 1})

    @registry.periodic("nightly", cron="0 3 * * *", timezone="Europe/Berlin", catch_up=2)
    @registry.handler("cleanup")
    def cleanup(payload: object) -> None: ...

    assert sorted(registry.schedules) == ["hourly", "nightly"]
    nightly = registry.schedules["nightly"]
    assert (nightly.type, nightly.when, nightly.timezone, nightly.keep) == (
        "cleanup", "0 3 * * *", "Europe/Berlin", 2,
    )  # fmt: skip
    assert registry.schedules["hourly"].when == "every 1:00:00"
    assert [s.name for s in registry.schedules_for(["cleanup"])] == ["nightly"]

    with pytest.raises(ConfigError, match="periodic 'hourly' is declared twice"):
        registry.periodic("hourly", every=timedelta(hours=2), type="report", payload={})


def test_without_a_payload_the_error_says_the_payload_is_null() -> None:
    """The default payload is null, as enqueue's: a handler taking a dict rejects it, and the
    error says where the null came from."""
    registry = _registry()
    with pytest.raises(
        ConfigError,
        match=r"^periodic 'nightly': payload for 'report' is invalid: .*dictionary"
        r" \(no payload= given: the payload is null\)$",
    ):
        registry.periodic("nightly", cron="0 3 * * *")(registry.handlers["report"].func)
    registry.periodic("nightly", cron="0 3 * * *", type="any")
    assert registry.schedules["nightly"].payload is None


def test_a_decorator_below_the_handler_or_on_a_plain_function_is_an_error() -> None:
    registry = _registry()

    def plain(payload: object) -> None: ...

    with pytest.raises(ConfigError, match="periodic 'p': 'plain' is not a registered handler"):
        registry.periodic("p", every=timedelta(seconds=1))(plain)
