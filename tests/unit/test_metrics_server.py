"""The metrics server in process: endpoints, health callbacks, bind address, and the queue
gauges' bookkeeping (no database, no supervisor)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pgq_supervisor.db.rows import TypeControl, TypeLimit
from pgq_supervisor.ipc import DURATION_BUCKETS, Report
from pgq_supervisor.jobs import JobState, OutcomeKind, TypeStats
from pgq_supervisor.supervisor.metrics import Metrics, MetricsServer
from tests.acceptance.scrape import metric, scrape

S, F, R = OutcomeKind.SUCCEEDED, OutcomeKind.FAILED, OutcomeKind.RETRIED


class Health:
    def __init__(self) -> None:
        self.healthy = True
        self.ready = True


@pytest.fixture
def health() -> Health:
    return Health()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def serve(metrics: Metrics, health: Health, host: str) -> MetricsServer:
    server = MetricsServer(metrics, host, 0, lambda: health.healthy, lambda: health.ready)
    server.start()
    return server


@pytest.fixture
def server(metrics: Metrics, health: Health) -> Iterator[MetricsServer]:
    s = serve(metrics, health, "127.0.0.1")
    yield s
    s.stop()


def status(host: str, port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_health_endpoints_follow_the_supervisor(server: MetricsServer, health: Health) -> None:
    assert status("127.0.0.1", server.port, "/healthz") == 200
    assert status("127.0.0.1", server.port, "/readyz") == 200
    health.ready = False  # e.g. draining, or the database is gone
    assert status("127.0.0.1", server.port, "/readyz") == 503
    assert status("127.0.0.1", server.port, "/healthz") == 200
    health.healthy = False  # the loop stalled
    assert status("127.0.0.1", server.port, "/healthz") == 503
    assert status("127.0.0.1", server.port, "/metrics?x=1") == 200
    assert status("127.0.0.1", server.port, "/other") == 404


def test_counters_and_histograms(server: MetricsServer, metrics: Metrics) -> None:
    metrics.record(Report.of([("a", S, 0.2), ("a", F, 0.1), ("b", R, 2.0)], [0.01]))
    metrics.record_pruned(succeeded=7, failed=2)
    s = scrape(server.port)
    assert metric(s, "pgq_jobs_total", type="a", outcome="succeeded") == 1
    assert metric(s, "pgq_jobs_total", type="a", outcome="failed") == 1
    assert metric(s, "pgq_jobs_total", type="b", outcome="retried") == 1
    assert metric(s, "pgq_job_duration_seconds_count", type="a") == 2
    assert metric(s, "pgq_job_duration_seconds_sum", type="b") == 2.0
    assert metric(s, "pgq_wake_latency_seconds_count") == 1
    assert metric(s, "pgq_jobs_pruned_total", state="succeeded") == 7
    assert metric(s, "pgq_jobs_pruned_total", state="failed") == 2
    # a batch counts each (type, outcome) once, however many; the per-type series are kept
    metrics.record(Report.of([("a", S, 0.1)] * 100 + [("b", R, 1.0)] * 3, []))
    s = scrape(server.port)
    assert metric(s, "pgq_jobs_total", type="a", outcome="succeeded") == 101
    assert metric(s, "pgq_jobs_total", type="b", outcome="retried") == 4
    assert metric(s, "pgq_job_duration_seconds_count", type="a") == 102
    assert metric(s, "pgq_job_duration_seconds_sum", type="b") == 5.0


def test_job_durations_read_as_a_prometheus_histogram_of_the_same_times(metrics: Metrics) -> None:
    """The children send bucket counts (ipc.Report); the exposition is what a Histogram that
    observed every job would show, bounds (a time equal to a bound included) and sum alike."""
    times = [0.0, 0.001, 0.0011, 0.3, 1.0, 7.5, 1800.0, 5000.0]
    metrics.record(Report.of([("a", S, t) for t in times[:5]], []))
    metrics.record(Report.of([("a", F, t) for t in times[5:]], []))
    reference = CollectorRegistry()
    histogram = Histogram(
        "pgq_job_duration_seconds", "Handler run time", ["type"],
        buckets=DURATION_BUCKETS, registry=reference,
    )  # fmt: skip
    for t in times:
        histogram.labels("a").observe(t)

    def series(registry: CollectorRegistry) -> list[str]:
        text = generate_latest(registry).decode()
        return [
            line for line in text.splitlines()
            if line.startswith("pgq_job_duration_seconds_") and "_created" not in line
        ]  # fmt: skip

    ours = series(metrics.registry)
    assert ours == series(reference)
    assert 'pgq_job_duration_seconds_bucket{le="0.001",type="a"} 2.0' in ours


def test_queue_gauges_reset_types_that_vanished(server: MetricsServer, metrics: Metrics) -> None:
    metrics.update_queue(
        [
            TypeStats("a", JobState.PENDING, 5, 3, 12.5),
            TypeStats("a", JobState.RUNNING, 2, 0, None),
            TypeStats("b", JobState.PENDING, 1, 0, None),
        ]
    )
    s = scrape(server.port)
    assert (metric(s, "pgq_jobs_ready", type="a"), metric(s, "pgq_jobs_delayed", type="a")) == (
        3,
        2,
    )
    assert metric(s, "pgq_jobs_running", type="a") == 2
    assert metric(s, "pgq_oldest_ready_age_seconds", type="a") == 12.5
    assert metric(s, "pgq_jobs_delayed", type="b") == 1

    metrics.update_queue([TypeStats("b", JobState.RUNNING, 1, 0, None)])
    s = scrape(server.port)
    # "a" left the queue: its gauges say 0 instead of keeping their last value
    assert metric(s, "pgq_jobs_ready", type="a") == 0
    assert metric(s, "pgq_jobs_running", type="a") == 0
    assert metric(s, "pgq_oldest_ready_age_seconds", type="a") == 0
    assert metric(s, "pgq_jobs_delayed", type="b") == 0
    assert metric(s, "pgq_jobs_running", type="b") == 1


def test_an_ipv6_bind_address_works(metrics: Metrics, health: Health) -> None:
    server = serve(metrics, health, "::1")
    try:
        assert status("[::1]", server.port, "/healthz") == 200
    finally:
        server.stop()


def test_paused_and_held_back_gauges(server: MetricsServer, metrics: Metrics) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    stats = [
        TypeStats("p", JobState.PENDING, 7, 4, 1.0),
        TypeStats("r", JobState.PENDING, 9, 9, 1.0),
        TypeStats("free", JobState.PENDING, 2, 2, 1.0),
    ]
    metrics.update_controls(
        [
            TypeControl("p", at, "ops", "deploy", None, None, None),
            TypeControl("r", None, None, None, 20, 1.0, 3),
        ],
        stats,
    )
    s = scrape(server.port)
    assert metric(s, "pgq_type_paused", type="p") == 1
    assert metric(s, "pgq_type_paused", type="r") == 0
    assert metric(s, "pgq_jobs_held_back", type="p", reason="paused") == 4  # the ready ones
    assert metric(s, "pgq_jobs_held_back", type="r", reason="rate") == 9 - 3
    assert metric(s, "pgq_jobs_held_back", type="r", reason="paused") == 0

    # resumed and no longer rated: back to 0, not a stale value
    metrics.update_controls([], stats)
    s = scrape(server.port)
    assert metric(s, "pgq_type_paused", type="p") == 0
    assert metric(s, "pgq_jobs_held_back", type="p", reason="paused") == 0
    assert metric(s, "pgq_jobs_held_back", type="r", reason="rate") == 0


def test_held_back_by_concurrency_limits(server: MetricsServer, metrics: Metrics) -> None:
    metrics.update_limits(
        [
            # 3 slots, 2 running: 1 free; of 10 ready, 4 wait on busy keys, 5 on the slots
            TypeLimit("g", 3, 1, running=2, ready=10, key_held=4),
            TypeLimit("k", None, 1, running=5, ready=6, key_held=6),
        ]
    )
    s = scrape(server.port)
    assert metric(s, "pgq_jobs_held_back", type="g", reason="global_concurrency") == 5
    assert metric(s, "pgq_jobs_held_back", type="g", reason="key_concurrency") == 4
    assert metric(s, "pgq_jobs_held_back", type="k", reason="global_concurrency") == 0
    assert metric(s, "pgq_jobs_held_back", type="k", reason="key_concurrency") == 6

    # no longer limited: back to 0, not a stale value
    metrics.update_limits([])
    s = scrape(server.port)
    assert metric(s, "pgq_jobs_held_back", type="g", reason="global_concurrency") == 0
    assert metric(s, "pgq_jobs_held_back", type="k", reason="key_concurrency") == 0


def test_jobs_that_wait_for_other_jobs_are_held_back_as_waiting(
    server: MetricsServer, metrics: Metrics
) -> None:
    """Dependencies, an ordered_key's earlier jobs, a running job a debounced one waits behind."""
    metrics.update_queue([TypeStats("o", JobState.PENDING, 5, 1, 1.0, waiting=4)])
    assert metric(scrape(server.port), "pgq_jobs_held_back", type="o", reason="waiting") == 4
    metrics.update_queue([])
    assert metric(scrape(server.port), "pgq_jobs_held_back", type="o", reason="waiting") == 0
