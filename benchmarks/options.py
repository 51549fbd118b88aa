"""The command line of `python -m benchmarks`, parsed once into a typed, validated Options."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.peers import PEERS
from benchmarks.report import Json

GROUPS = (
    "enqueue",
    "drain",
    "deps",
    "limits",
    "hol",
    "cpu",
    "io",
    "wake",
    "kill",
    "deadpod",
    "cancel",
    "memory",
    "deep",
    "soak",
    "web",
    "webidx",
    "workflows",
    "fairness",
    "horizon",
    "wal",
    "retention",
)
# groups run only when named in --only (long, or made for one question)
OPT_IN = ("deep", "soak", "webidx", "workflows", "fairness", "horizon", "retention")


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    dsn: str | None
    runs: int
    groups: tuple[str, ...]
    peers: tuple[str, ...]  # the peers to run beside us (none: no --peers)
    drain_procs: tuple[int, ...]
    drain_jobs: int
    single_jobs: int
    bulk_jobs: int
    wake_samples: int
    kills: int
    cancels: int
    cpu_ms: float
    cpu_jobs_per_proc: int
    web_jobs: int
    web_requests: int
    start_gate: bool
    deep_pending: int
    deep_finished: int
    deep_delayed: int
    deep_samples: int
    minutes: float
    horizon_seconds: float
    wal_jobs: int
    retention_jobs: int
    supervisor_args: tuple[str, ...]
    partitioned: bool  # every scratch database's job table partitioned (not the default)
    output: Path | None
    markdown: bool
    argv: tuple[str, ...]

    def to_json(self) -> dict[str, Json]:
        return {
            "runs": self.runs,
            "groups": list(self.groups),
            "peers": list(self.peers),
            "drain_procs": list(self.drain_procs),
            "drain_jobs": self.drain_jobs,
            "single_jobs": self.single_jobs,
            "bulk_jobs": self.bulk_jobs,
            "wake_samples": self.wake_samples,
            "kills": self.kills,
            "cancels": self.cancels,
            "cpu_ms": self.cpu_ms,
            "cpu_jobs_per_proc": self.cpu_jobs_per_proc,
            "web_jobs": self.web_jobs,
            "web_requests": self.web_requests,
            "start_gate": self.start_gate,
            "deep_pending": self.deep_pending,
            "deep_finished": self.deep_finished,
            "deep_delayed": self.deep_delayed,
            "deep_samples": self.deep_samples,
            "minutes": self.minutes,
            "horizon_seconds": self.horizon_seconds,
            "wal_jobs": self.wal_jobs,
            "retention_jobs": self.retention_jobs,
            "supervisor_args": list(self.supervisor_args),
            "partitioned": self.partitioned,
        }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Throughput, latency, scaling and recovery of pgq_supervisor (SPEC §8). "
        "See benchmarks/README.md.",
    )
    add = p.add_argument
    add(
        "--dsn",
        help="server to use (default: 127.0.0.1:5432 if it answers, else an embedded "
        "server); the harness creates and drops bench_* databases on it",
    )
    add("--runs", type=int, default=3, help="runs per figure; a figure is their median (3)")
    add(
        "--only",
        default=",".join(g for g in GROUPS if g not in OPT_IN),
        metavar="GROUPS",
        help=f"comma-separated groups to run, of {','.join(GROUPS)} (default: all but "
        f"{' and '.join(OPT_IN)})",
    )
    add(
        "--peers",
        nargs="?",
        const=",".join(PEERS),
        default="",
        metavar="NAMES",
        help="also run the enqueue and drain workloads through the peers: all of "
        f"{','.join(PEERS)} (pgqueuer and procrastinate need the `bench` extra, graphile-worker"
        " node and npm), or the comma-separated NAMES",
    )
    add("--procs", default="1,2,4,8", help="drain: child counts (default 1,2,4,8)")
    add("--drain-jobs", type=int, default=20_000, help="drain: jobs per run (20,000)")
    add(
        "--single-jobs",
        type=int,
        default=2_000,
        help="enqueue: jobs per run, one per transaction (2,000)",
    )
    add(
        "--bulk-jobs",
        type=int,
        default=50_000,
        help="enqueue: jobs per run in bulk, 1,000 per call (50,000)",
    )
    add("--wake-samples", type=int, default=200, help="wake latency: samples per run (200)")
    add("--kills", type=int, default=3, help="SIGKILL to rerun: kills per run (3)")
    add("--cancels", type=int, default=5, help="cancel to a free child: cancels per run (5)")
    add("--cpu-ms", type=float, default=20.0, help="CPU-bound: job length in ms (20)")
    add(
        "--cpu-jobs-per-proc", type=int, default=100, help="CPU-bound: jobs per run per child (100)"
    )
    add(
        "--deep-pending",
        type=int,
        default=1_000_000,
        help="deep: pending jobs drained, fresh and behind the finished ones (1,000,000)",
    )
    add(
        "--deep-finished",
        type=int,
        default=5_000_000,
        help="deep: finished jobs in the table before the pending ones (5,000,000)",
    )
    add(
        "--deep-delayed",
        type=int,
        default=1_000_000,
        help="deep: delayed jobs, due over the next day, behind a poll (1,000,000)",
    )
    add("--deep-samples", type=int, default=200, help="deep: polls timed per table (200)")
    add(
        "--minutes",
        type=float,
        default=10.0,
        help="soak: how long producers and workers run (10); a row per minute",
    )
    add(
        "--horizon-seconds",
        type=float,
        default=600.0,
        help="horizon: seconds each variant runs, the snapshot held throughout (600)",
    )
    add(
        "--wal-jobs",
        type=int,
        default=50_000,
        help="wal: no-op jobs enqueued and drained per system and run (50,000)",
    )
    add(
        "--retention-jobs",
        type=int,
        default=5_000_000,
        help="retention: finished jobs in the table, then purged (5,000,000)",
    )
    add(
        "--web-jobs",
        type=int,
        default=1_000_000,
        help="web: finished jobs in the table behind the jobs page (1,000,000)",
    )
    add("--web-requests", type=int, default=20, help="web: timed requests per page per run (20)")
    add(
        "--cold-start",
        action="store_true",
        help="drains: no start gate; time from the first claim while children are still booting",
    )
    add(
        "--supervisor-args",
        default="",
        metavar="FLAGS",
        help="extra flags for every supervisor, e.g. '--claim-batch 200'",
    )
    add(
        "--partitioned",
        action="store_true",
        help="our job table partitioned in every scratch database (opt-in: `partition`;"
        " not the default)",
    )
    add("--output", type=Path, help="JSON file (default: benchmarks/results/<UTC time>.json)")
    add("--markdown", action="store_true", help="also print the table as markdown")
    return p


def parse_args(argv: Sequence[str]) -> Options:
    """Options from the command line; exits 2 with one line on bad usage."""
    p = _parser()
    ns = p.parse_args(argv)
    groups = tuple(g.strip() for g in str(ns.only).split(",") if g.strip())
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        p.error(f"unknown group(s) in --only: {', '.join(unknown)}")
    try:
        procs = tuple(int(x) for x in str(ns.procs).split(",") if x.strip())
    except ValueError:
        p.error(f"--procs must be comma-separated integers, got {ns.procs!r}")
    counts = [ns.runs, ns.drain_jobs, ns.single_jobs, ns.bulk_jobs, ns.wake_samples, ns.kills,
              ns.cancels, ns.deep_pending, ns.deep_delayed, ns.deep_samples, ns.web_jobs,
              ns.web_requests, ns.wal_jobs, ns.retention_jobs]  # fmt: skip
    if not procs or min(procs) < 1 or min(counts) < 1 or ns.cpu_jobs_per_proc < 1:
        p.error("--runs, --procs and every job or sample count must be at least 1")
    if not ns.cpu_ms > 0:
        p.error("--cpu-ms must be > 0")
    if ns.deep_finished < 0:
        p.error("--deep-finished must be at least 0")
    if not ns.minutes >= 2:
        p.error("--minutes must be at least 2 (the soak compares the last minute with the second)")
    if not ns.horizon_seconds >= 10:
        p.error("--horizon-seconds must be at least 10")
    peers = tuple(n for n in ns.peers.split(",") if n)
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        p.error(f"--peers: unknown peer {unknown[0]!r} (known: {', '.join(PEERS)})")
    try:
        extra = tuple(shlex.split(ns.supervisor_args))
    except ValueError as exc:
        p.error(f"--supervisor-args: {exc}")
    return Options(
        dsn=ns.dsn,
        runs=ns.runs,
        groups=groups,
        peers=peers,
        drain_procs=procs,
        drain_jobs=ns.drain_jobs,
        single_jobs=ns.single_jobs,
        bulk_jobs=ns.bulk_jobs,
        wake_samples=ns.wake_samples,
        kills=ns.kills,
        cancels=ns.cancels,
        cpu_ms=ns.cpu_ms,
        cpu_jobs_per_proc=ns.cpu_jobs_per_proc,
        web_jobs=ns.web_jobs,
        web_requests=ns.web_requests,
        start_gate=not ns.cold_start,
        deep_pending=ns.deep_pending,
        deep_finished=ns.deep_finished,
        deep_delayed=ns.deep_delayed,
        deep_samples=ns.deep_samples,
        minutes=ns.minutes,
        horizon_seconds=ns.horizon_seconds,
        wal_jobs=ns.wal_jobs,
        retention_jobs=ns.retention_jobs,
        supervisor_args=extra,
        partitioned=ns.partitioned,
        output=ns.output,
        markdown=ns.markdown,
        argv=tuple(argv),
    )
