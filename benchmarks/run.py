"""`python -m benchmarks`: every measure of SPEC §8 / issue 5, the median of --runs runs each.

The harness makes its own scratch databases on the server (dropped at the end), prints one
line per step to stderr, then a table to stdout, and writes everything to a JSON file.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from types import FrameType
from typing import NoReturn

from benchmarks import (
    deadpod,
    deep,
    drain,
    enqueue,
    fairness,
    hol,
    horizon,
    peers,
    probes,
    retention,
    soak,
    wal,
    web,
    workflows,
)
from benchmarks.apps import LIMIT, calibrate_spin
from benchmarks.options import Options, parse_args
from benchmarks.procs import ROOT
from benchmarks.progress import Progress, Step
from benchmarks.report import (
    Json,
    Measure,
    Ratio,
    Results,
    Target,
    fmt,
    markdown,
    table,
    write_json,
)
from benchmarks.server import Scratch, Server, find_server
from pgq_supervisor.worker.adaptive import ADAPTIVE_MOST

WORKFLOW_STEPS = 1000  # workflows: no-op steps timed per run
WORKFLOW_SLEEPERS = 10_000  # workflows: sleeping workflows behind the claim

RESULTS_DIR = ROOT / "benchmarks" / "results"
# the one non-default setting the harness measures, beside the default, for comparison
QUIET_LOG = ("--log-level", "warning")
DEPS_WAITING = 10_000  # the deps group: jobs left waiting in the table through a drain
MEMORY_PROCS = 8  # the memory group: children per supervisor (issue 15)
# the io group (issue 11): I/O-bound jobs, many in flight per child
IO_JOBS = 5_000
IO_SECONDS = 0.05
IO_PROCS = 2
IO_ASYNC_CONCURRENCY = 100
IO_THREAD_CONCURRENCY = 20


# the horizon group's figures: key, label, unit; issue 35's targets for held / clean (and
# scan / clean), and for the reader on our tables against the control's (scan / control)
HORIZON_FIGURES = (
    ("rate", "jobs run a second", "jobs/s"),
    ("backlog", "largest backlog", "jobs"),
    ("claim_p99", "claim p99", "ms"),
    ("wake_p99", "wake p99", "ms"),
    ("size", "job table + indexes after the run", "MiB"),
    ("schema", "the schema's relations after the run", "MiB"),
)
HORIZON_TARGETS = {
    "rate": Target(">=", 0.95),
    "claim_p99": Target("<=", 1.5),
    "wake_p99": Target("<=", 1.5),
    "schema": Target("<=", 1.3),
}
HORIZON_CONTROL_TARGETS = {
    "claim_p99": Target("<=", 1.2),
    "wake_p99": Target("<=", 1.2),
}


class Bench:
    """Builds the plan of steps from the arguments; each step fills `results`."""

    def __init__(self, opts: Options, server: Server, scratch: Scratch) -> None:
        self.opts = opts
        self.server = server
        self.scratch = scratch
        self.results = Results()
        self.cores = len(os.sched_getaffinity(0))
        self.cpu_procs = list(range(1, self.cores + 1))
        self.dsn = ""
        self.peer_dsn: dict[peers.Peer, str] = {}
        self.peer_info: dict[str, Json] = {}
        self.spin_loops = 0
        self.order: list[str | Ratio] = []
        self.active_peers: list[peers.Peer] = []
        self.web_dsn = ""
        self.wal_dsn: dict[str, str] = {}  # the wal group's database of each system

    # ---- plan ----

    def plan(self) -> list[Step]:
        o = self.opts
        steps = [Step("set up scratch databases", self.setup, ())]
        runs = range(1, o.runs + 1)
        self.active_peers = active_peers = self.usable_peers()
        if "enqueue" in o.groups:
            for r in runs:
                steps += self.enqueue_steps(r, active_peers)
        if "drain" in o.groups:
            for r in runs:
                steps += self.drain_steps(r, active_peers)
        if "wal" in o.groups:
            wal_peers = [p for p in active_peers if p in wal.WAL_PEERS]
            steps.append(Step("set up the wal group's databases", self.wal_setup, ()))
            for r in runs:
                steps += [self.wal_step(r, peer) for peer in (None, *wal_peers)]
        if "webidx" in o.groups:
            for r in runs:
                steps += self.webidx_steps(r)
        if "deps" in o.groups:
            for r in runs:
                steps += self.deps_steps(r)
        if "limits" in o.groups:
            for r in runs:
                steps += self.limits_steps(r)
        if "hol" in o.groups:
            for r in runs:
                steps += self.hol_steps(r)
        if "fairness" in o.groups:
            for r in runs:
                steps += self.fairness_steps(r)
        if "horizon" in o.groups:
            for r in runs:
                steps += self.horizon_steps(r)
        if "cpu" in o.groups:
            steps.append(Step("calibrate the CPU-bound job", self.calibrate, ()))
            for r in runs:
                for procs in self.cpu_procs:
                    steps += [self.cpu_step(r, procs), self.cpu_bare_step(r, procs)]
        if "io" in o.groups:
            for r in runs:
                steps += self.io_steps(r, active_peers)
        if "wake" in o.groups:
            for r in runs:
                steps.append(self.wake_step(r))
        if "kill" in o.groups:
            for r in runs:
                steps.append(self.kill_step(r))
        if "deadpod" in o.groups:
            for r in runs:
                steps.append(self.dead_pod_step(r))
        if "cancel" in o.groups:
            for r in runs:
                steps.append(self.cancel_step(r))
        if "memory" in o.groups:
            for r in runs:
                steps.append(self.memory_step(r))
        if "deep" in o.groups:
            for r in runs:
                steps += self.deep_steps(r)
        if "retention" in o.groups:
            for r in runs:
                steps += [self.retention_step(r, path) for path in retention.PATHS]
        if "soak" in o.groups:
            for r in runs:
                steps.append(self.soak_step(r))
        if "workflows" in o.groups:
            for r in runs:
                steps += self.workflow_steps(r)
        if "web" in o.groups:
            steps.append(Step(f"fill {o.web_jobs:,} finished jobs (web)", self.web_fill, ()))
            for r in runs:
                steps.append(self.web_step(r))
        self.layout()
        return steps

    def usable_peers(self) -> list[peers.Peer]:
        if not self.opts.peers or not {"enqueue", "drain", "io", "wal"} & set(self.opts.groups):
            return []
        usable: list[peers.Peer] = []
        for peer in peers.PEERS:
            if peer not in self.opts.peers:
                continue
            reason = peers.unavailable(peer)
            self.peer_info[peer] = {
                "version": None if reason else peers.version(peer),
                "config": peers.config(peer),
                "unavailable": reason,
            }
            if reason is None:
                usable.append(peer)
            else:
                for key, label in self.peer_labels(peer).items():
                    self.results.measure(key, label, "jobs/s").errors.append(reason)
                if "wal" in self.opts.groups and peer in wal.WAL_PEERS:
                    self.wal_measures(peer)["total"].errors.append(reason)
        return usable

    def peer_labels(self, peer: peers.Peer) -> dict[str, str]:
        return {
            f"peer.{peer}.bulk": f"bulk enqueue, {peer} (1,000 per call)",
            f"peer.{peer}.drain": f"drain no-op jobs, {peer} ({peers.describe_workers(peer)})",
        }

    def layout(self) -> None:
        """The table's rows: measures in order, each ratio under what it compares. Peers that
        could not run are shown too, with the reason."""
        shown = [p for p in peers.PEERS if p in self.peer_info]
        drains = [f"drain.procs_{p}" for p in self.opts.drain_procs]
        self.order = [
            "enqueue.single",
            "enqueue.single_bare",
            Ratio(
                "ours / bare INSERT loop",
                ("enqueue.single",),
                "enqueue.single_bare",
                Target(">=", 0.9),
            ),
            "enqueue.bulk",
            "enqueue.bulk_bare",
            "enqueue.bulk_copy",
            # issue 15: >= 2x pgqueuer or >= 0.9x a bare COPY, whichever bound is lower
            Ratio("ours / bare COPY", ("enqueue.bulk",), "enqueue.bulk_copy", Target(">=", 0.9)),
        ]
        for p in shown:
            self.order.append(f"peer.{p}.bulk")
        for p in shown:
            target = Target(">=", 2.0) if p == "pgqueuer" else None
            self.order.append(Ratio(f"ours / {p}", ("enqueue.bulk",), f"peer.{p}.bulk", target))
        self.order += drains
        if drains:
            quiet = self.quiet_procs
            self.order.append(f"drain.procs_{quiet}_quiet")
            self.order.append(
                Ratio(
                    "default log / warning",
                    (f"drain.procs_{quiet}",),
                    f"drain.procs_{quiet}_quiet",
                    Target(">=", 0.95),
                )
            )
        for p in shown:
            self.order.append(f"peer.{p}.drain")
        for p in shown:
            target = Target(">=", 1.5) if p == "pgqueuer" else None
            best = " best" if p == "graphile-worker" else ""  # its best configuration (graphile.py)
            self.order.append(Ratio(f"ours / {p}{best}", tuple(drains), f"peer.{p}.drain", target))
        if "wal" in self.opts.groups:
            self.order += self.wal_layout([p for p in shown if p in wal.WAL_PEERS])
        if "webidx" in self.opts.groups:
            self.order += [
                "webidx.plain",
                "webidx.indexed",
                Ratio("with / without", ("webidx.indexed",), "webidx.plain", Target(">=", 0.9)),
                "webidx.bulk_plain",
                "webidx.bulk_indexed",
                Ratio("with / without", ("webidx.bulk_indexed",), "webidx.bulk_plain"),
            ]
        if "deps" in self.opts.groups:
            self.order += [
                "deps.plain",
                "deps.waiting",
                Ratio("with / without waiting", ("deps.waiting",), "deps.plain", Target(">=", 0.9)),
            ]
        if "limits" in self.opts.groups:
            self.order += [
                "limits.plain",
                "limits.limited",
                Ratio(
                    "limited / unlimited", ("limits.limited",), "limits.plain", Target(">=", 0.8)
                ),
            ]
        if "hol" in self.opts.groups:
            self.order += [
                "hol.default",
                "hol.batch_1",
                Ratio("defaults / --claim-batch 1", ("hol.default",), "hol.batch_1",
                      Target("<=", 1.3)),
            ]  # fmt: skip
        if "fairness" in self.opts.groups:
            lo, hi = fairness.CLAIM_TENANTS
            self.order += [
                "fairness.empty_p99",
                "fairness.p99",
                Ratio("with A's backlog / empty", ("fairness.p99",), "fairness.empty_p99",
                      Target("<=", 2.0)),
                "fairness.claims_passing",
                "fairness.unfair_drain",
                "fairness.drain",
                Ratio("fair / unfair", ("fairness.drain",), "fairness.unfair_drain",
                      Target(">=", 0.8)),
                f"fairness.claim_{lo}",
                f"fairness.claim_{hi}",
                Ratio(f"{hi:,} / {lo} tenants", (f"fairness.claim_{hi}",), f"fairness.claim_{lo}",
                      Target("<=", 1.5)),
            ]  # fmt: skip
        if "horizon" in self.opts.groups:
            self.order += self.horizon_layout()
        self.order += [f"cpu.procs_{p}" for p in self.cpu_procs]
        if len(self.cpu_procs) >= 2:
            self.order.append(
                Ratio("2 procs / 1 proc", ("cpu.procs_2",), "cpu.procs_1", Target(">=", 1.8))
            )
        self.order += [f"cpu.bare_procs_{p}" for p in self.cpu_procs]
        if len(self.cpu_procs) >= 2:
            # the machine's own scaling: when it is low too, the cores were not free
            self.order.append(Ratio("2 / 1, no queue", ("cpu.bare_procs_2",), "cpu.bare_procs_1"))
        if "io" in self.opts.groups:
            self.order += ["io.async_default", "io.async", "io.threads"]
            if "pgqueuer" in shown:
                self.order += ["peer.pgqueuer.io", "peer.pgqueuer.io_capped"]
                self.order.append(
                    Ratio(
                        "ours at the defaults / pgqueuer, I/O",
                        ("io.async_default",),
                        "peer.pgqueuer.io",
                        Target(">=", 1),
                    )
                )
                self.order.append(
                    Ratio("ours, --concurrency 100 / pgqueuer, I/O", ("io.async",),
                          "peer.pgqueuer.io")
                )  # fmt: skip
                self.order.append(
                    Ratio(
                        "ours / pgqueuer, I/O, same jobs in flight",
                        ("io.async",),
                        "peer.pgqueuer.io_capped",
                    )
                )
        self.order += [
            "wake.p50",
            "wake.p99",
            "kill.rerun",
            "deadpod.rerun",
            "cancel.free",
            "rss.idle",
        ]
        self.order += [f"mem.{k}" for k in ("uss", "pss", "rss", "startup", "respawn")]
        if "deep" in self.opts.groups:
            self.order += [
                "deep.fresh",
                "deep.behind",
                Ratio("behind / fresh", ("deep.behind",), "deep.fresh", Target(">=", 0.8)),
                "deep.next_due",
                "deep.claim",
            ]
        if "retention" in self.opts.groups:
            self.order += [
                f"retention.{path}.{m}"
                for path in retention.PATHS
                for m in ("seconds", "wal", "dead")
            ]
        if "soak" in self.opts.groups:
            self.order += ["soak.throughput", "soak.size", "soak.backlog"]
        if "workflows" in self.opts.groups:
            self.order += ["wf.step", "wf.conn_step", "wf.replay", "wf.claim"]
        self.order += ["web.p50", "web.p95", "web.id", "web.payload", "web.payload_gin"]
        self.order += ["web.type_1h", "web.type_7d"]
        self.results.ratios = [r for r in self.order if isinstance(r, Ratio)]

    # ---- steps ----

    def setup(self) -> str:
        self.dsn = self.scratch.create("pgq", migrate=True)
        for peer in self.active_peers:
            dsn = self.scratch.create(peer)
            peers.install(peer, dsn)
            self.peer_dsn[peer] = dsn
            info = self.peer_info.get(peer)
            if isinstance(info, dict):  # graphile-worker's version is known once installed
                info["version"] = peers.version(peer)
        names = ["pgq", *self.peer_dsn]
        return f"{', '.join(names)} on {self.server.origin} server"

    def enqueue_steps(self, r: int, active_peers: Sequence[peers.Peer]) -> list[Step]:
        o = self.opts
        res = self.results
        single = res.measure("enqueue.single", "enqueue, 1 job per transaction", "jobs/s")
        bare = res.measure("enqueue.single_bare", "enqueue, bare INSERT per transaction", "jobs/s")
        bulk = res.measure("enqueue.bulk", "bulk enqueue, enqueue_many (1,000 per call)", "jobs/s")
        bulk_bare = res.measure(
            "enqueue.bulk_bare",
            "bulk enqueue, bare INSERT … unnest (1,000 per statement)",
            "jobs/s",
        )
        bulk_copy = res.measure(
            "enqueue.bulk_copy", "bulk enqueue, bare COPY (1,000 rows per COPY)", "jobs/s"
        )
        tag = f"run {r}/{o.runs}"
        steps = [
            self.single_step(
                f"{tag} enqueue: {o.single_jobs:,} jobs one per transaction, ours and a bare"
                " INSERT in turns",
                single,
                bare,
            ),
            self.rate_step(
                f"{tag} enqueue: bare INSERT … unnest, {o.bulk_jobs:,} jobs",
                bulk_bare,
                lambda: enqueue.bulk_bare(self.dsn, o.bulk_jobs),
            ),
            self.rate_step(
                f"{tag} enqueue: bare COPY, {o.bulk_jobs:,} jobs",
                bulk_copy,
                lambda: enqueue.bulk_copy_bare(self.dsn, o.bulk_jobs),
            ),
            self.rate_step(
                f"{tag} enqueue: pgq.enqueue_many, {o.bulk_jobs:,} jobs",
                bulk,
                lambda: enqueue.bulk(self.dsn, o.bulk_jobs),
            ),
        ]
        for peer in active_peers:
            key = f"peer.{peer}.bulk"
            m = res.measure(key, self.peer_labels(peer)[key], "jobs/s")
            steps.append(
                self.rate_step(
                    f"{tag} enqueue: {peer} bulk, {o.bulk_jobs:,} jobs",
                    m,
                    self.peer_bulk(peer),
                )
            )
        return steps

    def single_step(self, label: str, ours: Measure, bare: Measure) -> Step:
        def action() -> str:
            mine, floor = enqueue.single_pair(self.dsn, self.opts.single_jobs)
            ours.add(mine)
            bare.add(floor)
            return f"ours {fmt(mine, 'jobs/s')} jobs/s, bare {fmt(floor, 'jobs/s')} jobs/s"

        return Step(label, action, (ours, bare))

    def rate_step(self, label: str, m: Measure, measure: Callable[[], float]) -> Step:
        def action() -> str:
            value = measure()
            m.add(value)
            return f"{fmt(value, 'jobs/s')} jobs/s"

        return Step(label, action, (m,))

    def drain_steps(self, r: int, active_peers: Sequence[peers.Peer]) -> list[Step]:
        o = self.opts
        tag = f"run {r}/{o.runs}"
        steps = []
        for procs in o.drain_procs:
            m = self.results.measure(
                f"drain.procs_{procs}",
                f"drain no-op jobs, {procs} proc{'s' * (procs > 1)}",
                "jobs/s",
            )
            steps.append(
                self.drained_step(
                    f"{tag} drain: {o.drain_jobs:,} no-op jobs, --procs {procs}",
                    m,
                    self.our_drain(procs),
                )
            )
            if procs == self.quiet_procs:
                # back to back with the default run above: what the default log level costs
                quiet = self.results.measure(
                    f"drain.procs_{procs}_quiet",
                    f"drain no-op jobs, {procs} procs, --log-level warning (not default)",
                    "jobs/s",
                )
                steps.append(
                    self.drained_step(
                        f"{tag} drain: {o.drain_jobs:,} no-op jobs, --procs {procs}"
                        " --log-level warning",
                        quiet,
                        self.our_drain(procs, QUIET_LOG),
                    )
                )
        for peer in active_peers:
            key = f"peer.{peer}.drain"
            m = self.results.measure(key, self.peer_labels(peer)[key], "jobs/s")
            steps.append(
                self.drained_step(
                    f"{tag} drain: {o.drain_jobs:,} no-op jobs, {peer}",
                    m,
                    self.peer_drain(peer),
                )
            )
        return steps

    def deps_steps(self, r: int) -> list[Step]:
        """The same drain without and with 10,000 jobs waiting on dependencies, back to back:
        waiting jobs are out of the claim's index, so they should cost nothing."""
        o = self.opts
        procs = self.quiet_procs
        plain = self.results.measure(
            "deps.plain", f"drain no-op jobs, {procs} procs (deps group: nothing waiting)", "jobs/s"
        )
        waiting = self.results.measure(
            "deps.waiting", f"the same with {DEPS_WAITING:,} jobs waiting on dependencies", "jobs/s"
        )

        def run(n_waiting: int) -> Callable[[], drain.Drained]:
            return lambda: drain.run_drain(
                self.dsn, procs, o.drain_jobs, gate=o.start_gate,
                supervisor_args=o.supervisor_args, waiting=n_waiting,
            )  # fmt: skip

        tag = f"run {r}/{o.runs} deps: {o.drain_jobs:,} no-op jobs, --procs {procs}"
        return [
            self.drained_step(f"{tag}, nothing waiting", plain, run(0)),
            self.drained_step(f"{tag}, {DEPS_WAITING:,} waiting", waiting, run(DEPS_WAITING)),
        ]

    def webidx_steps(self, r: int) -> list[Step]:
        """The same drain without and with the payload search's opt-in GIN index
        (job_payload_idx, `dashboard-indexes --payload`), back to back, the jobs carrying a
        payload of three keys (a GIN entry each) rather than the usual empty one."""
        o = self.opts
        procs = self.quiet_procs
        plain = self.results.measure(
            "webidx.plain", f"drain no-op jobs, {procs} procs, 3-key payloads (no GIN)", "jobs/s"
        )
        indexed = self.results.measure(
            "webidx.indexed", "the same with job_payload_idx (GIN, jsonb_path_ops)", "jobs/s"
        )

        def run(with_index: bool) -> Callable[[], drain.Drained]:
            def go() -> drain.Drained:
                web.payload_index(self.dsn, present=with_index)
                return drain.run_drain(
                    self.dsn, procs, o.drain_jobs, gate=o.start_gate,
                    supervisor_args=o.supervisor_args, payload=web.DRAIN_PAYLOAD,
                )  # fmt: skip

            return go

        def enqueue_with(with_index: bool) -> Callable[[], float]:
            def go() -> float:
                web.payload_index(self.dsn, present=with_index)
                return enqueue.bulk(self.dsn, o.bulk_jobs, web.enqueue_payload)

            return go

        bulk_plain = self.results.measure(
            "webidx.bulk_plain", "enqueue_many, 3-key payloads (no GIN)", "jobs/s"
        )
        bulk_indexed = self.results.measure(
            "webidx.bulk_indexed", "the same with job_payload_idx", "jobs/s"
        )
        tag = f"run {r}/{o.runs} webidx: {o.drain_jobs:,} no-op jobs, --procs {procs}"
        etag = f"run {r}/{o.runs} webidx: enqueue_many, {o.bulk_jobs:,} jobs"
        return [
            self.drained_step(f"{tag}, no payload index", plain, run(False)),
            self.drained_step(f"{tag}, job_payload_idx", indexed, run(True)),
            self.rate_step(f"{etag}, no payload index", bulk_plain, enqueue_with(False)),
            self.rate_step(f"{etag}, job_payload_idx", bulk_indexed, enqueue_with(True)),
        ]

    def limits_steps(self, r: int) -> list[Step]:
        """The same drain without and with global_concurrency=1000 on the type, back to back
        (issue 12: the limited drain at least 0.8 of the other)."""
        o = self.opts
        procs = self.quiet_procs
        plain = self.results.measure(
            "limits.plain", f"drain no-op jobs, {procs} procs (limits group: no limit)", "jobs/s"
        )
        limited = self.results.measure(
            "limits.limited", f"the same with global_concurrency={LIMIT:,} on the type", "jobs/s"
        )

        def run(extra: Sequence[str]) -> Callable[[], drain.Drained]:
            args = (*o.supervisor_args, *extra)
            return lambda: drain.run_drain(
                self.dsn, procs, o.drain_jobs, gate=o.start_gate, supervisor_args=args
            )

        tag = f"run {r}/{o.runs} limits: {o.drain_jobs:,} no-op jobs, --procs {procs}"
        return [
            self.drained_step(f"{tag}, no limit", plain, run(())),
            self.drained_step(
                f"{tag}, global_concurrency={LIMIT:,}",
                limited,
                run(("--app", "benchmarks.apps:limited")),
            ),
        ]

    def fairness_steps(self, r: int) -> list[Step]:
        """Fair claims across tenants (issue 24 item 4): the small tenants' wake-to-start
        into an empty queue and beside A's backlog, the type's drain with and without tenants,
        and the claim's cost with the backlog spread over few and many tenants."""
        o = self.opts
        args = o.supervisor_args
        n = f"{fairness.FAIR_BACKLOG:,}"
        stream = f"tenants B..K enqueue 1 job/s each, --procs {fairness.FAIR_PROCS}"
        empty = self.results.measure(
            "fairness.empty_p99", f"{stream}, empty queue: wake-to-start p99", "ms"
        )
        loaded = self.results.measure(
            "fairness.p99", f"{stream}, tenant A with {n} pending: wake-to-start p99", "ms"
        )
        fair = self.results.measure("fairness.drain", f"the type's drain of A's {n}", "jobs/s")
        passed = self.results.measure(
            "fairness.claims_passing",
            "claims of A's jobs that passed a small tenant's job (begun after its enqueue"
            " committed, before its claim), p99",
            "claims",
        )
        unfair = self.results.measure(
            "fairness.unfair_drain", f"the same {n} without a tenant (plain claim)", "jobs/s"
        )
        tag = f"run {r}/{o.runs} fairness"

        def run_empty() -> str:
            s = fairness.run_empty(self.dsn, args)
            empty.add(s.p99, s.details())
            return f"p99 {s.p99:.1f} ms over {len(s.latencies_ms)} jobs"

        def run_fair() -> str:
            f = fairness.run_fair(self.dsn, args)
            loaded.add(f.stream.p99, f.details())
            fair.add(f.rate, f.details())
            passed.add(f.passed_by_p99, f.details())
            return (
                f"p99 {f.stream.p99:.1f} ms, {f.passed_by_p99:g} claims passing it,"
                f" A drained at {f.rate:,.0f} jobs/s"
            )

        def run_unfair() -> str:
            rate = fairness.run_unfair(self.dsn, args)
            unfair.add(rate)
            return f"{rate:,.0f} jobs/s"

        steps = [
            Step(f"{tag}: empty queue", run_empty, (empty,)),
            Step(f"{tag}: A's backlog, B..K streaming", run_fair, (loaded, fair, passed)),
            Step(f"{tag}: the backlog without tenants", run_unfair, (unfair,)),
        ]
        for tenants in fairness.CLAIM_TENANTS:
            m = self.results.measure(
                f"fairness.claim_{tenants}",
                f"a claim of {fairness.CLAIM_LIMIT} from {n} pending over {tenants:,} tenants",
                "ms",
            )

            def cost(m: Measure = m, tenants: int = tenants) -> str:
                ms = fairness.claim_cost(self.dsn, tenants)
                m.add(ms)
                return f"{ms:.2f} ms per claim"

            steps.append(Step(f"{tag}: claim cost, {tenants:,} tenants", cost, (m,)))
        return steps

    def horizon_steps(self, r: int) -> list[Step]:
        """Vacuum's horizon held back (issue 23 item 2): the same steady flow with nothing
        else, with a snapshot held throughout, and with that and a reader scanning the table."""
        o = self.opts
        secs = o.horizon_seconds
        flow = f"{horizon.HORIZON_RATE:,} jobs/s for {secs:g} s, --procs {horizon.PROCS}"
        steps = []
        for variant in horizon.VARIANTS:
            ms = {
                key: self.results.measure(f"horizon.{variant}.{key}", f"{label}, {variant}", unit)
                for key, label, unit in HORIZON_FIGURES
            }

            def action(variant: str = variant, ms: dict[str, Measure] = ms) -> str:
                w = horizon.run_weather(self.dsn, variant, secs, o.supervisor_args)
                d = w.details()
                values = {
                    "rate": w.rate,
                    "backlog": float(w.max_backlog),
                    "claim_p99": w.claim_p99,
                    "wake_p99": w.wake_p99_ms,
                    "size": w.table_bytes / 2**20,
                    "schema": w.schema_bytes / 2**20,
                }
                for key, m in ms.items():
                    m.add(values[key], d)
                return (
                    f"{w.rate:,.0f} jobs/s, backlog <= {w.max_backlog:,}, claim p99"
                    f" {w.claim_p99:.1f} ms, wake p99 {w.wake_p99_ms:.1f} ms,"
                    f" table {w.table_bytes / 2**20:,.0f} MiB,"
                    f" schema {w.schema_bytes / 2**20:,.0f} MiB"
                )

            steps.append(
                Step(f"run {r}/{o.runs} horizon, {variant}: {flow}", action, tuple(ms.values()))
            )
        return steps

    def horizon_layout(self) -> list[str | Ratio]:
        order: list[str | Ratio] = []
        for key, label, _ in HORIZON_FIGURES:
            order += [f"horizon.{v}.{key}" for v in horizon.VARIANTS]
            target = HORIZON_TARGETS.get(key)
            for v in ("held", "scan"):
                order.append(
                    Ratio(f"{label}: {v} / clean", (f"horizon.{v}.{key}",),
                          f"horizon.clean.{key}", target)
                )  # fmt: skip
            order.append(
                Ratio(f"{label}: scan / control (the reader on our tables / elsewhere)",
                      ("horizon.scan." + key,), "horizon.control." + key,
                      HORIZON_CONTROL_TARGETS.get(key))
            )  # fmt: skip
        return order

    def wal_measures(self, system: str) -> dict[str, Measure]:
        who = "ours (enqueue_many, --procs 2)" if system == wal.OURS else system
        figures = (
            ("enqueue", f"WAL per job, enqueue, {who}"),
            ("drain", f"WAL per job, drain, {who}"),
            ("total", f"WAL per job, enqueue + drain, {who}"),
            ("retained", f"schema bytes per retained job after the drain, {who}"),
        )
        return {
            key: self.results.measure(f"wal.{system}.{key}", label, "B/job")
            for key, label in figures
        }

    def wal_layout(self, shown: Sequence[str]) -> list[str | Ratio]:
        """Each system's four figures, then ours / each peer: WAL (issue 35's target against
        graphile-worker) and retained bytes."""
        order: list[str | Ratio] = []
        for system in (wal.OURS, *shown):
            order += [f"wal.{system}.{key}" for key in ("enqueue", "drain", "total", "retained")]
        for p in shown:
            target = Target("<=", 0.7) if p == "graphile-worker" else None
            order.append(
                Ratio(f"ours / {p}, WAL enqueue + drain", ("wal.pgq.total",), f"wal.{p}.total",
                      target)
            )  # fmt: skip
            order.append(
                Ratio(f"ours / {p}, schema bytes per retained job", ("wal.pgq.retained",),
                      f"wal.{p}.retained")
            )  # fmt: skip
        return order

    def wal_setup(self) -> str:
        self.wal_dsn[wal.OURS] = self.scratch.create(f"wal_{wal.OURS}", migrate=True)
        for peer in self.active_peers:
            if peer in wal.WAL_PEERS:
                self.wal_dsn[peer] = dsn = self.scratch.create(f"wal_{peer}")
                peers.install(peer, dsn)
        return ", ".join(self.wal_dsn)

    def wal_step(self, r: int, peer: peers.Peer | None) -> Step:
        """One run of the wal group: ours (`peer` None) or a peer's."""
        o = self.opts
        system = peer or wal.OURS
        ms = self.wal_measures(system)

        def action() -> str:
            dsn = self.wal_dsn[system]
            if peer is None:
                w = wal.run_ours(
                    dsn, o.wal_jobs, gate=o.start_gate, supervisor_args=o.supervisor_args
                )
            else:
                w = wal.run_peer(peer, dsn, o.wal_jobs)
            ms["enqueue"].add(w.enqueue_per_job, w.details())
            ms["drain"].add(w.drain_per_job)
            ms["total"].add(w.total_per_job)
            ms["retained"].add(w.retained_per_job)
            return w.summary()

        what = peer or "ours, --procs 2"
        return Step(
            f"run {r}/{o.runs} wal: {o.wal_jobs:,} no-op jobs enqueued and drained, {what}",
            action,
            tuple(ms.values()),
        )

    def retention_step(self, r: int, path: str) -> Step:
        o = self.opts
        n = o.retention_jobs
        res = self.results
        what = f"expiring {n:,} finished jobs ({retention.PATHS[path]})"
        key = f"retention.{path}"
        seconds = res.measure(f"{key}.seconds", f"{what}: seconds", "s", Target("<=", 1))
        wal_mb = res.measure(f"{key}.wal", f"{what}: WAL", "MB", Target("<=", 10))
        dead = res.measure(f"{key}.dead", f"{what}: dead tuples left", "tuples", Target("<=", 0))

        def action() -> str:
            if not self.wal_dsn.get("retention"):
                self.wal_dsn["retention"] = self.scratch.create("retention", migrate=True)
            t = retention.run_retention(self.wal_dsn["retention"], n, path)
            seconds.add(t.seconds, t.details())
            wal_mb.add(t.wal / retention.MB)
            dead.add(t.dead_tuples)
            return (
                f"{t.seconds:.1f} s, {t.wal / retention.MB:,.1f} MB of WAL,"
                f" {t.dead_tuples:,} dead tuples left (set-up {t.setup_seconds:.0f} s)"
            )

        return Step(
            f"run {r}/{o.runs} retention: {n:,} finished jobs (set-up in SQL), then {path}",
            action,
            (seconds, wal_mb, dead),
        )

    def hol_steps(self, r: int) -> list[Step]:
        """One slow job among fast ones of its type (issue 20): how long the fast ones take at
        the defaults, and claiming one job at a time, back to back."""
        o = self.opts
        what = (
            f"{hol.HOL_JOBS} jobs, one sleeping {hol.HOL_SLOW_S:g} s, --procs {hol.HOL_PROCS}:"
            " seconds until the fast ones are done"
        )
        steps = []
        for key, extra, label in (
            ("hol.default", (), "defaults"),
            ("hol.batch_1", ("--claim-batch", "1"), "--claim-batch 1"),
        ):
            m = self.results.measure(key, f"{what}, {label}", "s")

            def action(m: Measure = m, extra: Sequence[str] = extra) -> str:
                h = hol.run_hol(self.dsn, (*o.supervisor_args, *extra))
                m.add(h.fast_done_s, h.details())
                return (
                    f"fast ones done after {h.fast_done_s:.2f} s,"
                    f" the slow one after {h.slow_done_s:.2f} s"
                )

            steps.append(Step(f"run {r}/{o.runs} hol: {label}", action, (m,)))
        return steps

    def io_steps(self, r: int, active_peers: Sequence[peers.Peer]) -> list[Step]:
        """I/O-bound jobs (issue 11): async ones, and blocking ones in threads, with many in
        flight per child; the target is 60% of the ideal procs x concurrency / job time."""
        o = self.opts
        tag = f"run {r}/{o.runs} io: {IO_JOBS:,} jobs of {IO_SECONDS * 1000:g} ms"
        steps = []
        runs: tuple[tuple[str, int | None, bool], ...] = (
            ("io.async_default", None, False),  # no --concurrency: adaptive (worker/adaptive.py)
            ("io.async", IO_ASYNC_CONCURRENCY, False),
            ("io.threads", IO_THREAD_CONCURRENCY, True),
        )
        for key, concurrency, threads in runs:
            kind = "time.sleep in threads" if threads else "asyncio.sleep"
            if concurrency is None:  # its target is the ratio to pgqueuer's best (below)
                flag, target = f"the defaults (adaptive, up to {ADAPTIVE_MOST:,})", None
            else:
                ideal = IO_PROCS * concurrency / IO_SECONDS
                flag = f"--concurrency {concurrency} (ideal {ideal:,.0f})"
                target = Target(">=", 0.6 * ideal)
            m = self.results.measure(
                key, f"I/O-bound {kind} {IO_SECONDS * 1000:g} ms, --procs {IO_PROCS} {flag}",
                "jobs/s", target,
            )  # fmt: skip

            def run(
                concurrency: int | None = concurrency, threads: bool = threads
            ) -> drain.Drained:
                return drain.run_io(
                    self.dsn, IO_PROCS, IO_JOBS, seconds=IO_SECONDS, concurrency=concurrency,
                    threads=threads, supervisor_args=o.supervisor_args,
                )  # fmt: skip

            steps.append(self.drained_step(f"{tag}, {kind}, {flag}", m, run))
        if "pgqueuer" in active_peers:
            # its best (no cap on jobs in flight), and capped at our 2 x 100 in flight
            per_manager = (
                IO_PROCS * IO_ASYNC_CONCURRENCY // (peers.PGQUEUER_PROCS * peers.PGQUEUER_MANAGERS)
            )
            for key, cap, what in (
                ("peer.pgqueuer.io", None, "no cap in flight"),
                ("peer.pgqueuer.io_capped", per_manager, f"max_concurrent_tasks {per_manager}"),
            ):
                m = self.results.measure(
                    key,
                    f"I/O-bound asyncio.sleep {IO_SECONDS * 1000:g} ms, pgqueuer"
                    f" ({peers.describe_workers('pgqueuer')}, {what})",
                    "jobs/s",
                )

                def peer_run(cap: int | None = cap) -> drain.Drained:
                    return peers.drain(
                        "pgqueuer", self.peer_dsn["pgqueuer"], IO_JOBS, IO_SECONDS, cap
                    )

                steps.append(self.drained_step(f"{tag}, pgqueuer, {what}", m, peer_run))
        return steps

    @property
    def quiet_procs(self) -> int:
        """The drain that is also run at --log-level warning: 2 procs, else the largest."""
        procs = self.opts.drain_procs
        return 2 if 2 in procs else max(procs)

    def our_drain(self, procs: int, extra: Sequence[str] = ()) -> Callable[[], drain.Drained]:
        o = self.opts
        args = (*o.supervisor_args, *extra)
        return lambda: drain.run_drain(
            self.dsn, procs, o.drain_jobs, gate=o.start_gate, supervisor_args=args
        )

    def peer_drain(self, peer: peers.Peer) -> Callable[[], drain.Drained]:
        return lambda: peers.drain(peer, self.peer_dsn[peer], self.opts.drain_jobs)

    def peer_bulk(self, peer: peers.Peer) -> Callable[[], float]:
        return lambda: peers.bulk_enqueue(peer, self.peer_dsn[peer], self.opts.bulk_jobs)

    def drained_step(self, label: str, m: Measure, run: Callable[[], drain.Drained]) -> Step:
        def action() -> str:
            d = run()
            m.add(d.rate, d.details())
            text = f"{fmt(d.rate, 'jobs/s')} jobs/s ({d.seconds:.2f} s, {d.workers} workers"
            if d.mean_handler_s is not None:
                text += f", handler mean {d.mean_handler_s * 1000:.1f} ms"
            return text + ")"

        return Step(label, action, (m,))

    def calibrate(self) -> str:
        self.spin_loops = calibrate_spin(self.opts.cpu_ms / 1000)
        return f"{self.spin_loops:,} loops ≈ {self.opts.cpu_ms:g} ms"

    def cpu_step(self, r: int, procs: int) -> Step:
        o = self.opts
        m = self.results.measure(
            f"cpu.procs_{procs}",
            f"CPU-bound {o.cpu_ms:g} ms jobs, {procs} proc{'s' * (procs > 1)}",
            "jobs/s",
        )
        n = o.cpu_jobs_per_proc * procs

        def run() -> drain.Drained:
            return drain.run_cpu(
                self.dsn, procs, o.cpu_jobs_per_proc, self.spin_loops, o.supervisor_args
            )

        return self.drained_step(
            f"run {r}/{o.runs} CPU-bound: {n} jobs of {o.cpu_ms:g} ms, --procs {procs}", m, run
        )

    def cpu_bare_step(self, r: int, procs: int) -> Step:
        o = self.opts
        m = self.results.measure(
            f"cpu.bare_procs_{procs}",
            f"CPU-bound {o.cpu_ms:g} ms loops, {procs} plain process{'es' * (procs > 1)}, no queue",
            "jobs/s",
        )

        def run() -> drain.Drained:
            return drain.run_cpu_bare(procs, o.cpu_jobs_per_proc, self.spin_loops)

        return self.drained_step(
            f"run {r}/{o.runs} CPU-bound without the queue: {procs} plain process"
            f"{'es' * (procs > 1)}",
            m,
            run,
        )

    def wake_step(self, r: int) -> Step:
        o = self.opts
        res = self.results
        p50 = res.measure(
            "wake.p50", "wake latency p50, idle children (2 procs)", "ms", Target("<=", 5)
        )
        p99 = res.measure(
            "wake.p99", "wake latency p99, idle children (2 procs)", "ms", Target("<=", 25)
        )
        rss = res.measure(
            "rss.idle", "RSS of an idle child (largest of 2)", "MiB", Target("<=", 40)
        )

        def action() -> str:
            w = probes.run_wake(self.dsn, o.wake_samples, 2, o.supervisor_args)
            p50.add(w.p50, w.details())
            p99.add(w.p99)
            rss.add(w.rss_mib, w.rss_details())
            return f"p50 {w.p50:.2f} ms, p99 {w.p99:.2f} ms; idle child RSS {w.rss_mib:.1f} MiB"

        return Step(
            f"run {r}/{o.runs} wake latency: {o.wake_samples} jobs, --procs 2",
            action,
            (p50, p99, rss),
        )

    def kill_step(self, r: int) -> Step:
        o = self.opts
        m = self.results.measure(
            "kill.rerun", "SIGKILL of a child → its job running again", "ms", Target("<=", 1000)
        )

        def action() -> str:
            samples, details = probes.run_kill(self.dsn, o.kills, 2, o.supervisor_args)
            value = statistics.median(samples)
            m.add(value, details)
            return f"median {value:.0f} ms of {', '.join(f'{s:.0f}' for s in samples)} ms"

        return Step(f"run {r}/{o.runs} SIGKILL → rerun: {o.kills} kills, --procs 2", action, (m,))

    def dead_pod_step(self, r: int) -> Step:
        o = self.opts
        m = self.results.measure(
            "deadpod.rerun",
            "SIGKILL of a supervisor's process group (2 others run) → its job running again",
            "ms",
            Target("<=", 2000),
        )

        def action() -> str:
            samples, details = deadpod.run_dead_pod(self.dsn, o.kills, 2, o.supervisor_args)
            value = statistics.median(samples)
            m.add(value, details)
            return f"median {value:.0f} ms of {', '.join(f'{s:.0f}' for s in samples)} ms"

        return Step(
            f"run {r}/{o.runs} dead pod → rerun: {o.kills} kills, 3 pods of --procs 2", action, (m,)
        )

    def cancel_step(self, r: int) -> Step:
        o = self.opts
        m = self.results.measure(
            "cancel.free",
            "cancel of a CPU-bound job → its child free (runs the next job)",
            "ms",
            Target("<=", 1000),
        )

        def action() -> str:
            samples, details = probes.run_cancel(self.dsn, o.cancels, o.supervisor_args)
            value = statistics.median(samples)
            m.add(value, details)
            return f"median {value:.0f} ms of {', '.join(f'{s:.0f}' for s in samples)} ms"

        return Step(
            f"run {r}/{o.runs} cancel → child free: {o.cancels} cancels, --procs 1", action, (m,)
        )

    def deep_steps(self, r: int) -> list[Step]:
        o = self.opts
        res = self.results
        n, old = o.deep_pending, o.deep_finished
        fresh = res.measure("deep.fresh", f"drain {n:,} jobs, 2 procs, fresh table", "jobs/s")
        behind = res.measure(
            "deep.behind", f"drain {n:,} jobs, 2 procs, behind {old:,} finished", "jobs/s"
        )
        due = res.measure(
            "deep.next_due",
            f"earliest-due query (each poll): added by {o.deep_delayed:,} delayed jobs",
            "ms",
            Target("<=", 1),
        )
        claim = res.measure(
            "deep.claim",
            f"claim of 10 ready jobs: added by {o.deep_delayed:,} delayed jobs enqueued before",
            "ms",
            Target("<=", 1),
        )

        def delayed() -> str:
            d = deep.run_delayed(self.dsn, o.deep_delayed, o.deep_samples)
            due.add(d.next_due_added_ms, d.details())
            claim.add(d.claim_added_ms, d.details())
            return (
                f"next_due {d.without.next_due_ms:.3f} → {d.with_delayed.next_due_ms:.3f} ms,"
                f" claim {d.without.claim_ms:.3f} → {d.with_delayed.claim_ms:.3f} ms"
            )

        tag = f"run {r}/{o.runs} deep:"
        return [
            self.drained_step(
                f"{tag} drain {n:,} jobs, --procs 2, fresh table", fresh,
                lambda: deep.drain_behind(self.dsn, n, 0),
            ),
            self.drained_step(
                f"{tag} drain {n:,} jobs, --procs 2, behind {old:,} finished", behind,
                lambda: deep.drain_behind(self.dsn, n, old),
            ),
            Step(
                f"{tag} {o.deep_samples} polls without and with {o.deep_delayed:,} delayed jobs",
                delayed, (due, claim),
            ),
        ]  # fmt: skip

    def workflow_steps(self, r: int) -> list[Step]:
        o = self.opts
        res = self.results
        n, sleepers = WORKFLOW_STEPS, WORKFLOW_SLEEPERS
        plain = res.measure("wf.step", f"workflow: a no-op step ({n:,} in a row)", "µs")
        conn = res.measure("wf.conn_step", "workflow: a no-op step that takes conn", "µs")
        replay = res.measure("wf.replay", "workflow: a stored step, replayed", "µs")
        claim = res.measure(
            "wf.claim",
            f"claim of 10 ready jobs: added by {sleepers:,} sleeping workflows",
            "ms",
            Target("<=", 1),
        )

        def steps() -> str:
            t = workflows.time_steps(self.dsn, n)
            plain.add(t.plain_us, t.details())
            conn.add(t.conn_us, t.details())
            replay.add(t.replay_us, t.details())
            return (
                f"step {t.plain_us:.0f} µs, conn step {t.conn_us:.0f} µs,"
                f" replay {t.replay_us:.1f} µs"
            )

        def asleep() -> str:
            d = workflows.run_sleepers(self.dsn, sleepers, o.deep_samples)
            claim.add(d.claim_added_ms, d.details())
            return f"claim {d.without.claim_ms:.3f} → {d.with_sleepers.claim_ms:.3f} ms"

        tag = f"run {r}/{o.runs} workflows:"
        return [
            Step(f"{tag} {n:,} no-op steps, plain, conn, replayed", steps, (plain, conn, replay)),
            Step(f"{tag} {o.deep_samples} polls without and with {sleepers:,} asleep", asleep,
                 (claim,)),
        ]  # fmt: skip

    def soak_step(self, r: int) -> Step:
        o = self.opts
        res = self.results
        flags = f"--procs {soak.PROCS} --retain-succeeded {soak.RETAIN} (not default)"
        throughput = res.measure(
            "soak.throughput",
            f"soak {o.minutes:g} min, {flags}: last minute / minute 2, jobs/s",
            "x",
            Target(">=", 0.9),
        )
        size = res.measure(
            "soak.size", "soak: table + indexes at the end / at minute 2", "x", Target("<=", 2)
        )
        backlog = res.measure(
            "soak.backlog",
            "soak: backlog growth, minute 2 → end, in seconds of production",
            "s",
            Target("<=", 1),
        )

        def action() -> str:
            s = soak.run_soak(self.dsn, o.minutes, o.drain_jobs, o.supervisor_args)
            details = s.details()
            out = o.output or RESULTS_DIR / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ.json")
            png = out.with_name(f"{out.stem}-soak-run{r}.png")
            try:
                details["plot"] = str(soak.plot(s, png))
            except ImportError as exc:
                details["plot"] = f"no plot: {exc} (the `bench` extra has matplotlib)"
            throughput.add(s.throughput_ratio, details)
            size.add(s.size_ratio)
            backlog.add(s.backlog_growth_s)
            res.notes.append(f"soak run {r}:\n{s.table()}\nplot: {details['plot']}")
            print(s.table(), file=sys.stderr)
            return (
                f"{s.target_rate:,.0f} jobs/s offered (70% of {s.capacity:,.0f});"
                f" last/2nd minute {s.throughput_ratio:.2f}, size x{s.size_ratio:.2f},"
                f" backlog {s.backlog_growth_s:+.1f} s; plot {details['plot']}"
            )

        return Step(
            f"run {r}/{o.runs} soak: {o.minutes:g} minutes at 70% of the drain, {flags}",
            action,
            (throughput, size, backlog),
        )

    def memory_step(self, r: int) -> Step:
        o = self.opts
        procs = MEMORY_PROCS
        res = self.results
        uss = res.measure(
            "mem.uss", f"USS of an idle child ({procs} procs, largest)", "MiB", Target("<=", 10)
        )
        pss = res.measure("mem.pss", f"PSS of an idle child ({procs} procs, largest)", "MiB")
        rss = res.measure("mem.rss", f"RSS of an idle child ({procs} procs, largest)", "MiB")
        startup = res.measure(
            "mem.startup", f"start → {procs} children idle (spawn to ready)", "ms"
        )
        respawn = res.measure("mem.respawn", "SIGKILL of an idle child → its successor idle", "ms")

        def action() -> str:
            m = probes.run_memory(self.dsn, procs, o.supervisor_args)
            uss.add(m.largest("Uss"), m.details())
            pss.add(m.largest("Pss"))
            rss.add(m.largest("VmRSS"))
            startup.add(m.startup_s * 1000)
            respawn.add(m.respawn_ms)
            return (
                f"idle child USS {m.largest('Uss'):.1f} MiB, PSS {m.largest('Pss'):.1f} MiB,"
                f" RSS {m.largest('VmRSS'):.1f} MiB; {procs} idle after {m.startup_s:.2f} s;"
                f" respawn {m.respawn_ms:.0f} ms"
            )

        return Step(
            f"run {r}/{o.runs} memory: {procs} idle children", action,
            (uss, pss, rss, startup, respawn),
        )  # fmt: skip

    def web_fill(self) -> str:
        self.web_dsn = self.scratch.create("web", migrate=True)
        started = time.monotonic()
        web.fill(self.web_dsn, self.opts.web_jobs)
        return f"{time.monotonic() - started:.1f} s"

    def web_step(self, r: int) -> Step:
        o = self.opts
        res = self.results
        what = f"jobs page, {o.web_jobs:,} finished jobs"
        p50 = res.measure("web.p50", f"{what}: p50 over 6 filters", "ms", Target("<=", 200))
        p95 = res.measure("web.p95", f"{what}: p95 of the slowest filter", "ms", Target("<=", 200))
        by_id = res.measure("web.id", "search by job id (redirect + job page): p95", "ms")
        payload = res.measure("web.payload", "search by payload field, no GIN: worst p95", "ms")
        gin = res.measure("web.payload_gin", "search by payload field, GIN index: worst p95", "ms")
        type_hour = res.measure("web.type_1h", "a type's page, window 1h: p95", "ms")
        type_week = res.measure("web.type_7d", "a type's page, window 7d: p95", "ms")

        def action() -> str:
            w = web.run_web(self.web_dsn, o.web_jobs, o.web_requests)
            p50.add(w.p50_ms, w.details())
            p95.add(w.worst_p95_ms)
            by_id.add(w.extra_p95("id search (redirect + job page)"))
            payload.add(w.extra_p95(*web.PAYLOAD_SEARCHES))
            gin.add(
                w.extra_p95("payload, 1,000 jobs match (GIN)", "payload, one job matches (GIN)")
            )
            type_hour.add(w.extra_p95("type page, 1h"))
            type_week.add(w.extra_p95("type page, 7d"))
            return f"p50 {w.p50_ms:.1f} ms, p95 {w.worst_p95_ms:.1f} ms ({w.worst_page})"

        return Step(
            f"run {r}/{o.runs} web: jobs page over HTTP, {o.web_requests} requests per filter",
            action,
            (p50, p95, by_id, payload, gin, type_hour, type_week),
        )


