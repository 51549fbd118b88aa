"""The supervisor's handle on one child process: spawn, messages, kill, exit decoding."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Protocol

from pgq_supervisor.errors import ExitCode
from pgq_supervisor.ipc import FromChild, JobSlot, SlotView, ToChild
from pgq_supervisor.jobs import JobId
from pgq_supervisor.worker import ChildSpec, child_main


class Process(Protocol):
    """What the supervisor needs of a process (multiprocessing's, or a fake in unit tests)."""

    @property
    def pid(self) -> int | None: ...
    @property
    def sentinel(self) -> int: ...
    @property
    def exitcode(self) -> int | None: ...
    def start(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...


# Starts a child; returns it and the supervisor's end of its pipe. Unit tests pass a fake.
Spawner = Callable[[ChildSpec, JobSlot], tuple[Process, Connection]]


def spawn_process(spec: ChildSpec, slot: JobSlot) -> tuple[Process, Connection]:
    """Start a fresh interpreter (spawn: it inherits no connection, lock or thread)."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=True)
    proc: BaseProcess = ctx.Process(
        target=child_main, args=(spec, theirs, slot), name=f"pgq-worker[{spec.index}]"
    )
    proc.start()
    theirs.close()
    return proc, ours


def describe_exit(exitcode: int | None) -> str:
    """'SIGKILL', 'exit code 1', ...; exitcode as multiprocessing decodes it (negative = signal)."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    if exitcode == ExitCode.CHILD_BOOT_FAILURE:
        return "boot failure"
    return f"exit code {exitcode}"


@dataclass
class Child:
    spec: ChildSpec
    proc: Process
    pipe: Connection
    slot: JobSlot
    started_at: float
    ready: bool = False
    idle: bool = False
    stopping: bool = False  # asked to stop (shutdown, SIGTTOU, retiring)
    retiring: bool = False
    kill_reason: str | None = None  # e.g. "timeout after 5 s": recorded as the attempt's error
    kill_job: JobId | None = None  # the job the kill was meant for
    term_sent_at: float | None = None
    kill_sent: bool = False
    boot_error: str | None = None
    boot_app_error: bool = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    @property
    def worker_id(self) -> str:
        return self.spec.worker_id

    def send(self, msg: ToChild) -> bool:
        try:
            self.pipe.send(msg)
            return True
        except OSError:
            return False  # it is exiting; its sentinel will tell us

    def recv_all(self) -> list[FromChild]:
        out: list[FromChild] = []
        try:
            while self.pipe.poll(0):
                out.append(self.pipe.recv())
        except (EOFError, OSError):
            pass
        return out

    def current_job(self) -> SlotView | None:
        return self.slot.read()

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)
