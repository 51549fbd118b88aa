"""The supervisor's timers and the connections they depend on, on a fake clock."""

from __future__ import annotations

import logging
import random

import pytest

from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.settings import load_settings
from pgq_supervisor.supervisor.listener import Listener, parse_due
from pgq_supervisor.supervisor.maintenance import (
    DUE_WAKE,
    ControlConnection,
    ControlDown,
    Services,
    Timer,
    Timers,
    maintenance_timers,
)
from pgq_supervisor.supervisor.metrics import Metrics
from tests.support.fakes import NO_DATABASE, FakeClock


def recorder(ran: list[tuple[str, float]], name: str, sooner: float | None = None) -> Timer:
    def action(now: float) -> float | None:
        ran.append((name, now))
        return sooner

    return Timer(name, action, 10.0)


def test_a_timer_runs_at_once_then_every_interval_within_its_jitter() -> None:
    ran: list[tuple[str, float]] = []
    timers = Timers([recorder(ran, "a")], random.Random(3))
    assert timers.run_due(0.0) == ["a"]
    assert 8.0 <= timers.next_at(stopping=False) <= 12.0
    assert timers.run_due(7.99) == []
    assert timers.run_due(12.0) == ["a"]
    assert [now for _, now in ran] == [0.0, 12.0]


def test_jitter_spreads_timers_that_start_together() -> None:
    nexts = set()
    for seed in range(10):
        timers = Timers([recorder([], "a")], random.Random(seed))
        timers.run_due(0.0)
        nexts.add(timers.next_at(stopping=False))
    assert len(nexts) == 10


def test_a_failing_timer_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[tuple[str, float]] = []

    def broken(now: float) -> None:
        raise DatabaseError("server closed the connection")

    timers = Timers(
        [recorder(ran, "before"), Timer("broken", broken, 10.0), recorder(ran, "after")],
        random.Random(1),
    )
    with caplog.at_level(logging.WARNING):
        assert timers.run_due(0.0) == ["before", "broken", "after"]
    assert [name for name, _ in ran] == ["before", "after"]
    assert [r.getMessage() for r in caplog.records] == [
        "broken failed: server closed the connection"
    ]
    assert timers.by_name["broken"].next_at >= 8.0  # tried again at its next time


def test_a_timer_without_its_connection_waits_for_the_next_attempt_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def needs_db(now: float) -> None:
        raise ControlDown("control connection down", retry_at=now + 0.7)

    timers = Timers([Timer("db", needs_db, 10.0)], random.Random(1))
    with caplog.at_level(logging.WARNING):
        timers.run_due(5.0)
    assert timers.next_at(stopping=False) == 5.7
    assert caplog.records == []


def test_an_action_may_ask_to_run_sooner_and_a_one_shot_runs_once_per_arming() -> None:
    ran: list[tuple[str, float]] = []
    once = Timer("once", lambda now: ran.append(("once", now)), None, next_at=float("inf"))
    timers = Timers([recorder(ran, "soon", sooner=0.5), once], random.Random(1))
    timers.run_due(0.0)
    assert timers.next_at(stopping=False) == 0.5
    once.arm(0.25)
    timers.run_due(0.25)
    timers.run_due(0.3)
    assert ran == [("soon", 0.0), ("once", 0.25)]


def test_only_shutdown_timers_run_while_stopping() -> None:
    ran: list[tuple[str, float]] = []
    keeps = Timer("summary", lambda now: ran.append(("summary", now)), 10.0, in_shutdown=True)
    timers = Timers([recorder(ran, "poll"), keeps], random.Random(1))
    assert timers.run_due(0.0, stopping=True) == ["summary"]
    assert timers.next_at(stopping=True) >= 8.0


def test_rescue_interval_follows_dead_after_unless_set() -> None:
    assert load_settings().rescue_every == 7.5  # dead_after 30 s
    assert load_settings(heartbeat_interval=0.5, dead_after=2).rescue_every == 0.5
    assert load_settings(dead_after=120).rescue_every == 10.0
    assert load_settings(rescue_interval=3).rescue_every == 3.0


