"""Query plans of the dashboard's jobs page: with 100,000 finished jobs behind it, each filter
walks its index (schema/0010) in order and stops at the page, never sorting the table; a
unique_key search and a page further down (the keyset) too. The benchmark group `web` times
it with 1,000,000."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import LiteralString

from psycopg import sql

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor import sql as queries
from pgq_supervisor.db import Conn
from pgq_supervisor.db.dashboard import COMPLETION_WINDOW
from pgq_supervisor.db.params import id_floor
from pgq_supervisor.jobs import Bundle
from tests.integration.test_explain import _job_scans, _nodes, _plan

FILL = """
INSERT INTO pgq.job (type, payload, state, max_retry_count, started_at, stopped_at, worker_id,
                     created_at, unique_key, error_msg)
SELECT (ARRAY['a', 'b', 'c', 'd', 'e'])[1 + g % 5], '{}',
       (CASE WHEN g % 100 = 0 THEN 'cancelled' WHEN g % 100 < 3 THEN 'failed'
             ELSE 'succeeded' END)::pgq.job_state,  -- failures are rare, as in production
       3, now() - interval '1 hour', now() - interval '59 minutes', 'old-worker',
       now() - make_interval(secs => g), 'key-' || g, 'boom'
FROM generate_series(1, 100000) g;
"""

NONE: dict[str, object] = {
    "state": None, "type": None, "unique_key": None, "payload": None, "bundle_id": None,
    "since": None, "until": None, "before_at": None, "before_id": None, "limit": 51,
}  # fmt: skip
NOW = datetime.now(UTC)
CASES: dict[str, tuple[dict[str, object], set[str]]] = {
    "no filter": ({}, {"job_created_idx"}),
    "state": ({"state": "failed"}, {"job_unusual_created_idx"}),
    "cancelled": ({"state": "cancelled"}, {"job_unusual_created_idx"}),
    "type": ({"type": "c"}, {"job_type_created_idx"}),
    "time range": (
        {"since": NOW - timedelta(hours=3), "until": NOW - timedelta(hours=2)},
        {"job_created_idx"},
    ),
    "unique key": ({"unique_key": "key-77"}, {"job_unique_key_any_idx"}),
    # a common state: walking every job newest first and skipping the others' rows
    "a later page": (
        {"state": "succeeded", "before_at": NOW - timedelta(hours=5), "before_id": None},
        {"job_created_idx"},
    ),
}


def test_the_jobs_page_walks_an_index_and_never_sorts(conn: Conn) -> None:
    """With the opt-in indexes (`dashboard-indexes`) in place."""
    db.create_dashboard_indexes(conn, "pgq")
    conn.execute(FILL)
    conn.execute("ANALYZE pgq.job")
    for case in CASES:
        _check(conn, case)


def test_a_payload_search_uses_its_opt_in_index_and_reads_only_the_matches(conn: Conn) -> None:
    """`dashboard-indexes --payload`: the GIN index finds the few matching rows, which are
    sorted (a top-N of the matches, not of the table); without it every row is read and
    filtered (a scan: the page bounds it with a statement_timeout instead)."""
    db.create_dashboard_indexes(conn, "pgq")
    conn.execute(FILL.replace("'{}'", "jsonb_build_object('user_id', g)"))
    conn.execute("ANALYZE pgq.job")
    params: dict[str, object] = {**NONE, "payload": '{"user_id": 77}'}
    scans = _job_scans(_plan(conn, "jobs_page", params))
    assert len(scans) == 1 and "payload @>" in str(scans[0].get("Filter")), scans
    db.create_dashboard_indexes(conn, "pgq", payload=True)
    conn.execute("ANALYZE pgq.job")
    nodes = _plan(conn, "jobs_page", params)
    used = [n.get("Index Name") for n in nodes if "Index Name" in n]
    assert used == ["job_payload_idx"], nodes
    assert "Seq Scan" not in [n["Node Type"] for n in nodes]


def _check(filled: Conn, case: str) -> None:
    given, indexes = CASES[case]
    params: dict[str, object] = {**NONE, **given}
    if "before_at" in given:
        params["before_id"] = "ffffffff-ffff-ffff-ffff-ffffffffffff"
    nodes = _plan(filled, "jobs_page", params)
    scans = _job_scans(nodes)
    assert len(scans) == 1 and scans[0].get("Index Name") in indexes, (case, scans)
    assert "Seq Scan" not in [n["Node Type"] for n in nodes]
    if case != "unique key":  # one row: nothing to sort anyway
        assert "Sort" not in [n["Node Type"] for n in nodes], case
        assert scans[0].get("Scan Direction") == "Backward", case
    if "before_at" in given:  # the keyset bounds the walk, it is not a filter on its rows
        assert "created_at" in str(scans[0].get("Index Cond")), scans[0]


# 200,000 jobs whose ids (time-ordered) spread over the three days around now, a tenth of them
# completion jobs of other bundles, as the id of each names its time
AROUND = """
INSERT INTO pgq.job (id, type, payload, state, max_retry_count, started_at, stopped_at,
                     worker_id, created_at, error_msg)
