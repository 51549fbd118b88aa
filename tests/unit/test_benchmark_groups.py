"""The benchmark harness's `wal` and `retention` groups (issue 35) parse, plan and lay out
their rows. Nothing here runs a benchmark or asserts a timing."""

from __future__ import annotations

from benchmarks import wal
from benchmarks.options import parse_args
from benchmarks.report import Ratio, Target, table
from benchmarks.run import Bench
from benchmarks.server import Scratch, Server

SERVER = Server("host=127.0.0.1 dbname=postgres", "given")  # never connected to here


def _bench(argv: list[str]) -> Bench:
    return Bench(parse_args(argv), SERVER, Scratch(SERVER))


def test_wal_runs_by_default_and_retention_only_when_named() -> None:
    default = parse_args([])
    assert "wal" in default.groups and "retention" not in default.groups
    assert default.wal_jobs == 50_000 and default.retention_jobs == 5_000_000
    lowered = parse_args(["--only", "retention", "--retention-jobs", "1000"])
    assert lowered.groups == ("retention",) and lowered.retention_jobs == 1000


def test_plan_has_a_wal_step_per_run_and_a_retention_step() -> None:
    bench = _bench(["--only", "wal,retention", "--runs", "2", "--wal-jobs", "10"])
    labels = [s.label for s in bench.plan()]
    assert sum(" wal: 10 no-op jobs" in label for label in labels) == 2  # ours, no peers
    # each run expires the jobs both ways: the CLI's purge and the supervisor's round
    assert sum(" retention: " in label for label in labels) == 4


def test_layout_puts_the_ratio_to_graphile_worker_under_the_figures() -> None:
    bench = _bench(["--only", "wal,retention", "--peers", "pgqueuer,graphile-worker"])
    bench.peer_info = {p: {} for p in wal.WAL_PEERS}  # as if both could run
    bench.layout()
    keys = [k for k in bench.order if isinstance(k, str)]
    for system in (wal.OURS, *wal.WAL_PEERS):
        assert f"wal.{system}.total" in keys and f"wal.{system}.retained" in keys
    for path in ("purge", "round"):
        assert {f"retention.{path}.{m}" for m in ("seconds", "wal", "dead")} <= set(keys)
    ratio = next(
        r for r in bench.order if isinstance(r, Ratio) and r.den == "wal.graphile-worker.total"
    )
    assert ratio.num == ("wal.pgq.total",) and ratio.target == Target("<=", 0.7)

    for system, total in ((wal.OURS, 1500.0), ("graphile-worker", 1000.0)):
        bench.wal_measures(system)["total"].add(total)
    text = table(bench.results, bench.order)
    line = next(x for x in text.splitlines() if "ours / graphile-worker, WAL" in x)
    assert "1.50" in line and "MISSED" in line
