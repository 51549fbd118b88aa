"""Query plans of the fair claim (schema/0021, 0023): finding the next tenant and taking a tenant's
jobs are each one descent of job_tenant_idx, never a sort or a scan of the backlog, with many
tenants and a big table of finished jobs behind them; the claim of jobs without a tenant still
walks job_claim_idx."""

from __future__ import annotations

import re

from psycopg import sql

from pgq_supervisor.db import Conn
from tests.integration.test_explain import (
    Plan,
    _assert_ordered_walk,
    _job_scans,
    _nodes,
    _pick_plan,
)

FILL = """
INSERT INTO pgq.job (type, payload, state, max_retry_count, started_at, stopped_at, worker_id,
                     created_at, tenant)
SELECT 't', '{}', 'succeeded', 3, now() - interval '1 hour', now() - interval '59 minutes',
       'old-worker', now() - interval '2 hours', 'tenant-' || (g % 1000)
FROM generate_series(1, 100000) g;

INSERT INTO pgq.job (type, payload, tenant)
SELECT 't', '{}', 'tenant-' || (g % 1000) FROM generate_series(1, 20000) g;

INSERT INTO pgq.job (type, payload) SELECT 't', '{}' FROM generate_series(1, 1000);
"""


def _fair_plans(conn: Conn, analyze: bool) -> dict[str, list[Plan]]:
    """The plans of claim_pick_fair's statements, from its own text, under its SET clauses."""
    row = conn.execute(
        "SELECT p.prosrc, p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'pgq' AND p.proname = 'claim_pick_fair'"
    ).fetchone()
    assert row is not None
    src, config = row
    # every search of the next tenant (after the cursor, before it, from the first), and
    # whether any sorts before the cursor (0023: backward from it)
    nexts = re.findall(r"\((SELECT j\.tenant FROM job j.*?LIMIT 1)\)", src, re.DOTALL)
    assert len(nexts) == 5, src
    assert "ORDER BY j.tenant DESC" in nexts[2], nexts
    [take] = [
        q
        for q in re.findall(r"ARRAY\((SELECT j\.id FROM job j.*?SKIP LOCKED)\)", src, re.DOTALL)
        if "= v_next" in q
    ]
    texts = {
        f"next{i}": q.replace("v_cur", "%(tenant)s").replace("v_start", "%(until)s")
        for i, q in enumerate(nexts)
    }
    texts["take"] = take.replace("v_next", "%(tenant)s").replace("v_quota", "10")
    plans = {}
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL search_path = pgq")
        for item in config:
            name, value = item.split("=", 1)
            if name != "search_path":
                conn.execute("SELECT set_config(%s, %s, true)", (name, value))
        for key, text in texts.items():
            text = text.replace("p_type", "%(type)s")
            prefix = "EXPLAIN (ANALYZE, FORMAT JSON) " if analyze else "EXPLAIN (FORMAT JSON) "
            found = conn.execute(
                sql.SQL(prefix + text),
                {"type": "t", "tenant": "tenant-5", "until": "tenant-7"},
            ).fetchone()
            assert found is not None
            plans[key] = list(_nodes(found[0][0]["Plan"]))
    return plans


def _assert_one_descent(nodes: list[Plan]) -> None:
    [scan] = _job_scans(nodes)
    # the next tenant's query may read the index alone (an index-only scan): better still
    assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), nodes
    assert scan.get("Index Name") == "job_tenant_idx", nodes
    assert not [n for n in nodes if "Sort" in str(n["Node Type"])], nodes
    assert nodes[0]["Node Type"] == "Limit", nodes


def test_the_fair_walk_descends_job_tenant_idx(conn: Conn) -> None:
    conn.execute(FILL)
    conn.execute("ANALYZE pgq.job")
    plans = _fair_plans(conn, analyze=True)
    for nodes in plans.values():
        _assert_one_descent(nodes)
    # the next tenant is found on the first live entry after the cursor: a row or two read
    scan = _job_scans(plans["next1"])[0]
    assert scan["Actual Rows"] == 1, scan
    # whether a tenant sorts before the cursor: backward from it, onto the newest entries of
    # the tenant before (0023), not forward from the type's first across its claimed jobs
    scan = _job_scans(plans["next2"])[0]
    assert scan["Scan Direction"] == "Backward" and scan["Actual Rows"] == 1, scan
    # the jobs without a tenant are still walked on job_claim_idx
    _assert_ordered_walk(_pick_plan(conn, ["t"], 10))


def test_the_fair_walk_descends_job_tenant_idx_even_without_statistics(conn: Conn) -> None:
    conn.execute(FILL)
    for nodes in _fair_plans(conn, analyze=False).values():
        _assert_one_descent(nodes)