def git_state() -> dict[str, Json]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain")),
        "source_sha256": source_digest(),
    }


def source_digest() -> str:
    """A digest of the code under test (package and migrations), uncommitted edits included:
    two results with the same digest measured the same queue."""
    h = hashlib.sha256()
    for path in sorted([*(ROOT / "pgq_supervisor").rglob("*"), *(ROOT / "schema").rglob("*")]):
        if path.is_file() and path.suffix in (".py", ".sql"):
            h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def machine(load_at_start: tuple[float, float, float]) -> dict[str, Json]:
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "loadavg_at_start": list(load_at_start),
        "loadavg_at_end": list(os.getloadavg()),
    }


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    # SIGTERM cleans up like Ctrl-C: supervisors killed, scratch databases dropped
    signal.signal(signal.SIGTERM, _interrupt)
    for name in list(os.environ):  # a peer's own settings must not change what we measure
        if name.startswith(("PGQUEUER_", "PROCRASTINATE_")):
            del os.environ[name]
    started = datetime.now(UTC)
    load = os.getloadavg()
    server = find_server(opts.dsn)
    scratch = Scratch(server, partitioned=opts.partitioned)
    bench = Bench(opts, server, scratch)
    interrupted = False
    try:
        steps = bench.plan()
        print(
            f"pgq_supervisor benchmarks: {len(steps)} steps on {server.origin} PostgreSQL,"
            f" {bench.cores} cores",
            file=sys.stderr,
        )
        if load[0] > 0.5 * bench.cores:
            print(
                f"warning: the machine is already busy (load average {load[0]:.2f} on"
                f" {bench.cores} cores): figures will be low and noisy",
                file=sys.stderr,
            )
        progress = Progress(len(steps))
        for step in steps:
            progress.run(step)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        scratch.close()
    text = table(bench.results, bench.order)
    print(text)
    for note in bench.results.notes:
        print()
        print(note)
    if opts.markdown:
        print()
        print(markdown(bench.results, bench.order))
    config = opts.to_json()
    config["cpu_loops"] = bench.spin_loops
    document: dict[str, Json] = {
        "started_at": started.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "interrupted": interrupted,
        "command": shlex.join(["python", "-m", "benchmarks", *opts.argv]),
        "machine": machine(load),
        "server": dict(server.info()),
        "git": git_state(),
        "config": config,
        "peers": bench.peer_info,
        "results": bench.results.to_json(),
        "table": text,
    }
    path = opts.output or RESULTS_DIR / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    write_json(path, document)
    print(f"\nresults written to {path}", file=sys.stderr)
    return 130 if interrupted else 0
