"""10,000 sleeping (and waiting) workflows cost the claim nothing (issue 26): a workflow asleep
is a pending job due later, so it sits in job_delayed_idx only (schema/0009), never in
job_claim_idx; the claim's due-jobs pick reads that index up to now() and so never reaches a
row due later. Its steps live in workflow_step, which the claim does not read."""

from __future__ import annotations

from psycopg import sql

from pgq_supervisor import sql as queries
from pgq_supervisor.db import Conn
from tests.integration.test_explain import _assert_ordered_walk, _job_scans, _nodes, _pick_plan

READY = """
INSERT INTO pgq.job (type, payload, priority)
SELECT (ARRAY['a', 'b'])[1 + g % 2], jsonb_build_object('g', g), g % 4
FROM generate_series(1, 1000) g;
"""

SLEEPERS = """
WITH sleepers AS (
    INSERT INTO pgq.job (type, payload, start_at)
    SELECT (ARRAY['a', 'b'])[1 + g % 2], '{}',
           now() + make_interval(secs => 60 + g % 3600)
    FROM generate_series(1, 10000) g
    RETURNING id
)
INSERT INTO pgq.workflow_step (job_id, seq, name, kind, state, wake_at)
SELECT id, s, 'step ' || s, CASE WHEN s = 4 THEN 'sleep' ELSE 'step' END,
       CASE WHEN s = 4 THEN 'sleeping' ELSE 'succeeded' END,
       CASE WHEN s = 4 THEN now() + interval '1 hour' END
FROM sleepers, generate_series(0, 4) s;
"""


def _analyze(conn: Conn) -> None:
    conn.execute("ANALYZE pgq.job")
    conn.execute("ANALYZE pgq.workflow_step")


Reads = tuple[object, object, object]


def _reads(conn: Conn, types: list[str], *, due: bool) -> Reads:
    """What the pick read: its job scan's index, rows returned, rows filtered out."""
    nodes = _pick_plan(conn, types, 10, analyze="ANALYZE, BUFFERS, ", due=due)
    (scan,) = _job_scans(nodes)
    assert not [n for n in nodes if n.get("Relation Name") == "workflow_step"]
    return scan.get("Index Name"), scan["Actual Rows"], scan.get("Rows Removed by Filter", 0)


def test_ten_thousand_sleeping_workflows_change_nothing_the_claim_reads(conn: Conn) -> None:
    conn.execute(READY)
    _analyze(conn)
    cases = [(types, due) for types in (["a"], ["a", "b"]) for due in (False, True)]
    before = {(tuple(t), d): _reads(conn, t, due=d) for t, d in cases}
    conn.execute(SLEEPERS)
    _analyze(conn)
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE start_at > now()), count(*) FROM pgq.job"
    ).fetchone()
    assert row == (10_000, 11_000)
    for types in (["a"], ["a", "b"]):
        _assert_ordered_walk(_pick_plan(conn, types, 10))
    after = {(tuple(t), d): _reads(conn, t, due=d) for t, d in cases}
    assert after == before
    # the due pick reads job_delayed_idx up to now(): none of the 10,000 due later
    assert after[("a", "b"), True] == ("job_delayed_idx", 0, 0)


def test_the_paused_workflows_metric_reads_only_the_paused_steps(conn: Conn) -> None:
    conn.execute(READY)
    conn.execute(SLEEPERS)
    conn.execute(
        "UPDATE pgq.workflow_step SET state = 'succeeded' WHERE seq = 4 AND random() < 0.9"
    )
    _analyze(conn)
    query = sql.SQL("EXPLAIN (FORMAT JSON) ") + queries.query("workflows_paused", "pgq")
    row = conn.execute(query).fetchone()
    assert row is not None
    nodes = list(_nodes(row[0][0]["Plan"]))
    steps = [n for n in nodes if n.get("Relation Name") == "workflow_step"]
    assert steps and not [s for s in steps if s["Node Type"] == "Seq Scan"], nodes
    assert "workflow_step_paused_idx" in {n.get("Index Name") for n in nodes}, nodes
