"""The supervisor's decisions with time and process spawning faked (no child interpreters).

Each test drives the real loop through `run_once` and the public handlers; fake children
(tests/support/fakes.py) answer over real pipes. No database: its address refuses at once.
"""

from __future__ import annotations

import itertools
import signal
import uuid
from collections.abc import Iterator

import pytest

from pgq_supervisor.errors import ExitCode
from pgq_supervisor.ipc import Idle, Stop, Wake
from pgq_supervisor.jobs import JobId
from pgq_supervisor.registry import Registry
from pgq_supervisor.settings import load_settings
from pgq_supervisor.supervisor.children import KILL_GRACE, ChildState, describe_exit
from pgq_supervisor.supervisor.loop import Supervisor
from tests.support.fakes import NO_DATABASE, FakeClock, FakeSpawner, make_supervisor

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGTTIN, signal.SIGTTOU)


def make(spawner: FakeSpawner, clock: FakeClock | None = None, procs: int = 2) -> Supervisor:
    registry = Registry()

    @registry.handler("t")
    def t(payload: dict[str, int]) -> None:
        return None

    settings = load_settings(procs=procs, app="x:registry", dsn=NO_DATABASE)
    return make_supervisor(settings, registry, spawner, clock or FakeClock())


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in HANDLED}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_describe_exit() -> None:
    assert describe_exit(-9) == "SIGKILL"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(ExitCode.CHILD_BOOT_FAILURE) == "boot failure"


def test_child_that_cannot_load_the_app_stops_the_supervisor_with_code_3(
    restore_signals: None,
) -> None:
    spawner = FakeSpawner(boot="app_fail")
    sup = make(spawner)
    assert sup.run() == 3
    assert len(spawner.spawned) <= 2  # no respawn storm
    assert sup.fatal is not None and "could not load the app" in sup.fatal.message


def test_children_that_cannot_connect_back_off_while_the_others_work() -> None:
    """Issue 27: three boot failures in a row stopped the supervisor (exit 1) and the children
    that were working. Now each index is spawned again after its jittered backoff, for as long
    as it takes, the working child untouched; a metric counts the failures."""
    spawner, clock = FakeSpawner(), FakeClock()
    sup = make(spawner, clock, procs=1)
    sup.run_once(0)
    assert sup.respawns.failing == 0
    worker = spawner.live()[0]
    spawner.boot = "boot_fail"  # the database has no connection left for another child
    sup.handle_sigttin()
    spawned_at: list[float] = []
    while len(spawned_at) < 7:
        before = len(spawner.spawned)
        sup.run_once(0)
        spawned_at += [clock.now] * (len(spawner.spawned) - before)
        clock.now += 0.05
        assert clock.now < 1200, "never respawned"
    assert sup.fatal is None and not sup.stopping
    assert spawner.live() == {0: worker} and worker.received() == []
    assert sup.respawns.failing == 1
    gaps = [b - a for a, b in itertools.pairwise(spawned_at)]
    for gap, nominal in zip(gaps, [1, 2, 4, 8, 16, 30], strict=True):  # BOOT_RETRY doubling
        assert nominal * 0.75 - 0.1 <= gap <= nominal * 1.25 + 0.1, gaps
    assert len({round(g, 2) for g in gaps}) == len(gaps)  # jittered
    sup.run_once(0)  # the last one's exit is reaped
    failures = sup.metrics.registry.get_sample_value("pgq_child_boot_failures_total")
    assert failures == 7
    spawner.boot = "ok"  # connections freed: the next try starts, and the index is well again
    while sup.respawns.failing:
        sup.run_once(0)
        clock.now += 0.05
        assert clock.now < 1300, "never started"
    assert set(spawner.live()) == {0, 1}


def test_one_notification_wakes_one_idle_child_and_missed_ones_are_owed() -> None:
    spawner = FakeSpawner()
    sup = make(spawner, procs=3)
    sup.run_once(0)  # spawns three; the first poll owes a wake-up, as nobody is idle yet
    assert sup.missed_wakes == 1
    for child in spawner.live().values():
        child.send(Idle())
    sup.run_once(0)  # the first to report idle takes the owed wake-up at once
    (owed,) = [c for c in spawner.live().values() if c.received()]
    assert sup.missed_wakes == 0 and sup.children[owed.spec.index].state is ChildState.BUSY
    owed.send(Idle())
    sup.run_once(0)
    assert all(c.state is ChildState.IDLE for c in sup.children.values())

    sup.wake(1)
    woken = {i: c.received() for i, c in spawner.live().items()}
    assert [type(m) for msgs in woken.values() for m in msgs] == [Wake]
    sup.wake(5)  # two idle children left: three wake-ups are owed
    assert sum(len(c.received()) for c in spawner.live().values()) == 2
    assert sup.missed_wakes == 3
    # a child reporting idle while wake-ups are owed is woken again at once
    first = spawner.live()[0]
    first.send(Idle())
    sup.run_once(0)
    assert [type(m) for m in first.received()] == [Wake]
    assert sup.missed_wakes == 2 and sup.children[0].state is ChildState.BUSY


