"""Prometheus metrics and health endpoints, served by the supervisor on `metrics_port`.

Children never touch these: they report outcomes over their pipes and the supervisor counts
them here, so no multiprocess metric files are needed.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from pgq_supervisor import db
from pgq_supervisor.coverage import Coverage, coverage
from pgq_supervisor.db import workflows
from pgq_supervisor.ipc import DURATION_BUCKETS, Report
from pgq_supervisor.jobs import JobState, TypeStats

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Durations(Collector):
    """pgq_job_duration_seconds, the series a prometheus Histogram with DURATION_BUCKETS shows,
    filled from the bucket counts the children report (ipc.Report), not one job at a time."""

    NAME = "pgq_job_duration_seconds"

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the metrics server's threads collect
        self._by_type: dict[str, tuple[list[int], list[float]]] = {}

    def add(self, type_: str, counts: Sequence[int], seconds: float) -> None:
        with self._lock:
            entry = self._by_type.get(type_)
            if entry is None:
                entry = self._by_type[type_] = ([0] * (len(DURATION_BUCKETS) + 1), [0.0])
            for i, n in enumerate(counts):
                entry[0][i] += n
            entry[1][0] += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            self.NAME, "Handler run time of the attempts in pgq_jobs_total", labels=["type"]
        )
        bounds = [*(repr(float(b)) for b in DURATION_BUCKETS), "+Inf"]  # as Histogram spells them
        with self._lock:
            for type_, (counts, total) in sorted(self._by_type.items()):
                cumulative = list(itertools.accumulate(counts))
                family.add_metric([type_], list(zip(bounds, cumulative, strict=True)), total[0])
        yield family


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ready = Gauge(
            "pgq_jobs_ready", "Pending jobs due now (whole database)", ["type"], registry=r
        )
        self.delayed = Gauge(
            "pgq_jobs_delayed",
            "Pending jobs not due yet: start_at in the future, retry backoff (whole database)",
            ["type"],
            registry=r,
        )
        self.running = Gauge(
            "pgq_jobs_running",
            "Running jobs, held by any worker (whole database)",
            ["type"],
            registry=r,
        )
        self.oldest_ready = Gauge(
            "pgq_oldest_ready_age_seconds",
            "How long the oldest ready job has been due, 0 when none (whole database)",
            ["type"],
            registry=r,
        )
        self.finished = Counter(
            "pgq_jobs_total",
            "Attempts ended in this supervisor's children: succeeded, retried (will run again),"
            " failed (for good), lost (the lease was gone: nothing written), snoozed"
            " (pgq.Snooze), suspended (a workflow's sleep, wait or step retry)",
            ["type", "outcome"],
            registry=r,
        )
        self.rescued = Counter(
            "pgq_jobs_rescued_total",
            "Jobs this supervisor's rescuer reclaimed from stale heartbeats (of any pod)",
            registry=r,
        )
        self.deaths = Counter(
            "pgq_worker_deaths_total",
            "Attempts ended because the child died holding the job (each also retries or fails it)",
            ["type"],
            registry=r,
        )
        self.timeouts = Counter(
            "pgq_job_timeouts_total",
            "Attempts ended by killing the child after the job's timeout",
            ["type"],
            registry=r,
        )
        self.restarts = Counter(
            "pgq_child_restarts_total",
            "Children respawned: after a death, or recycled by max_jobs_per_child or"
            " max_memory_per_child",
            registry=r,
        )
        self.pruned = Counter(
            "pgq_jobs_pruned_total",
            "Finished jobs deleted by retention (state: succeeded, or failed for failed and"
            " cancelled)",
            ["state"],
            registry=r,
        )
        self.children = Gauge("pgq_children", "Live child processes", registry=r)
        self.boot_failures = Counter(
            "pgq_child_boot_failures_total",
            "Children that exited before they could claim (could not connect: respawned after a"
            " jittered backoff; /readyz says not ready until each such child starts)",
            registry=r,
        )
        self.in_flight = Gauge(
            "pgq_child_jobs_in_flight",
            "Jobs a child runs now (its concurrency at most), read from its slot each second",
            ["child"],
            registry=r,
        )
        self.duration = Durations()
        r.register(self.duration)
        self.wake_latency = Histogram(
            "pgq_wake_latency_seconds",
            "From the supervisor waking an idle child to the claim that found work",
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
        self.vacuum_findings = Gauge(
            "pgq_vacuum_findings",
            "What `doctor` would report now: sessions, replication slots or prepared"
            " transactions holding the xmin horizon back, a job table vacuum does not keep up"
            " with, autovacuum off (0: healthy)",
            registry=r,
        )
        self.horizon_age = Gauge(
            "pgq_vacuum_horizon_age_seconds",
            "How long the oldest transaction of this database that holds a snapshot (or a"
            " prepared one) has been open: vacuum keeps every row version it may see",
            registry=r,
        )
        self.dead_tuples = Gauge(
            "pgq_job_dead_tuples", "Dead row versions in the job table (estimate)", registry=r
        )
        self.table_bytes = Gauge(
            "pgq_job_table_bytes", "The job table's size with its indexes and TOAST", registry=r
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
        self.unserved = Gauge(
            "pgq_unserved_jobs",
            "Pending jobs of a type no live supervisor serves (its row refreshed within 3 x"
            " heartbeat_interval lists the types it serves): a type misspelt at enqueue, or"
            " one whose supervisors are all gone; such jobs wait forever (0: every type served)",
            ["type"],
            registry=r,
        )
        self._unserved: set[str] = set()
        self._known_types: set[str] = set()
        self._paused_keys: set[tuple[str, str]] = set()
        self._controlled: set[str] = set()
        self._limited: set[str] = set()

    def record(self, report: Report) -> None:
        """What a child reported (summed there, see ipc.Report)."""
        for type_, kind, n in report.ended:
            self.finished.labels(type_, kind).inc(n)
        for type_, counts, seconds in report.durations:
            self.duration.add(type_, counts, seconds)
        for seconds in report.wake_latencies:
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

    def update_unserved(self, cover: Coverage) -> None:
        now = {u.type: u.pending for u in cover.unserved}
        # a type served again (or drained) reports 0 rather than a stale value
        for t in now.keys() | self._unserved:
            self.unserved.labels(t).set(now.get(t, 0))
        self._unserved |= now.keys()

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
    jobs held back by a pause, a rate or a concurrency limit; the queue's depth; pending jobs of
    types no live supervisor serves), refreshed from the database.
    Every supervisor reports the same queue-wide values."""

    def __init__(self, schema: str, metrics: Metrics, stale_after: float) -> None:
        self.schema = schema
        self.metrics = metrics
        self.stale_after = stale_after  # a supervisor row's liveness (coverage.is_stale)

    def run_once(self, conn: db.Conn) -> QueueMetricsResult:
        """One refresh on an autocommit connection. Raises DatabaseError; the gauges keep
        their last values then."""
        with db.counting_reads(conn):
            stats = db.queue_stats(conn, self.schema, active_only=True)
            controls = db.type_controls(conn, self.schema)
            limits = db.type_limits(conn, self.schema)
            depth = db.depth(conn, self.schema)
            paused = workflows.paused(conn, self.schema)
            supervisors = db.list_supervisors(conn, self.schema)
        pending: dict[str, int] = {}
        for x in stats:
            if x.state is JobState.PENDING:
                pending[x.type] = pending.get(x.type, 0) + x.count
        self.metrics.update_unserved(coverage(pending, supervisors, self.stale_after))
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
