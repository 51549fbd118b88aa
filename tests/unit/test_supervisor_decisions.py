"""The supervisor's decisions with time and process spawning faked (no child interpreters).

A fake child is a pair of real pipes: the test plays the child's end of the message pipe and
closes the write end of the "sentinel" pipe to make the process look dead.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import pytest

from pgq_supervisor.child import Process, describe_exit
from pgq_supervisor.errors import ExitCode
from pgq_supervisor.ipc import BootFailed, Idle, JobSlot, Ready, Wake
from pgq_supervisor.registry import Registry
from pgq_supervisor.settings import load_settings
from pgq_supervisor.supervisor import Supervisor
from pgq_supervisor.worker import ChildSpec


@dataclass
class FakeProcess:
    index: int
    exit_with: int | None = None
    _r: int = 0
    _w: int = 0
    exitcode: int | None = None
    pid: int | None = None

    def __post_init__(self) -> None:
        self._r, self._w = os.pipe()
        self.pid = 100000 + self.index

    @property
    def sentinel(self) -> int:
        return self._r

    def start(self) -> None:
        pass

    def die(self, code: int) -> None:
        self.exitcode = code
        os.close(self._w)

    def join(self, timeout: float | None = None) -> None:
        pass


@dataclass
class FakeSpawner:
    """Spawns fake children; `on_spawn` decides what each does at once."""

    boot: str = "ok"  # ok | boot_fail | app_fail
    spawned: list[tuple[FakeProcess, Connection]] = field(default_factory=list)

    def __call__(self, spec: ChildSpec, slot: JobSlot) -> tuple[Process, Connection]:
        ours, theirs = multiprocessing.Pipe(duplex=True)
        proc = FakeProcess(spec.index)
        self.spawned.append((proc, theirs))
        if self.boot == "ok":
            theirs.send(Ready(proc.pid or 0))
        else:
            theirs.send(BootFailed("cannot connect", app_error=self.boot == "app_fail"))
            proc.die(ExitCode.CHILD_BOOT_FAILURE)
        return proc, ours


class FakeClock:
    """Time that moves only as the code looks at it: `step` per reading."""

    def __init__(self, step: float = 0.0) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def make(spawner: FakeSpawner, procs: int = 2, step: float = 0.0) -> Supervisor:
    registry = Registry()

    @registry.handler("t")
    def t(payload: dict[str, int]) -> None:
        return None

    settings = load_settings(
        procs=procs, app="x:registry", dsn="host=127.0.0.1 port=1 connect_timeout=1"
    )
    return Supervisor(
        settings, registry, settings.dsn or "", spawner=spawner, clock=FakeClock(step),
        rng=random.Random(1),
    )  # fmt: skip


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
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


def test_repeated_boot_failures_stop_the_supervisor(restore_signals: None) -> None:
    spawner = FakeSpawner(boot="boot_fail")
    sup = make(spawner, procs=1, step=0.05)
    assert sup.run() == 1
    assert 3 <= len(spawner.spawned) <= 4
    assert sup.fatal is not None and "failed to start in a row" in sup.fatal.message


def test_one_notification_wakes_one_idle_child_and_missed_ones_are_owed() -> None:
    spawner = FakeSpawner()
    sup = make(spawner, procs=3)
    now = sup.clock()
    sup._spawn_missing(now)
    for child in sup.children.values():
        sup._on_messages(child)  # Ready
        child.idle = True
    sup._wake(1)
    woken = [theirs for _, theirs in spawner.spawned if theirs.poll(0)]
    assert len(woken) == 1 and isinstance(woken[0].recv(), Wake)
    sup._wake(5)  # two idle children left: three wake-ups are owed
    assert sum(1 for _, theirs in spawner.spawned if theirs.poll(0)) == 2
    assert sup.missed_wakes == 3
    # a child reporting idle while wake-ups are owed is woken again at once
    _first_proc, first_end = spawner.spawned[0]
    while first_end.poll(0):
        first_end.recv()
    first_end.send(Idle())
    sup._on_messages(sup.children[0])
    assert first_end.poll(1) and isinstance(first_end.recv(), Wake)
    assert sup.missed_wakes == 2 and not sup.children[0].idle


def test_crash_loop_backs_off_but_first_crash_respawns_at_once() -> None:
    sup = make(FakeSpawner(), procs=1)
    clock = sup.clock
    assert isinstance(clock, FakeClock)
    sup._spawn_missing(clock())
    delays = []
    for _ in range(6):
        child = sup.children.pop(0)
        sup._schedule_respawn(child, clock(), clean=False)
        delays.append(sup.respawn_at[0] - clock())
        sup._spawn(0, clock())
    assert delays[0] == 0.0
    assert delays == sorted(delays) and delays[-1] > delays[1] > 0
    assert max(delays) <= 10.0
    # a child that lived long before dying is not part of a crash loop
    child = sup.children.pop(0)
    clock.now += 60
    sup._schedule_respawn(child, clock(), clean=False)
    assert sup.respawn_at[0] == clock()
