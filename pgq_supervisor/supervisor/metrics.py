"""Prometheus metrics and health endpoints, served by the supervisor on `metrics_port`.

Children never touch these: they report outcomes over their pipes and the supervisor counts
them here, so no multiprocess metric files are needed.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from pgq_supervisor import db
from pgq_supervisor.db import workflows
from pgq_supervisor.jobs import JobState, TypeStats

log = logging.getLogger(__name__)

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800)
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ready = Gauge("pgq_jobs_ready", "Pending jobs eligible now", ["type"], registry=r)
        self.delayed = Gauge("pgq_jobs_delayed", "Pending jobs not yet due", ["type"], registry=r)
        self.running = Gauge("pgq_jobs_running", "Running jobs (all workers)", ["type"], registry=r)
        self.oldest_ready = Gauge(
            "pgq_oldest_ready_age_seconds", "Age of the oldest ready job", ["type"], registry=r
        )
        self.finished = Counter(
            "pgq_jobs_total", "Attempts ended here, by outcome", ["type", "outcome"], registry=r
        )
        self.rescued = Counter(
            "pgq_jobs_rescued_total", "Jobs reclaimed from stale heartbeats", registry=r
        )
        self.deaths = Counter(
            "pgq_worker_deaths_total", "Children that died holding a job", ["type"], registry=r
        )
        self.timeouts = Counter(
            "pgq_job_timeouts_total", "Jobs killed on timeout", ["type"], registry=r
        )
        self.restarts = Counter("pgq_child_restarts_total", "Children respawned", registry=r)
        self.pruned = Counter(
            "pgq_jobs_pruned_total",
            "Finished jobs deleted by retention (state: succeeded, or failed for failed and"
            " cancelled)",
            ["state"],
            registry=r,
        )
        self.children = Gauge("pgq_children", "Live child processes", registry=r)
        self.in_flight = Gauge(
            "pgq_child_jobs_in_flight",
            "Jobs a child runs now (its concurrency at most), read from its slot each second",
            ["child"],
            registry=r,
        )
        self.duration = Histogram(
            "pgq_job_duration_seconds",
            "Handler run time",
            ["type"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.wake_latency = Histogram(
            "pgq_wake_latency_seconds",
            "Wake-up sent to jobs claimed",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.paused = Gauge(
            "pgq_type_paused", "1 while the job type is paused, else 0", ["type"], registry=r
        )
        self.held_back = Gauge(
            "pgq_jobs_held_back",
            "Ready jobs not claimable now: the type is paused (reason=paused), beyond its rate"
            " limit's free starts (rate), its global concurrency limit (global_concurrency) or"
            " its concurrency key's limit (key_concurrency); pending jobs that wait for other"
            " jobs (waiting): dependencies, the earlier jobs of their ordered_key, or the"
            " running job a debounced one waits behind",
            ["type", "reason"],
            registry=r,
        )
        self.depth = Gauge(
            "pgq_queue_depth",
            "Jobs a claim could take now, of every type: what `depth` prints and the KEDA"
            " PostgreSQL trigger counts (the schema's depth())",
            registry=r,
        )
        self.workflows_paused = Gauge(
            "pgq_workflows_paused",
            "Pending workflows by what their last step is paused on: a sleep (reason=sleeping),"
            " a signal or a child job (waiting), a failed step's retry (retrying)",
            ["type", "reason"],
            registry=r,
        )
        self.workflow_steps = Counter(
            "pgq_workflow_steps_total",
            "Workflow calls run (not replayed), by the row each wrote: kind step, enqueue,"
            " sleep, wait or patch; state succeeded, retrying (a step's try failed), failed,"
            " sleeping, waiting (a sleep or a wait begun) or timed_out",
            ["type", "kind", "state"],
            registry=r,
        )
        self._known_types: set[str] = set()
        self._paused_keys: set[tuple[str, str]] = set()
        self._controlled: set[str] = set()
        self._limited: set[str] = set()
        self._durations: dict[str, Histogram] = {}  # per type: labels() is not cheap

    def record(
        self, outcomes: Sequence[tuple[str, str, float]], latencies: Sequence[float]
    ) -> None:
        """The ended attempts a child reported, on the supervisor's hot path: one count per
        (type, outcome) of the batch, and the labelled series looked up once per type
        (`labels()` took most of the supervisor's CPU in a drain when called per job)."""
        ended: dict[tuple[str, str], int] = {}
        for type_, kind, seconds in outcomes:
            ended[type_, kind] = ended.get((type_, kind), 0) + 1
            duration = self._durations.get(type_)
            if duration is None:
                duration = self._durations[type_] = self.duration.labels(type_)
            duration.observe(seconds)
        for (type_, kind), n in ended.items():
            self.finished.labels(type_, kind).inc(n)
        for seconds in latencies:
            self.wake_latency.observe(seconds)

    def record_pruned(self, succeeded: int, failed: int) -> None:
        self.pruned.labels("succeeded").inc(succeeded)
        self.pruned.labels("failed").inc(failed)

    def update_queue(self, stats: Sequence[TypeStats]) -> None:
        seen: set[str] = set()
        ready: dict[str, int] = {}
        delayed: dict[str, int] = {}
        running: dict[str, int] = {}
        oldest: dict[str, float] = {}
        waiting: dict[str, int] = {}
        for s in stats:
            seen.add(s.type)
            if s.state is JobState.PENDING:
                ready[s.type] = s.ready
                waiting[s.type] = s.waiting
                delayed[s.type] = s.count - s.ready
                if s.oldest_ready_age is not None:
                    oldest[s.type] = s.oldest_ready_age
            elif s.state is JobState.RUNNING:
                running[s.type] = s.count
        # types that vanished keep reporting 0 rather than a stale value
        for t in seen | self._known_types:
            self.ready.labels(t).set(ready.get(t, 0))
            self.delayed.labels(t).set(delayed.get(t, 0))
            self.running.labels(t).set(running.get(t, 0))
            self.oldest_ready.labels(t).set(oldest.get(t, 0.0))
            self.held_back.labels(t, "waiting").set(waiting.get(t, 0))
        self._known_types |= seen

    def update_controls(
        self, controls: Sequence[db.TypeControl], stats: Sequence[TypeStats]
    ) -> None:
        ready = {s.type: s.ready for s in stats if s.state is JobState.PENDING}
        paused = {c.type for c in controls if c.paused}
        held_by_rate = {
            c.type: max(0, ready.get(c.type, 0) - c.free_starts)
            for c in controls
            if c.free_starts is not None and not c.paused
        }
        # a type resumed or no longer rated reports 0 rather than a stale value
        for t in {c.type for c in controls} | self._controlled:
            self.paused.labels(t).set(t in paused)
            self.held_back.labels(t, "paused").set(ready.get(t, 0) if t in paused else 0)
            self.held_back.labels(t, "rate").set(held_by_rate.get(t, 0))
        self._controlled |= {c.type for c in controls}

    def update_limits(self, limits: Sequence[db.TypeLimit]) -> None:
        for lim in limits:
            self.held_back.labels(lim.type, "global_concurrency").set(lim.held_by_global)
            self.held_back.labels(lim.type, "key_concurrency").set(lim.key_held)
        # a type no longer limited reports 0 rather than a stale value
        for t in self._limited - {lim.type for lim in limits}:
            self.held_back.labels(t, "global_concurrency").set(0)
            self.held_back.labels(t, "key_concurrency").set(0)
        self._limited |= {lim.type for lim in limits}

    def record_steps(self, steps: Sequence[tuple[str, str, str, int]]) -> None:
        for type_, kind, state, n in steps:
            self.workflow_steps.labels(type_, kind, state).inc(n)

    def update_workflows(self, paused: dict[tuple[str, str], int]) -> None:
        # a type whose workflows all woke reports 0 rather than a stale value
        for key in paused.keys() | self._paused_keys:
            self.workflows_paused.labels(*key).set(paused.get(key, 0))
        self._paused_keys |= paused.keys()

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass(frozen=True, slots=True)
class QueueMetricsResult:
    rows: int  # (type, state) groups read


class QueueMetrics:
    """The queue gauges (ready, delayed, running, oldest ready age per type; paused types and
    jobs held back by a pause, a rate or a concurrency limit; the queue's depth), refreshed from
    the database.
    Every supervisor reports the same queue-wide values."""

    def __init__(self, schema: str, metrics: Metrics) -> None:
        self.schema = schema
        self.metrics = metrics

    def run_once(self, conn: db.Conn) -> QueueMetricsResult:
        """One refresh on an autocommit connection. Raises DatabaseError; the gauges keep
        their last values then."""
        with db.counting_reads(conn):
            stats = db.queue_stats(conn, self.schema, active_only=True)
            controls = db.type_controls(conn, self.schema)
            limits = db.type_limits(conn, self.schema)
            depth = db.depth(conn, self.schema)
            paused = workflows.paused(conn, self.schema)
        self.metrics.update_workflows(paused)
        self.metrics.update_queue(stats)
        self.metrics.depth.set(depth)
        self.metrics.update_controls(controls, stats)
        self.metrics.update_limits(limits)
        return QueueMetricsResult(len(stats))


class _IPv6Server(ThreadingHTTPServer):
    """For an IPv6 metrics_host such as "::" (which also takes IPv4 where the OS allows)."""

    address_family = socket.AF_INET6


class MetricsServer:
    """/metrics, /healthz (the loop is alive), /readyz (database reachable, LISTEN up)."""

    def __init__(
        self,
        metrics: Metrics,
        host: str,
        port: int,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, outer.metrics.render(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = outer.healthy()
                    self._reply(200 if ok else 503, b"ok\n" if ok else b"stalled\n")
                elif path == "/readyz":
                    ok = outer.ready()
                    self._reply(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
                else:
                    self._reply(404, b"not found\n")

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would flood the log

        self.metrics = metrics
        self.healthy = healthy
        self.ready = ready
        server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
        self.server = server_class((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="pgq-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", self.server.server_address[0], self.port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
