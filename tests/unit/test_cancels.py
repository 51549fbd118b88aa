"""Which child a cancel stops, decided from the notification and the children's slots."""

from __future__ import annotations

import json
import signal
import uuid

from pgq_supervisor.jobs import JobId
from pgq_supervisor.registry import Registry
from pgq_supervisor.settings import load_settings
from pgq_supervisor.supervisor import cancels
from pgq_supervisor.supervisor.children import CANCELLED, ChildState
from pgq_supervisor.supervisor.loop import Supervisor
from tests.support.fakes import NO_DATABASE, FakeClock, FakeSpawner, make_supervisor


def _supervisor(spawner: FakeSpawner, procs: int = 2) -> Supervisor:
    registry = Registry()

    @registry.handler("t")
    def t(payload: dict[str, int]) -> None:
        return None

    settings = load_settings(procs=procs, app="x:registry", dsn=NO_DATABASE)
    sup = make_supervisor(settings, registry, spawner, FakeClock())
    sup.run_once(0)
    return sup


def _job() -> JobId:
    return JobId(uuid.uuid4())


def test_parse_reads_the_payload_and_ignores_garbage() -> None:
    job_id = _job()
    payload = json.dumps({"job_id": str(job_id), "worker_id": "h:1:0:ab"})
    assert cancels.parse(payload) == cancels.CancelRequest(job_id, "h:1:0:ab")
    for bad in ("", "nope", "[]", '{"worker_id": "w"}', '{"job_id": "12"}'):
        assert cancels.parse(bad) is None, bad


def test_the_child_named_by_worker_id_is_stopped_once_the_job_is_in_hand() -> None:
    spawner = FakeSpawner()
    sup = _supervisor(spawner)
    first, second = spawner.live()[0], spawner.live()[1]
    job_id, other = _job(), _job()
    first.start_job(other, "t", started=0.0)
    request = cancels.CancelRequest(job_id, first.spec.worker_id)
    assert cancels.mark(sup.children.values(), request) is sup.children[0]
    sup.run_once(0)
    assert first.proc.signals == []  # claimed, not started: nothing to stop yet
    first.start_job(job_id, "t", started=0.0)
    sup.run_once(0)
    assert first.proc.signals == [signal.SIGTERM] and second.proc.signals == []
    assert sup.children[0].state is ChildState.TERMINATING
    assert (sup.children[0].kill_reason, sup.children[0].kill_job) == (CANCELLED, job_id)
    sup.close()


def test_without_a_known_worker_the_slot_names_the_child() -> None:
    spawner = FakeSpawner()
    sup = _supervisor(spawner)
    job_id = _job()
    spawner.live()[1].start_job(job_id, "t", started=0.0)
    request = cancels.CancelRequest(job_id, "another supervisor's worker")
    assert cancels.mark(sup.children.values(), request) is sup.children[1]
    assert cancels.mark(sup.children.values(), cancels.CancelRequest(_job(), None)) is None
    assert cancels.jobs_in_hand(sup.children.values()) == {job_id: sup.children[1]}
    sup.close()
