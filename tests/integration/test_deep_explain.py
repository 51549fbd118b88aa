"""Deep tables (issue 15): a claim behind many finished jobs and the supervisor's earliest-due
question behind many delayed ones read a handful of pages, whatever the table holds. Checked
by plan shape and by buffers touched (EXPLAIN ANALYZE, BUFFERS), never by time; the fixtures
are small (tens of thousands of rows) because the pages read do not grow with them.
"""

from __future__ import annotations

from typing import LiteralString

from psycopg import sql

from pgq_supervisor import sql as queries
from pgq_supervisor.db import Conn
from tests.integration.test_explain import Plan, _job_scans, _nodes, _pick_plan

FINISHED = """
INSERT INTO pgq.job (type, payload, state, max_retry_count, started_at, stopped_at, worker_id,
                     created_at)
SELECT 'a', '{}', 'succeeded', 3, now() - interval '1 hour', now() - interval '59 minutes',
       'old-worker', now() - interval '2 hours'
FROM generate_series(1, 50000) g
"""
# due over the next day, enqueued before the ready jobs
# Due from an hour on: none comes due while a loaded machine runs the test (one did, at +2 s)
DELAYED = """
INSERT INTO pgq.job (type, payload, start_at, created_at)
SELECT (ARRAY['a', 'b'])[1 + g % 2], '{}', now() + interval '1 hour' + g * interval '1 second',
       now() - interval '1 hour'
FROM generate_series(1, 40000) g
"""
READY = "INSERT INTO pgq.job (type, payload) SELECT 'a', '{}' FROM generate_series(1, 500)"
# A few pages per index level and heap row: far below what a scan of the fixture reads.
MAX_BUFFERS = 40


def _buffers(node: Plan) -> int:
    hit, read = node.get("Shared Hit Blocks", 0), node.get("Shared Read Blocks", 0)
    assert isinstance(hit, int) and isinstance(read, int)
    return hit + read


def _explain(conn: Conn, name: LiteralString, params: dict[str, object]) -> list[Plan]:
    query = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + queries.query(name, "pgq")
    with conn.transaction(force_rollback=True):
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return list(_nodes(row[0][0]["Plan"]))


def test_a_claim_behind_many_finished_jobs_reads_a_few_pages(conn: Conn) -> None:
    conn.execute(FINISHED)
    conn.execute(READY)
    conn.execute("VACUUM ANALYZE pgq.job")
    nodes = _pick_plan(conn, ["a"], 10, analyze="ANALYZE, BUFFERS, ")
    scans = _job_scans(nodes)
    assert [(s["Node Type"], s.get("Index Name")) for s in scans] == [
        ("Index Scan", "job_claim_idx")
    ], nodes
    assert nodes[0]["Actual Rows"] == 10
    assert _buffers(nodes[0]) <= MAX_BUFFERS, nodes[0]


def test_the_earliest_due_job_is_one_descent_of_job_delayed_idx(conn: Conn) -> None:
    conn.execute(FINISHED)
    conn.execute(DELAYED)
    conn.execute(READY)
    conn.execute("VACUUM ANALYZE pgq.job")
    for types in (["a"], ["b"], ["a", "b"]):
        nodes = _explain(conn, "next_due", {"types": types})
        scans = _job_scans(nodes)
        assert [s.get("Index Name") for s in scans] == ["job_delayed_idx"], nodes
        assert scans[0]["Node Type"] in ("Index Scan", "Index Only Scan"), scans
        assert any(n["Node Type"] == "Limit" for n in nodes), nodes  # min() stops at one row
        assert _buffers(nodes[0]) <= MAX_BUFFERS, nodes[0]
    row = conn.execute(queries.query("next_due", "pgq"), {"types": ["b"]}).fetchone()
    # the job of type b due in an hour and a second (less what the test took since)
    assert row is not None and 3000 < row[0] <= 3601.0


def test_a_claim_behind_many_delayed_jobs_reads_a_few_pages(conn: Conn) -> None:
    """Delayed jobs enqueued before the ready ones are not in the claim's walk, and the due
    ones come from a range of job_delayed_idx that stops at now()."""
    conn.execute(DELAYED)
    conn.execute(READY)
    conn.execute(
        "INSERT INTO pgq.job (type, payload, start_at, created_at)"
        " SELECT 'a', '{}', now() - interval '1 minute', now() - interval '2 hours'"
        " FROM generate_series(1, 5)"
    )  # due a minute ago: in job_delayed_idx, before every ready job in the claim's order
    conn.execute("VACUUM ANALYZE pgq.job")
    ready = _pick_plan(conn, ["a"], 10, analyze="ANALYZE, BUFFERS, ")
    assert [s.get("Index Name") for s in _job_scans(ready)] == ["job_claim_idx"], ready
    assert _buffers(ready[0]) <= MAX_BUFFERS, ready[0]
    due = _pick_plan(conn, ["a"], 10, analyze="ANALYZE, BUFFERS, ", due=True)
    assert [s.get("Index Name") for s in _job_scans(due)] == ["job_delayed_idx"], due
    assert due[0]["Actual Rows"] == 5
    assert _buffers(due[0]) <= MAX_BUFFERS, due[0]
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE created_at < now() - interval '90 minutes'), count(*)"
            " FROM pgq.job WHERE id = ANY(pgq.claim_pick(ARRAY['a'], 10))"
        ).fetchone()
    assert row == (5, 10)  # the 5 due first (oldest), then 5 of the ready ones


def test_jobs_enqueued_to_run_at_once_stay_out_of_job_delayed_idx(conn: Conn) -> None:
    """Only delayed (and retried, reset, released) jobs pay for the index."""
    conn.execute(READY)
    conn.execute(
        "INSERT INTO pgq.job (type, payload, start_at) VALUES ('a', '{}', now() + interval '1 h')"
    )
    conn.execute("VACUUM ANALYZE pgq.job")
    row = conn.execute(
        "SELECT reltuples FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'pgq' AND c.relname = 'job_delayed_idx'"
    ).fetchone()
    assert row == (1,)  # the delayed job; not the 500 enqueued to run at once
