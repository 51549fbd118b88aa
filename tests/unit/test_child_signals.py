"""A child's SIGTERM (signals.ChildSignals): a stop, recorded for the loop and never raised into
the job's code; a kill only when the supervisor marked the child's slot first.

Real signals to real processes: spawned ones stand in for children (they install the handler
as worker.child_main does), so a signal that kills does not kill the test."""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from pgq_supervisor.ipc import JobSlot, Retiring
from pgq_supervisor.signals import ChildSignals
from pgq_supervisor.worker.base import stop_on_sigterm


@pytest.fixture
def restore_sigterm() -> Iterator[None]:
    saved = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, saved)


def test_a_sigterm_is_recorded_wakes_the_loop_and_raises_nothing(restore_sigterm: None) -> None:
    signals = ChildSignals(JobSlot())
    reader = signals.install()
    ours, theirs = multiprocessing.Pipe()
    try:
        assert not signals.pending
        signal.raise_signal(signal.SIGTERM)  # the handler runs here: it must not raise
        assert signals.pending
        assert select.select([reader], [], [], 5)[0] == [reader]  # the loop's wait wakes
        assert stop_on_sigterm(signals, theirs, "w", stopping=False)
        assert ours.recv() == Retiring("SIGTERM")  # a clean exit, for the supervisor
        assert not signals.pending and select.select([reader], [], [], 0)[0] == []
        # nothing recorded: no stop; a stop already under way tells the supervisor nothing more
        assert not stop_on_sigterm(signals, theirs, "w", stopping=False)
        signal.raise_signal(signal.SIGTERM)
        assert stop_on_sigterm(signals, theirs, "w", stopping=True)
        assert not ours.poll(0)
    finally:
        signals.restore()


def child_waits_for_sigterm(slot: JobSlot, pipe: Connection) -> None:
    """A child's handler installed; says so, waits for a SIGTERM, says it stopped, exits 0."""
    signals = ChildSignals(slot)
    reader = signals.install()
    pipe.send("ready")
    while not signals.pending:
        select.select([reader], [], [])
    pipe.send("stopping")


@pytest.mark.parametrize("marked", [False, True], ids=["a stop", "the supervisor's kill"])
def test_only_a_sigterm_after_the_kill_mark_kills(marked: bool) -> None:
    slot = JobSlot()
    ours, theirs = multiprocessing.Pipe()
    proc = multiprocessing.get_context("spawn").Process(
        target=child_waits_for_sigterm, args=(slot, theirs)
    )
    proc.start()
    try:
        assert ours.poll(60) and ours.recv() == "ready"
        if marked:
            slot.mark_kill()  # what Child.terminate does before its SIGTERM
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGTERM)
        proc.join(timeout=60)
        if marked:
            assert proc.exitcode == -signal.SIGTERM and not ours.poll(0)
        else:
            assert proc.exitcode == 0 and ours.recv() == "stopping"
    finally:
        if proc.is_alive():
            proc.kill()
