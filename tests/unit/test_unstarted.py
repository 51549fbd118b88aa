"""The batch a child runs, shared by its main thread and its heartbeat thread (unstarted.py):
once the job in hand has run `release_after`, the jobs behind it are cut, and each job is
either started or cut, never both, with both threads racing for real."""

from __future__ import annotations

import random
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import pgq_supervisor as pgq
from pgq_supervisor.jobs import JobId, LeaseToken
from pgq_supervisor.worker.unstarted import Unstarted

LEASE = LeaseToken(uuid.uuid4())


def _job() -> pgq.Job:
    return pgq.Job(
        id=JobId(uuid.uuid4()), type="t", payload={}, priority=0, attempt=1,
        max_retry_count=0, timeout=None, bundle_id=None, lease=LEASE,
    )  # fmt: skip


def _jobs(n: int) -> list[pgq.Job]:
    return [_job() for _ in range(n)]


def test_the_jobs_behind_a_long_job_are_cut_once_it_has_run_release_after() -> None:
    held: list[int] = []
    batch = Unstarted(0.25, held.append)
    a, b, c = jobs = _jobs(3)
    batch.load(jobs, now=10.0)
    assert batch.take(now=10.0) is a
    assert batch.take(now=10.1) is b
    assert batch.due() == pytest.approx(10.35)  # b's start + release_after
    assert batch.cut(now=10.3) is None  # b has run 0.2 s: not yet
    assert batch.cut(now=10.35) == [c]
    assert batch.take(now=10.4) is None  # c is the heartbeat thread's now
    assert batch.due() is None  # cut: the batch ends with b, nothing left to watch
    assert batch.cut(now=99.0) is None
    assert batch.finish() == []
    assert held == [3, 2, 1, 0, 0]


def test_a_long_last_job_is_still_watched_for_the_successes_before_it() -> None:
    batch = Unstarted(0.25)
    a, b = jobs = _jobs(2)
    batch.load(jobs, now=0.0)
    assert batch.take(now=0.0) is a
    assert batch.take(now=0.01) is b
    assert batch.cut(now=1.0) == []  # nothing to release, but due: the successes get written
    assert batch.cut(now=2.0) is None  # once


def test_a_batch_that_ends_gives_its_jobs_not_started_to_the_main_thread() -> None:
    batch = Unstarted(0.25)
    a, b, c = jobs = _jobs(3)
    batch.load(jobs, now=0.0)
    assert batch.take(now=0.0) is a
    assert batch.finish() == [b, c]  # told to stop, say
    assert batch.due() is None
    assert batch.cut(now=5.0) is None


def test_the_watcher_is_woken_only_for_a_batch_of_several_while_it_sleeps() -> None:
    wakes: list[None] = []
    batch = Unstarted(0.25)
    batch.watched_by(lambda: wakes.append(None))
    batch.load(_jobs(1), now=0.0)  # a lone job never waits behind another
    assert batch.due() is None and wakes == []
    batch.finish()
    batch.load(_jobs(2), now=1.0)
    assert len(wakes) == 1
    assert batch.due() == pytest.approx(1.25)  # awake now: it looks again at each due time
    batch.finish()
    batch.load(_jobs(2), now=2.0)
    assert len(wakes) == 1, "woken again though it never went to sleep"
    batch.finish()
    assert batch.due() is None  # nothing to watch: it sleeps
    batch.load(_jobs(2), now=3.0)
    assert len(wakes) == 2


class _Yielding(list[pgq.Job]):
    """A batch whose reads let other threads run first."""

    def __getitem__(self, index: Any) -> Any:
        time.sleep(0)  # gives up the GIL mid-read: the racing thread gets in, if it can
        return super().__getitem__(index)


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    """Threads switch as often as the interpreter allows: races happen, if they can."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _watch(batch: Unstarted, loaded: threading.Event, spin: int, cut: list[pgq.Job]) -> None:
    loaded.wait()
    for _ in range(spin):
        pass
    cut.extend(batch.cut(now=float("inf")) or [])


@pytest.mark.usefixtures("tiny_switch_interval")
def test_no_job_is_both_started_and_cut_with_both_threads_racing() -> None:
    rng = random.Random(20)
    # due as soon as a batch is loaded: the cut races every take. Both steps yield the GIL in
    # the middle (reading the batch; writing the held count): the other thread gets in there,
    # if it can.
    batch = Unstarted(0.0, lambda n: time.sleep(0))  # a GIL yield mid-write, not a wait
    for _ in range(300):
        jobs = _Yielding(_jobs(rng.randint(2, 40)))
        started: list[pgq.Job] = []
        cut: list[pgq.Job] = []
        loaded = threading.Event()
        spin = rng.randint(0, 30)  # cut somewhere along the batch
        thread = threading.Thread(target=_watch, args=(batch, loaded, spin, cut))
        thread.start()
        batch.load(jobs, now=0.0)
        loaded.set()
        while (job := batch.take(now=0.0)) is not None:
            started.append(job)
        thread.join()
        rest = batch.finish()
        ids = [j.id for j in started + cut + rest]
        assert sorted(ids) == sorted(j.id for j in jobs), "a job was lost or handed out twice"
        assert not {j.id for j in started} & {j.id for j in cut}
