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


def test_the_slot_says_how_many_claimed_jobs_wait_unstarted_apart_from_the_job() -> None:
    slot = JobSlot(("email",))
    assert slot.held() == 0
    slot.set(JOB, 10.0, None, 1, "email")
    slot.set_held(7)
    assert slot.held() == 7
    assert slot.read() == SlotView(JOB, 10.0, None, 1, "email")  # the entry is untouched
    slot.clear()
    assert slot.held() == 7  # the count is the child's to change, not the entry's
    slot.set_held(0)
    assert slot.held() == 0


def test_a_spawned_child_writes_what_the_supervisor_reads() -> None:
    slot = JobSlot(("email", "resize"))
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=write_in_child, args=(slot,))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert slot.read() == SlotView(JOB, 123.5, 5.0, 2, "resize")


def test_a_slot_with_many_entries_names_every_job_in_flight() -> None:
    slot = JobSlot(("email", "resize"), capacity=3)
    a, b = JobId(uuid.UUID(int=1)), JobId(uuid.UUID(int=2))
    assert slot.capacity == 3 and slot.read_all() == []
    slot.set(a, 1.0, 5.0, 1, "email", entry=0, grace=2.0)
    slot.set(b, 2.0, None, 3, "resize", entry=2)
    assert slot.read_all() == [
        SlotView(a, 1.0, 5.0, 1, "email", 2.0),
        SlotView(b, 2.0, None, 3, "resize", 0.0),
    ]
    slot.clear(0)
    assert slot.read_all() == [SlotView(b, 2.0, None, 3, "resize", 0.0)]
    assert slot.read(0) is None and slot.read(1) is None


def write_entries_in_child(slot: JobSlot) -> None:
    for i in range(slot.capacity):
        slot.set(JobId(uuid.UUID(int=i + 1)), float(i), 1.0, 1, "email", entry=i)


def test_a_spawned_child_fills_every_entry() -> None:
    slot = JobSlot(("email",), capacity=100)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=write_entries_in_child, args=(slot,))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert [v.job_id.int for v in slot.read_all()] == list(range(1, 101))
