"""The shared slot a child writes at every job start: job, attempt, timeout and type."""

from __future__ import annotations

import multiprocessing
import uuid

from pgq_supervisor.ipc import JobSlot, SlotView
from pgq_supervisor.jobs import JobId

JOB = JobId(uuid.UUID(int=42))


def write_in_child(slot: JobSlot) -> None:
    slot.set(JOB, 123.5, 5.0, 2, "resize")


def test_the_slot_names_the_job_and_its_type() -> None:
    slot = JobSlot(("email", "resize"))
    assert slot.read() is None
    slot.set(JOB, 10.0, None, 1, "resize")
    assert slot.read() == SlotView(JOB, 10.0, None, 1, "resize")
    slot.set(JOB, 11.0, 3.0, 2, "not-served")  # cannot happen: claims filter on the types
    assert slot.read() == SlotView(JOB, 11.0, 3.0, 2, None)
    slot.clear()
    assert slot.read() is None


def test_a_spawned_child_writes_what_the_supervisor_reads() -> None:
    slot = JobSlot(("email", "resize"))
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=write_in_child, args=(slot,))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert slot.read() == SlotView(JOB, 123.5, 5.0, 2, "resize")
