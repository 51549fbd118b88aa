"""What the supervisor decides for a child with many jobs in flight (concurrency > 1), from
the child's slot: timeouts with and without the async grace, cancels, and the shared-death
rule. Fake children and a fake clock; no database (settling a death fails and is logged)."""

from __future__ import annotations

import random
import signal
import uuid

from pgq_supervisor.ipc import CancelJob, RunAlone, RunAloneSet
from pgq_supervisor.jobs import JobId
from pgq_supervisor.registry import Registry
from pgq_supervisor.settings import load_settings
from pgq_supervisor.supervisor import cancels
from pgq_supervisor.supervisor.children import CANCELLED, Child
from pgq_supervisor.supervisor.loop import Supervisor
from pgq_supervisor.supervisor.verdicts import DeadChild, judge
from tests.support.fakes import NO_DATABASE, FakeClock, FakeSpawner, make_supervisor


def _supervisor(spawner: FakeSpawner, clock: FakeClock, procs: int = 2) -> Supervisor:
    registry = Registry()

    @registry.handler("t")
    def t(payload: dict[str, int]) -> None:
        return None

    settings = load_settings(procs=procs, app="x:registry", dsn=NO_DATABASE, concurrency=3)
    sup = make_supervisor(settings, registry, spawner, clock)
    sup.run_once(0)
    return sup


def _job() -> JobId:
    return JobId(uuid.uuid4())


def shared_death(child: Child) -> tuple[JobId, ...]:
    """The jobs the verdict on `child`'s death (were it to die now) sends to run alone."""
    dead = DeadChild.of(child, stopping=False, wanted=True)
    return judge(dead, Registry(), random.Random(1)).run_alone


def test_each_child_gets_a_slot_entry_per_job_it_may_hold() -> None:
    spawner = FakeSpawner()
    sup = _supervisor(spawner, FakeClock())
    assert [c.slot.capacity for c in spawner.live().values()] == [3, 3]
    sup.close()


def test_a_thread_job_is_stopped_at_its_timeout_an_async_one_after_its_grace() -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = _supervisor(spawner, clock)
    threads, loop = spawner.live()[0], spawner.live()[1]
    start = clock.now
    threads.slot.set(_job(), start, 1.0, 1, "t", entry=1)  # a sync job in a thread: no grace
    loop.slot.set(_job(), start, 1.0, 1, "t", entry=2, grace=2.0)  # async: the child cancels
    clock.now = start + 1.5
    sup.run_once(0)
    assert threads.proc.signals == [signal.SIGTERM] and loop.proc.signals == []
    clock.now = start + 3.5
    sup.run_once(0)
    assert loop.proc.signals == [signal.SIGTERM]
    sup.close()


def test_a_cancelled_async_job_is_cancelled_by_its_child_a_thread_job_costs_the_child() -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = _supervisor(spawner, clock)
    loop, threads = spawner.live()[0], spawner.live()[1]
    loop.received()
    async_job, thread_job, neighbour = _job(), _job(), _job()
    loop.slot.set(neighbour, clock.now, None, 1, "t", entry=0, grace=2.0)
    loop.slot.set(async_job, clock.now, None, 1, "t", entry=1, grace=2.0)
    threads.slot.set(thread_job, clock.now, None, 1, "t", entry=2)
    for job_id in (async_job, thread_job):
        assert cancels.mark(sup.children.values(), cancels.CancelRequest(job_id, None))
    sup.run_once(0)
    assert loop.received() == [CancelJob(async_job)] and loop.proc.signals == []
    sup.run_once(0)
    assert loop.received() == [], "told once"
    assert threads.proc.signals == [signal.SIGTERM]
    assert (sup.children[1].kill_reason, sup.children[1].kill_job) == (CANCELLED, thread_job)
    sup.close()


def test_a_death_holding_several_jobs_charges_none_and_makes_them_run_alone() -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = _supervisor(spawner, clock)
    dying, other = spawner.live()[0], spawner.live()[1]
    other.received()
    a, b = _job(), _job()
    dying.slot.set(a, clock.now, None, 1, "t", entry=0, grace=2.0)
    dying.slot.set(b, clock.now, None, 1, "t", entry=2, grace=2.0)
    assert shared_death(sup.children[0]) == (a, b)
    dying.proc.die(-signal.SIGKILL)
    sup.run_once(0)
    assert RunAlone.of([a, b]) in other.received()
    assert RunAlone.of([a, b]).job_ids() == [a, b]
    assert list(sup.run_alone) == [a, b]
    fresh = spawner.live()[0]  # respawned: told before its first claim
    assert fresh is not dying and fresh.received() == [RunAlone.of([a, b])]
    sup.close()


def test_a_kill_or_a_death_holding_one_job_is_no_shared_death() -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = _supervisor(spawner, clock)
    child = spawner.live()[0]
    a, b = _job(), _job()
    child.slot.set(a, clock.now, None, 1, "t", entry=0)
    assert shared_death(sup.children[0]) == ()  # one job: its death is charged to it
    child.slot.set(b, clock.now, 1.0, 1, "t", entry=1)
    sup.children[0].terminate(clock.now, "timeout after 1 s", b)
    assert shared_death(sup.children[0]) == ()  # killed for b: b is charged, a released
    sup.close()


def test_the_jobs_in_flight_of_each_child_are_a_gauge() -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = _supervisor(spawner, clock)
    busy = spawner.live()[1]
    busy.slot.set(_job(), clock.now, None, 1, "t", entry=0)
    busy.slot.set(_job(), clock.now, None, 1, "t", entry=2)
    clock.now += 1.5
    sup.run_once(0)

    def gauge(child: str) -> float | None:
        return sup.metrics.registry.get_sample_value("pgq_child_jobs_in_flight", {"child": child})

    assert (gauge("0"), gauge("1")) == (0.0, 2.0)
    sup.close()


def test_the_run_alone_set_is_bounded_and_forgets_the_oldest_named() -> None:
    a, b, c, d = (_job() for _ in range(4))
    marks = RunAloneSet(keep=3)
    marks.add([a, b, c])
    marks.add([a])  # named again: now the newest
    marks.add([d])
    assert list(marks) == [c, a, d] and b not in marks
    assert marks.latest(2) == [a, d] and marks.latest(0) == []
    marks.discard(a)  # it ran alone (the child's copy)
    assert list(marks) == [c, d] and len(marks) == 2
