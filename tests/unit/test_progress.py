"""Progress values are checked in the handler (InvalidInput), and a ProgressBuffer hands each
job's latest value out at most once per interval."""

from __future__ import annotations

import json
import uuid

import pytest

import pgq_supervisor as pgq
from pgq_supervisor import testing
from pgq_supervisor.jobs import PROGRESS_REPORTER, JobId, JsonValue, LeaseToken
from pgq_supervisor.worker.progress import MAX_PROGRESS_BYTES, ProgressBuffer, encode


def _job(lease: uuid.UUID | None = None) -> pgq.Job:
    return pgq.Job(
        id=JobId(uuid.uuid4()), type="t", payload={}, priority=0, attempt=1,
        max_retry_count=0, timeout=None, bundle_id=None, lease=LeaseToken(lease or uuid.uuid4()),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (1, "1"), (0.25, "0.25"), ({"fraction": 0.5, "step": "upload"}, None), ({}, "{}")],
)
def test_good_values_are_encoded(value: float | dict[str, JsonValue], text: str | None) -> None:
    encoded = encode(value)
    assert json.loads(encoded) == value and (text is None or encoded == text)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1.5, "from 0 to 1"),
        (-0.1, "from 0 to 1"),
        (float("nan"), "from 0 to 1"),
        (True, "not bool"),
        ("half", "not str"),
        ([0.5], "not list"),
        (None, "not NoneType"),
        ({"at": object()}, "not JSON-serializable"),
        ({"blob": "x" * MAX_PROGRESS_BYTES}, "at most 8192"),
    ],
)
def test_bad_values_are_refused(value: object, message: str) -> None:
    with pytest.raises(pgq.InvalidInput, match=message):
        encode(value)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_buffer_gives_each_job_its_latest_value_at_most_once_per_interval() -> None:
    clock = Clock()
    woken: list[int] = []
    buffer = ProgressBuffer(0.25, on_put=lambda: woken.append(1), clock=clock)
    a, b = _job(), _job()
    assert buffer.next_due() is None and buffer.take_due() == []

    buffer.put(a, "0.1")
    buffer.put(a, "0.2")
    assert buffer.next_due() == 0.0 and len(woken) == 1  # woken once: a value is waiting
    assert buffer.take_due() == [(a.id, a.lease, "0.2")]  # the latest only

    buffer.put(a, "0.3")
    buffer.put(b, "0.9")
    assert buffer.take_due() == [(b.id, b.lease, "0.9")]  # a wrote just now
    assert buffer.next_due() == pytest.approx(0.25)
    clock.now += 0.1
    assert buffer.take_due() == [] and buffer.next_due() == pytest.approx(0.15)
    clock.now += 0.15
    assert buffer.take_due() == [(a.id, a.lease, "0.3")]  # the last value is not lost
    assert buffer.next_due() is None

    # 1000 reports over one second: at most one value per job per interval
    taken = 0
    for _ in range(1000):
        buffer.put(a, "0.5")
        taken += len(buffer.take_due())
        clock.now += 0.001
    assert taken <= 5


def test_a_settled_job_is_forgotten() -> None:
    buffer = ProgressBuffer(0.25, clock=Clock())
    a = _job()
    buffer.put(a, "0.5")
    buffer.forget([a.id])
    assert buffer.next_due() is None and buffer.take_due() == []


def test_run_inline_records_progress_and_checks_it() -> None:
    registry = pgq.Registry()

    @registry.handler("steps")
    def steps(payload: dict[str, int], job: pgq.Job) -> int:
        for i in range(payload["n"]):
            job.report_progress((i + 1) / payload["n"])
        job.report_progress({"done": True})
        return payload["n"]

    @registry.handler("bad")
    def bad(payload: dict[str, int], job: pgq.Job) -> None:
        job.report_progress(2)

    seen: list[JsonValue] = []
    assert testing.run_inline(registry, "steps", {"n": 4}, progress=seen) == 4
    assert seen == [0.25, 0.5, 0.75, 1.0, {"done": True}]
    with pytest.raises(pgq.InvalidInput, match="from 0 to 1"):
        testing.run_inline(registry, "bad", {})


def test_outside_a_worker_report_progress_does_nothing() -> None:
    """A run binds its reporter for the run only: a job kept past it reports to no one."""
    registry = pgq.Registry()
    kept: list[pgq.Job] = []

    @registry.handler("keep")
    def keep(payload: dict[str, int], job: pgq.Job) -> None:
        kept.append(job)
        job.report_progress(0.5)

    seen: list[JsonValue] = []
    testing.run_inline(registry, "keep", {}, progress=seen)
    assert seen == [0.5] and PROGRESS_REPORTER.get() is None
    kept[0].report_progress(1.0)  # after its run: nothing, and nothing raised
    _job().report_progress(1.0)  # never run at all