def respawn_delay(sup: Supervisor, spawner: FakeSpawner, clock: FakeClock, index: int) -> float:
    """Kill the child at `index`; fake seconds until the supervisor spawns its successor."""
    before = len(spawner.spawned)
    spawner.live()[index].proc.die(-signal.SIGKILL)
    died_at = clock.now
    sup.run_once(0)
    while len(spawner.spawned) == before:
        assert clock.now - died_at < 30, "never respawned"
        clock.now += 0.01
        sup.run_once(0)
    return round(clock.now - died_at, 2)


def test_crash_loop_backs_off_but_first_crash_respawns_at_once() -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = make(spawner, clock, procs=1)
    sup.run_once(0)
    delays = [respawn_delay(sup, spawner, clock, 0) for _ in range(6)]
    assert delays[0] == 0.0
    assert delays == sorted(delays) and delays[-1] > delays[1] > 0
    assert max(delays) <= 10.0
    # a child that lived long before dying is not part of a crash loop
    clock.now += 60
    assert respawn_delay(sup, spawner, clock, 0) == 0.0
    sup.close()


def test_a_job_past_its_timeout_gets_sigterm_then_sigkill_on_the_injected_clock() -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = make(spawner, clock, procs=1)
    sup.run_once(0)
    child = spawner.live()[0]
    child.start_job(JobId(uuid.uuid4()), "t", started=clock.now, timeout=5.0)
    clock.now += 4.9
    sup.run_once(0)
    assert child.proc.signals == [] and not child.slot.kill_marked
    clock.now += 0.2
    sup.run_once(0)
    assert child.proc.signals == [signal.SIGTERM]  # this fake ignores it, as a hung child may
    assert child.slot.kill_marked  # so the child dies of it, rather than stopping
    assert sup.children[0].state is ChildState.TERMINATING
    assert sup.children[0].kill_reason == "timeout after 5 s"
    clock.now += KILL_GRACE - 0.1
    sup.run_once(0)
    assert child.proc.signals == [signal.SIGTERM]
    clock.now += 0.2
    sup.run_once(0)
    assert child.proc.signals == [signal.SIGTERM, signal.SIGKILL]
    sup.run_once(0)  # reaped; a first crash respawns at once
    assert spawner.live()[0] is not child
    sup.close()


def test_signals_are_recorded_then_handled_by_the_loop(restore_signals: None) -> None:
    spawner = FakeSpawner()
    sup = make(spawner, procs=2)
    sup.install_signals()
    try:
        sup.run_once(0)
        signal.raise_signal(signal.SIGTTIN)
        sup.run_once(0)
        assert sup.target == 3 and sorted(spawner.live()) == [0, 1, 2]
        signal.raise_signal(signal.SIGTTOU)
        sup.run_once(0)
        third = spawner.live()[2]
        assert sup.target == 2 and third.received() == [Stop()]
        assert sup.children[2].state is ChildState.STOPPING
        third.proc.die(0)
        sup.run_once(0)
        assert sorted(sup.children) == [0, 1] and sorted(spawner.live()) == [0, 1]

        signal.raise_signal(signal.SIGTERM)
        sup.run_once(0)
        assert sup.stopping and not sup.finished
        for child in spawner.live().values():
            assert child.received() == [Stop()]
            child.proc.die(0)
        sup.run_once(0)
        assert sup.finished and sup.exit_code is ExitCode.OK
    finally:
        sup.close()


def test_second_sigint_kills_the_children_and_exits_130() -> None:
    spawner = FakeSpawner()
    sup = make(spawner, procs=2)
    sup.run_once(0)
    sup.handle_sigint()
    assert all(c.state is ChildState.STOPPING for c in sup.children.values())
    sup.handle_sigint()
    assert all(c.proc.signals == [signal.SIGKILL] for c in spawner.spawned)
    sup.run_once(0)
    assert sup.finished and sup.exit_code is ExitCode.INTERRUPTED
    sup.close()


def test_a_child_whose_heartbeat_gave_up_is_stopped_for_it() -> None:
    """The child marks its slot (worker/heartbeat.py); the supervisor kills it as it kills for
    a timeout, with a reason that charges no attempt (verdicts.py)."""
    spawner, clock = FakeSpawner(), FakeClock()
    sup = make(spawner, clock, procs=1)
    sup.run_once(0)
    child = spawner.live()[0]
    child.start_job(JobId(uuid.uuid4()), "t", started=clock.now)
    sup.run_once(0)
    assert child.proc.signals == []
    child.slot.mark_heartbeat_lost()
    sup.run_once(0)
    assert child.proc.signals == [signal.SIGTERM] and child.slot.kill_marked
    assert sup.children[0].kill_reason == "heartbeat lost"
    assert sup.children[0].state is ChildState.TERMINATING