SELECT (lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7000'
        || '8' || lpad(to_hex(g), 15, '0'))::uuid,
       CASE WHEN g % 10 = 0 THEN 'report' ELSE 'row' END,
       CASE WHEN g % 10 = 0 THEN jsonb_build_object('bundle_id', gen_random_uuid()::text)
            ELSE '{}' END,
       'succeeded', 3, t, t, 'old-worker', t, NULL
FROM generate_series(1, 200000) g,
     LATERAL (SELECT now() - interval '2 days' + g * interval '1.296 s' AS t) at;
"""


def test_a_bundles_completion_is_found_on_the_primary_key_reading_a_few_rows(
    conn: Conn,
) -> None:
    """No default index has (type, created_at) (job_type_created_idx is opt-in): the lookup
    walks the primary key from the bundle's completion, not the job table."""
    bundle = pgq.enqueue_bundle(conn, "import", [pgq.NewJob("one", {})], on_complete="report")
    (member,) = db.jobs_page(conn, "pgq", bundle_id=bundle.id, limit=1)
    db.cancel(conn, "pgq", member.id)
    conn.execute(AROUND)
    conn.execute("ANALYZE pgq.job")
    record = db.get_bundle(conn, "pgq", bundle.id)
    found = db.bundle_completion(conn, "pgq", record)
    assert found is not None and found.type == "report"
    _reads_a_few_rows_on_the_primary_key(conn, "bundle_completion", _lookup(record), 100)
    # the Bundles page looks each complete one up the same way, and an incomplete one not
    running = pgq.enqueue_bundle(conn, "import", [pgq.NewJob("two", {})], on_complete="report")
    listed = {b.id: b.completion_id for b in db.bundles_page(conn, "pgq", 100)}
    assert listed == {bundle.id: found.id, running.id: None}
    page: dict[str, object] = {"limit": 100, "window": COMPLETION_WINDOW.total_seconds()}
    _reads_a_few_rows_on_the_primary_key(conn, "bundles_page", page, 100)
    # a later change of the bundle (a member deleted) moved updated_at an hour past the job:
    # the walk goes back from there, reading that hour's jobs (about 2,800), not the table
    conn.execute("UPDATE pgq.job_bundle SET updated_at = updated_at + interval '1 hour'")
    record = db.get_bundle(conn, "pgq", bundle.id)
    assert db.bundle_completion(conn, "pgq", record) == found
    _reads_a_few_rows_on_the_primary_key(conn, "bundle_completion", _lookup(record), 5_000)


def _lookup(bundle: Bundle) -> dict[str, object]:
    return {
        "id": bundle.id, "type": bundle.on_complete, "since": id_floor(bundle.created_at),
        "done_from": id_floor(bundle.updated_at),
        "done_until": id_floor(bundle.updated_at + COMPLETION_WINDOW),
    }  # fmt: skip


def _reads_a_few_rows_on_the_primary_key(
    conn: Conn, name: LiteralString, params: dict[str, object], at_most: int
) -> None:
    query = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + queries.query(name, "pgq")
    row = conn.execute(query, params).fetchone()
    assert row is not None
    nodes = list(_nodes(row[0][0]["Plan"]))
    scans = _job_scans(nodes)
    assert scans and {s.get("Index Name") for s in scans} == {"job_pkey"}, nodes
    # PostgreSQL 18 reports rows per loop with decimals (1.0), 15 as integers
    loops = [float(str(s.get("Actual Loops", 1))) for s in scans]
    read = sum((float(str(s.get("Actual Rows", 0)))
                + float(str(s.get("Rows Removed by Filter", 0))))
               * n for s, n in zip(scans, loops, strict=True))  # fmt: skip
    assert read <= at_most, nodes
