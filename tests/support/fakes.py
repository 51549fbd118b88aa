"""Fake children and a fake clock for driving the real Supervisor loop one turn at a time.

A fake child is real pipes without an interpreter: the test plays the child's end of the
message pipe, writes its shared slot as a worker would, and closes the write end of a
"sentinel" pipe to make the process look dead. Signals the supervisor sends are recorded,
never delivered to any process (a fake's pid belongs to nobody).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from pgq_supervisor.errors import ExitCode
from pgq_supervisor.ipc import BootFailed, ChildSpec, FromChild, JobSlot, Ready, ToChild
from pgq_supervisor.jobs import JobId
from pgq_supervisor.registry import Registry
from pgq_supervisor.settings import Settings
from pgq_supervisor.supervisor.children import Process
from pgq_supervisor.supervisor.loop import Supervisor
from pgq_supervisor.supervisor.maintenance import Services

NO_DATABASE = "host=127.0.0.1 port=1 connect_timeout=1"  # refused at once


class FakeClock:
    """Time that moves only when told (`now += ...`), or by `step` per reading."""

    def __init__(self, step: float = 0.0) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@dataclass
class FakeProcess:
    index: int
    exitcode: int | None = None
    signals: list[signal.Signals] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._r, self._w = os.pipe()

    @property
    def pid(self) -> int:
        return 100000 + self.index

    @property
    def sentinel(self) -> int:
        return self._r

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass

    def die(self, code: int) -> None:
        if self.exitcode is None:
            self.exitcode = code
            os.close(self._w)

    def terminate(self) -> None:
        self.signals.append(signal.SIGTERM)  # a hung child ignores it: the test decides

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.die(-signal.SIGKILL)


@dataclass
class FakeChild:
    spec: ChildSpec
    slot: JobSlot
    proc: FakeProcess
    pipe: Connection  # the child's end

    def send(self, msg: FromChild) -> None:
        self.pipe.send(msg)

    def received(self) -> list[ToChild]:
        """What the supervisor sent since the last call."""
        out: list[ToChild] = []
        while self.pipe.poll(0):
            out.append(self.pipe.recv())
        return out

    def start_job(
        self, job_id: JobId, job_type: str, *, started: float, timeout: float | None = None
    ) -> None:
        """Write the slot as a worker does when it starts a job (attempt 1)."""
        self.slot.set(job_id, started, timeout, 1, job_type)


@dataclass
class FakeSpawner:
    """Spawns fake children. `boot`: what each does at once (ok: says Ready)."""

    boot: str = "ok"  # ok | boot_fail | app_fail
    spawned: list[FakeChild] = field(default_factory=list)

    def __call__(self, spec: ChildSpec, slot: JobSlot) -> tuple[Process, Connection]:
        ours, theirs = multiprocessing.Pipe(duplex=True)
        proc = FakeProcess(spec.index)
        self.spawned.append(FakeChild(spec, slot, proc, theirs))
        if self.boot == "ok":
            theirs.send(Ready(proc.pid))
        else:
            theirs.send(BootFailed("cannot connect", app_error=self.boot == "app_fail"))
            proc.die(ExitCode.CHILD_BOOT_FAILURE)
        return proc, ours

    def live(self) -> dict[int, FakeChild]:
        """The latest fake child of each index that has not died."""
        return {c.spec.index: c for c in self.spawned if c.proc.exitcode is None}


def make_supervisor(
    settings: Settings,
    registry: Registry,
    spawner: FakeSpawner,
    clock: FakeClock,
    *,
    services: Services | None = None,
) -> Supervisor:
    return Supervisor(
        settings,
        registry,
        settings.dsn or NO_DATABASE,
        spawner=spawner,
        clock=clock,
        rng=random.Random(1),
        services=services,
    )