def test_the_control_connection_backs_off_between_attempts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    control = ControlConnection(NO_DATABASE, clock=clock, rng=random.Random(1))
    with caplog.at_level(logging.WARNING), pytest.raises(ControlDown) as first:
        control.run(lambda conn: None)
    assert control.backoff.failures == 1 and not control.ok
    assert first.value.retry_at > clock.now
    with pytest.raises(ControlDown):
        control.run(lambda conn: None)  # backing off: no attempt made
    assert control.backoff.failures == 1
    assert len(caplog.records) == 1
    clock.now = first.value.retry_at
    with pytest.raises(ControlDown):
        control.run(lambda conn: None)
    assert control.backoff.failures == 2


def test_the_listener_backs_off_between_attempts() -> None:
    clock = FakeClock()
    listener = Listener(NO_DATABASE, clock=clock, rng=random.Random(1))
    assert listener.connect() is False and listener.backoff.failures == 1
    assert listener.connect() is False and listener.backoff.failures == 1
    clock.now = listener.backoff.retry_at
    assert listener.connect() is False and listener.backoff.failures == 2
    assert not listener.connected


def test_run_soon_brings_a_timer_forward_never_back() -> None:
    ran: list[tuple[str, float]] = []
    timers = Timers([recorder(ran, "a")], random.Random(1))
    timers.by_name["a"].next_at = 50.0
    timers.run_soon("a", 20.0)
    timers.run_soon("a", 30.0)  # later than now due: no change
    timers.run_soon("missing", 0.0)  # a timer this supervisor does not have: nothing
    assert timers.run_due(19.0) == []
    assert timers.run_due(20.0) == ["a"]


@pytest.mark.parametrize(("port", "expected"), [(None, False), (9100, True)])
def test_queue_metrics_run_only_when_metrics_are_served(port: int | None, expected: bool) -> None:
    """The queue gauges count every pending and running job; nothing reads them without a
    metrics server, so without metrics_port the supervisor does not run their queries."""
    settings = load_settings(metrics_port=port)
    clock = FakeClock()
    metrics = Metrics()
    services = Services.from_settings(settings, metrics, clock.now)
    control = ControlConnection(NO_DATABASE, clock=clock, rng=random.Random(1))
    timers = maintenance_timers(
        settings, ["t"], services, control, metrics, lambda n: None,
        now=clock.now, rng=random.Random(1), clock=clock,
    )  # fmt: skip
    assert ("queue-metrics" in timers.by_name) is expected
    assert {"poll", "due-jobs", "rescue"} <= set(timers.by_name)


def run_at_its_time(timers: Timers, timer: Timer, clock: FakeClock) -> float:
    """Run `timer` when it is due; how far off its next run is."""
    clock.now = timer.next_at
    start = clock.now
    timers.run_due(start)
    return timer.next_at - start


def test_rounds_slow_three_times_running_put_a_capped_timers_next_further_off() -> None:
    clock = FakeClock()
    took = [0.2]

    def rescue(now: float) -> None:
        clock.now += took[0]  # the statement's time, spent on the loop

    timer = Timer("rescue", rescue, 10.0, jitter=0.0, next_at=clock.now, max_share=0.005)
    timers = Timers([timer], random.Random(1), clock)
    # the first two slow rounds: no more than one slow round in a row has been seen
    assert run_at_its_time(timers, timer, clock) == pytest.approx(10.0)
    assert run_at_its_time(timers, timer, clock) == pytest.approx(10.0)
    # the third: the least of the last three, 0.2 s, is 2 % of 10 s: 40 s off, not 10
    assert run_at_its_time(timers, timer, clock) == pytest.approx(0.2 / 0.005)
    took[0] = 0.001  # fast again: its interval again at once
    assert run_at_its_time(timers, timer, clock) == pytest.approx(10.0)


