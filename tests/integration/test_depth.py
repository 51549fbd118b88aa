"""Queue depth has one definition, the schema's depth() (schema/0014): `python -m pgq_supervisor
depth`, `pgq.queue_depth`, the `pgq_queue_depth` gauge and the KEDA PostgreSQL trigger's query,
read from deploy/k8s/scaledobject.yaml as KEDA sends it, all count the same jobs."""

from __future__ import annotations

import yaml

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobState
from pgq_supervisor.supervisor.metrics import Metrics, QueueMetrics
from tests.support.db import claim, claim_one, get
from tests.support.processes import ROOT, run_cli

SCHEMA = "pgq"


def keda_query() -> str:
    manifest = yaml.safe_load((ROOT / "deploy" / "k8s" / "scaledobject.yaml").read_text())
    (trigger,) = manifest["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert isinstance(query, str)
    return query


def scalar(conn: Conn, query: str) -> int:
    row = conn.execute(query.encode()).fetchone()  # the text as it is, as KEDA sends it
    assert row is not None
    return int(row[0])


def cli_depth(dsn: str, *args: str) -> int:
    result = run_cli(["depth", *args], dsn)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    return int(result.stdout)


def gauge(conn: Conn) -> float | None:
    metrics = Metrics()
    QueueMetrics(SCHEMA, metrics, 1.0).run_once(conn)
    return metrics.registry.get_sample_value("pgq_queue_depth")


def test_the_scaler_depth_and_the_gauge_count_the_same_jobs(dsn: str, conn: Conn) -> None:
    assert scalar(conn, keda_query()) == cli_depth(dsn) == pgq.queue_depth(conn) == 0

    # ready: two of "a" (one of them due when enqueued, one retried and due again: the second
    # part of the count), one of "b"
    pgq.enqueue_many(conn, [pgq.NewJob("a"), pgq.NewJob("b")])
    retried = pgq.enqueue(conn, "a", {})
    job = claim_one(conn, "a")
    assert job.id != retried
    db.end_attempt(conn, SCHEMA, [job.id], lease=job.lease, error="boom", kind=AttemptKind.ERROR)
    assert get(conn, job.id).state is JobState.PENDING
    # not ready: delayed, waiting on a dependency, running, finished
    pgq.enqueue(conn, "a", {}, start_at=db.db_now(conn, SCHEMA).replace(year=2999))
    pgq.enqueue(conn, "a", {}, depends_on=[retried])
    running = pgq.enqueue(conn, "r", {})
    assert claim_one(conn, "r").id == running

    expected = {"a": 2, "b": 1, "r": 0}
    assert scalar(conn, keda_query()) == cli_depth(dsn) == gauge(conn) == 3
    for type_, n in expected.items():
        assert cli_depth(dsn, "--type", type_) == pgq.queue_depth(conn, type_) == n
        assert scalar(conn, f"SELECT pgq.depth('{type_}')") == n
    # a Deployment serving a subset (PGQ_TYPES=a,b) names its types
    assert scalar(conn, "SELECT pgq.depth('a', 'b')") == 3
    assert scalar(conn, "SELECT pgq.depth(VARIADIC NULL)") == 3


def test_held_back_types_count_what_a_claim_could_take_now(dsn: str, conn: Conn) -> None:
    """A paused type counts nothing, a rated one at most its free starts, one with a global
    limit at most its free slots; a per-key limit is not applied."""
    pgq.enqueue_many(conn, [pgq.NewJob("paused") for _ in range(4)])
    assert db.pause(conn, SCHEMA, "paused", paused_by=None, reason=None) is not None
    pgq.enqueue_many(conn, [pgq.NewJob("rated") for _ in range(5)])
    db.sync_rates(conn, SCHEMA, ["rated"], {"rated": (2, 3600.0)})
    pgq.enqueue_many(conn, [pgq.NewJob("full") for _ in range(3)])
    assert len(claim(conn, ["full"], limit=1)) == 1
    pgq.enqueue_many(conn, [pgq.NewJob("roomy") for _ in range(2)])
    pgq.enqueue_many(conn, [pgq.NewJob("keyed", concurrency_key="k") for _ in range(3)])
    db.sync_limits(
        conn,
        SCHEMA,
        ["full", "roomy", "keyed"],
        {"full": (1, None), "roomy": (10, None), "keyed": (None, 1)},
    )

    expected = {"paused": 0, "rated": 2, "full": 0, "roomy": 2, "keyed": 3}
    for type_, n in expected.items():
        assert cli_depth(dsn, "--type", type_) == n, type_
    total = sum(expected.values())
    assert scalar(conn, keda_query()) == cli_depth(dsn) == gauge(conn) == total

    # the rate's window fills as jobs start; a resumed type counts again
    assert len(claim(conn, ["rated"], limit=5)) == 2
    assert cli_depth(dsn, "--type", "rated") == 0
    assert db.resume(conn, SCHEMA, "paused")
    assert scalar(conn, keda_query()) == cli_depth(dsn) == total - 2 + 4


def test_depth_reads_the_ready_jobs_by_index(conn: Conn) -> None:
    """Neither finished nor waiting jobs are read: depth() counts through the two partial
    indexes, never a scan of the table (EXPLAIN shows nothing of a function's plan, so the
    scans are counted)."""
    blocker = pgq.enqueue(conn, "a")
    pgq.enqueue_many(conn, [pgq.NewJob("a", depends_on=[blocker]) for _ in range(2000)])
    conn.execute(
        "INSERT INTO pgq.job (type, payload, state, started_at, stopped_at)"
        " SELECT 'done', '{}', 'succeeded', now(), now() FROM generate_series(1, 10000)"
    )
    conn.execute("ANALYZE pgq.job")
    for call in ("SELECT pgq.depth()", "SELECT pgq.depth('a')", keda_query()):
        with conn.transaction():  # no flush of the counters in between
            before = scans(conn)
            assert scalar(conn, call) == 1
            seq_scans, index_scans = (b - a for a, b in zip(before, scans(conn), strict=True))
        assert (seq_scans, index_scans >= 2) == (0, True), (call, seq_scans, index_scans)


def scans(conn: Conn) -> tuple[int, int]:
    """This backend's sequential and index scans of pgq.job not yet flushed to the shared
    statistics (PostgreSQL 15+ keeps them pending across transactions: take a difference)."""
    row = conn.execute(
        "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relid = 'pgq.job'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
