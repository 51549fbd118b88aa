"""The real Supervisor loop against a real database, with fake children and a fake clock.

The fake children (tests/support/fakes.py) hold jobs the way workers do: claimed under the
child's worker id, and named in its shared slot. Each test turns the loop with `run_once`.
"""

from __future__ import annotations

import logging
import random
from datetime import timedelta

import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobState
from pgq_supervisor.registry import RetryPolicy
from pgq_supervisor.settings import Settings, load_settings
from pgq_supervisor.supervisor.loop import Supervisor
from pgq_supervisor.supervisor.maintenance import Services
from pgq_supervisor.supervisor.maintenance.activity import ActivitySummary
from pgq_supervisor.supervisor.maintenance.rescuer import Rescuer
from pgq_supervisor.supervisor.maintenance.retention import Pruner
from pgq_supervisor.supervisor.metrics import Metrics, QueueMetrics
from tests.support.db import age_heartbeat, claim, claim_one, get
from tests.support.fakes import FakeClock, FakeSpawner, make_supervisor

LONG = 1000.0  # the "slow" type's retry delay, far from any other


def registry() -> pgq.Registry:
    reg = pgq.Registry()

    @reg.handler("fast", retry=RetryPolicy(base=0.0))
    def fast(payload: object) -> None:
        return None

    @reg.handler("slow", retry=lambda attempt, rng: LONG)
    def slow(payload: object) -> None:
        return None

    return reg


def settings(dsn: str, **flags: object) -> Settings:
    return load_settings(dsn=dsn, app="x:registry", procs=1, **flags)


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def start(sup: Supervisor, spawner: FakeSpawner) -> None:
    sup.run_once(0)
    assert sorted(spawner.live()) == list(range(sup.target))


def test_a_death_retries_with_the_backoff_of_the_type_in_the_slot(dsn: str, conn: Conn) -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = make_supervisor(settings(dsn), registry(), spawner, clock)
    start(sup, spawner)
    child = spawner.live()[0]
    job_id = pgq.enqueue(conn, "fast")
    claim_one(conn, "fast", worker_id=child.spec.worker_id)
    # The row says "fast" (no delay); the slot says "slow". The slot is what the supervisor
    # reads, so a LONG delay proves it looked nothing up.
    child.start_job(job_id, "slow", started=clock.now)
    child.proc.die(-9)
    sup.run_once(0)

    rec = get(conn, job_id)
    assert rec.state is JobState.PENDING
    (attempt,) = rec.attempts
    assert isinstance(attempt, dict)
    assert (attempt["kind"], attempt["error"]) == ("worker_death", "worker died: SIGKILL")
    delay = rec.start_at - db.db_now(conn, "pgq")
    assert timedelta(seconds=LONG - 60) < delay <= timedelta(seconds=LONG)
    assert sample(sup.metrics, "pgq_worker_deaths_total", type="fast") == 1
    sup.close()


def test_a_timed_out_job_is_a_timeout_attempt_and_its_batch_goes_back(dsn: str, conn: Conn) -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    sup = make_supervisor(settings(dsn), registry(), spawner, clock)
    start(sup, spawner)
    child = spawner.live()[0]
    first, second = pgq.enqueue_many(conn, [pgq.NewJob("fast"), pgq.NewJob("fast")])
    claim(conn, ["fast"], worker_id=child.spec.worker_id, limit=2)
    child.start_job(first, "fast", started=clock.now, timeout=5.0)
    clock.now += 5.1
    sup.run_once(0)
    child.proc.die(-15)  # as SIGTERM ends a worker
    sup.run_once(0)

    (attempt,) = get(conn, first).attempts
    assert isinstance(attempt, dict)
    assert (attempt["kind"], attempt["error"]) == ("timeout", "timeout after 5 s")
    released = get(conn, second)
    assert (released.state, released.attempts) == (JobState.PENDING, [])
    sup.close()


def test_the_rescuer_runs_on_rescue_interval(dsn: str, conn: Conn) -> None:
    spawner, clock = FakeSpawner(), FakeClock()
    s = settings(dsn, rescue_interval=10.0, poll_interval=1.0)
    sup = make_supervisor(s, registry(), spawner, clock)
    start(sup, spawner)  # the first rescue round ran at start
    job_id = pgq.enqueue(conn, "fast")
    claim_one(conn, "fast", worker_id="a-dead-pod")
    age_heartbeat(conn, job_id, 2 * s.dead_after)
    for _ in range(7):  # polls run, but the next rescue is 8 to 12 s away (10 s ± 20 %)
        clock.now += 1.1
        sup.run_once(0)
    assert get(conn, job_id).state is JobState.RUNNING
    clock.now += 12.1 - 7 * 1.1
    sup.run_once(0)
    rec = get(conn, job_id)
    assert rec.state is JobState.PENDING
    assert [a["kind"] for a in rec.attempts if isinstance(a, dict)] == ["rescued"]
    assert sample(sup.metrics, "pgq_jobs_rescued_total") == 1
    sup.close()


def test_a_failing_service_does_not_keep_the_others_from_running(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    clock = FakeClock()
    services = Services(
        rescuer=Rescuer("no_such_schema", dead_after=30),  # every round fails in PostgreSQL
        queue_metrics=QueueMetrics("pgq", metrics, 1.0),
        pruner=Pruner("pgq", retain_succeeded=60, retain_failed=None),
        activity=ActivitySummary(10, clock.now),
    )
    old = pgq.enqueue(conn, "fast")
    job = claim_one(conn, "fast")
    db.succeed(conn, "pgq", job.lease, [(old, None)])
    conn.execute("UPDATE pgq.job SET stopped_at = now() - interval '1 hour' WHERE id = %s", (old,))
    pgq.enqueue(conn, "fast")
    spawner = FakeSpawner()
    sup = Supervisor(
        settings(dsn), registry(), dsn, metrics=metrics, spawner=spawner, clock=clock,
        rng=random.Random(1), services=services,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="pgq_supervisor.supervisor.maintenance"):
        sup.run_once(0)
    assert any(r.getMessage().startswith("rescue failed") for r in caplog.records)
    assert sample(metrics, "pgq_jobs_ready", type="fast") == 1  # queue metrics ran after it
    assert sample(metrics, "pgq_jobs_pruned_total", state="succeeded") == 1  # and so did pruning
    assert conn.execute("SELECT count(*) FROM pgq.job").fetchone() == (1,)
    assert sup.ready() is True  # the connection the rescuer broke was replaced
    sup.close()