def test_one_slow_round_among_fast_ones_puts_nothing_off() -> None:
    """A cold cache or a busy moment makes one round slow; only every round slow (a snapshot
    held back) does, or a dead pod's jobs would wait 200 times that round."""
    clock = FakeClock()
    took = [0.001, 0.001, 0.5, 0.001, 0.001]

    def look(now: float) -> None:
        clock.now += took.pop(0)

    timer = Timer("orphans", look, 0.5, jitter=0.0, next_at=clock.now, max_share=0.005)
    timers = Timers([timer], random.Random(1), clock)
    assert [run_at_its_time(timers, timer, clock) for _ in range(5)] == [pytest.approx(0.5)] * 5


def test_a_capped_timer_is_not_put_off_by_a_run_shorter_than_slow() -> None:
    """The dead-pod look runs every 0.5 s: a round of 10 ms is 2 % of that, and still harmless
    (a wake-up waits less than a claim takes); putting the next off would slow the rescue."""
    clock = FakeClock()

    def look(now: float) -> None:
        clock.now += 0.01

    timer = Timer("orphans", look, 0.5, jitter=0.0, next_at=clock.now, max_share=0.005)
    timers = Timers([timer], random.Random(1), clock)
    assert [run_at_its_time(timers, timer, clock) for _ in range(4)] == [pytest.approx(0.5)] * 4


def test_an_uncapped_timer_keeps_its_interval_however_long_it_took() -> None:
    clock = FakeClock()

    def slow(now: float) -> None:
        clock.now += 5.0

    timer = Timer("prune", slow, 10.0, jitter=0.0, next_at=clock.now)
    Timers([timer], random.Random(1), clock).run_due(clock.now)
    assert timer.next_at == pytest.approx(clock.now - 5.0 + 10.0)


def test_the_timers_that_read_every_running_job_are_capped_and_the_others_are_not() -> None:
    clock = FakeClock()
    settings = load_settings(metrics_port=9999)
    timers = maintenance_timers(
        settings, ["t"], Services.from_settings(settings, Metrics(), clock.now),
        ControlConnection(NO_DATABASE, clock=clock, rng=random.Random(1)), Metrics(),
        lambda n: None, now=clock.now, rng=random.Random(1), clock=clock, me="pod:1:0000aaaa",
    )  # fmt: skip
    capped = {name for name, t in timers.by_name.items() if t.max_share is not None}
    assert capped == {"rescue", "orphans", "queue-metrics"}
    assert len(timers.by_name) > len(capped) + 4


@pytest.mark.parametrize(
    ("payload", "parsed"),
    [
        ("0.5 emails.send", (0.5, "emails.send")),
        ("-2.25 t", (0.0, "t")),  # due already (the writer's transaction stayed open)
        ("1 a type with spaces", (1.0, "a type with spaces")),
        ("soon t", None),
        ("0.5", None),
        ("0.5 ", None),
        ("nan t", None),
        ("inf t", None),
        ("", None),
    ],
)
def test_a_due_notification_names_its_delay_and_type_or_is_dropped(
    payload: str, parsed: tuple[float, str] | None
) -> None:
    assert parse_due(payload) == parsed


def test_a_due_wake_up_wakes_a_child_and_asks_at_once_what_comes_due_next() -> None:
    settings = load_settings()
    clock = FakeClock()
    metrics = Metrics()
    woken: list[int] = []
    control = ControlConnection(NO_DATABASE, clock=clock, rng=random.Random(1))
    timers = maintenance_timers(
        settings, ["t"], Services.from_settings(settings, metrics, clock.now), control, metrics,
        woken.append, now=clock.now, rng=random.Random(1), clock=clock,
    )  # fmt: skip
    timers.run_due(clock.now)  # everything due at start (the poll wakes a child)
    woken.clear()
    due_jobs = timers.by_name["due-jobs"]
    due_jobs.arm(clock.now + 100.0)
    timers.run_soon(DUE_WAKE, clock.now + 0.3)  # a pgq_job_due for a served type

    assert "due-wake" not in timers.run_due(clock.now + 0.29)
    assert woken == []
    assert "due-wake" in timers.run_due(clock.now + 0.3)
    assert woken == [1]
    assert due_jobs.next_at == clock.now + 0.3  # not 100 s later: the next one is asked now
