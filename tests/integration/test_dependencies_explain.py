"""Waiting dependents cost the claim nothing: they are not in job_claim_idx, so a claim walks
past none of them, however many wait (issue 13: keep claim cost flat)."""

from __future__ import annotations

import uuid
from typing import LiteralString

from psycopg import sql

import pgq_supervisor as pgq
from pgq_supervisor import sql as queries
from pgq_supervisor.db import Conn

from .test_explain import Plan, _job_scans, _nodes, _pick_plan

WAITING = 10_000


def _analyzed_pick(conn: Conn, types: list[str], limit: int) -> list[Plan]:
    return _pick_plan(conn, types, limit, analyze="ANALYZE, BUFFERS, ")


def _scan(conn: Conn) -> Plan:
    (scan,) = _job_scans(_analyzed_pick(conn, ["a"], 10))
    assert (scan["Node Type"], scan.get("Index Name")) == ("Index Scan", "job_claim_idx"), scan
    return scan


def _blocks(scan: Plan) -> int:
    hit, read = scan.get("Shared Hit Blocks", 0), scan.get("Shared Read Blocks", 0)
    assert isinstance(hit, int) and isinstance(read, int)
    return hit + read


def test_a_claim_does_not_visit_waiting_dependents(conn: Conn) -> None:
    blocker = pgq.enqueue(conn, "a", priority=-1)
    conn.execute(
        "INSERT INTO pgq.job (type, payload) SELECT 'a', '{}' FROM generate_series(1, 100)"
    )
    conn.execute("ANALYZE pgq.job")
    before = _scan(conn)
    # higher priority than every ready job: were they in the index, the walk would meet them first
    pgq.enqueue_many(
        conn, [pgq.NewJob("a", priority=10, depends_on=[blocker]) for _ in range(WAITING)]
    )
    conn.execute("ANALYZE pgq.job")
    row = conn.execute("SELECT count(*) FROM pgq.job WHERE waiting_on > 0").fetchone()
    assert row == (WAITING,)
    after = _scan(conn)
    assert after["Actual Rows"] == before["Actual Rows"] == 10
    # the same few index and heap pages with or without the 10,000 waiting jobs
    assert _blocks(after) <= _blocks(before) + 2, (before, after)
    assert _blocks(after) < 30, after


def test_next_due_reads_the_claim_index(conn: Conn) -> None:
    """(depth() is a function, whose plan EXPLAIN does not show: test_depth.py counts its
    scans.)"""
    blocker = pgq.enqueue(conn, "a")
    pgq.enqueue_many(conn, [pgq.NewJob("a", depends_on=[blocker]) for _ in range(2000)])
    conn.execute("ANALYZE pgq.job")
    for name, params in (("next_due", {"types": ["a"]}),):
        query = sql.SQL("EXPLAIN (FORMAT JSON) ") + queries.query(name, "pgq")
        row = conn.execute(query, params).fetchone()
        assert row is not None
        scans = _job_scans(list(_nodes(row[0][0]["Plan"])))
        assert [s["Node Type"] for s in scans if "Seq" in str(s["Node Type"])] == [], (name, scans)
    assert pgq.queue_depth(conn, "a") == 1


def test_completions_find_the_waiting_dependents_by_index(conn: Conn) -> None:
    """`succeed`, `succeed_and_claim` and `end_attempt` lock the jobs waiting on their batch
    first: through job_dependency's index and the primary key, never a scan of the table."""
    blocker = pgq.enqueue(conn, "a")
    pgq.enqueue_many(conn, [pgq.NewJob("a", depends_on=[blocker]) for _ in range(WAITING)])
    conn.execute(
        "INSERT INTO pgq.job (type, payload) SELECT 'a', '{}' FROM generate_series(1, 100)"
    )
    conn.execute("ANALYZE pgq.job")
    conn.execute("ANALYZE pgq.job_dependency")
    ids = [uuid.uuid4() for _ in range(100)]  # a batch of jobs nothing waits on
    claim = {"worker_id": "w", "types": ["a"], "max_retry_counts": [3], "limit": 10}
    statements: list[tuple[LiteralString, dict[str, object]]] = [
        (
            "succeed",
            {"ids": ids, "results": [None] * 100, "done_lease": uuid.uuid4(), "ephemeral": ids},
        ),
        (
            "succeed_and_claim",
            {"ids": ids, "results": [None] * 100, "done_lease": uuid.uuid4(),
             "ephemeral": ids, "lease": uuid.uuid4(), **claim},
        ),
        (
            "end_attempt",
            {"ids": ids, "lease": uuid.uuid4(), "worker_id": None, "error": "x",
             "error_data": None, "kind": "error", "allow_retry": True, "delay": 0.0},
        ),
    ]  # fmt: skip
    for name, params in statements:
        query = sql.SQL("EXPLAIN (FORMAT JSON) ") + queries.query(name, "pgq")
        row = conn.execute(query, params).fetchone()
        assert row is not None
        nodes = list(_nodes(row[0][0]["Plan"]))
        scans = [n for n in nodes if "Scan" in str(n["Node Type"]) and "Relation Name" in n]
        assert not [n for n in scans if n["Node Type"] == "Seq Scan"], (name, scans)
        assert "job_dependency_depends_on_idx" in {n.get("Index Name") for n in scans}, name
