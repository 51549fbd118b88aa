"""Query plans: the claim walks job_claim_idx and the rescue job_running_idx, even with a big
table of finished jobs behind them."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import LiteralString

from psycopg import sql

from pgq_supervisor import sql as queries
from pgq_supervisor.db import Conn

FILL = """
INSERT INTO pgq.job (type, payload, state, max_retry_count, started_at, stopped_at, worker_id,
                     created_at)
SELECT (ARRAY['a', 'b', 'c'])[1 + g % 3], '{}', 'succeeded', 3, now() - interval '1 hour',
       now() - interval '59 minutes', 'old-worker', now() - interval '2 hours'
FROM generate_series(1, 100000) g;

INSERT INTO pgq.job (type, payload, priority)
SELECT (ARRAY['a', 'b', 'c'])[1 + g % 3], jsonb_build_object('g', g), g % 4
FROM generate_series(1, 1000) g;
"""

Plan = dict[str, object]


def _nodes(plan: Plan) -> Iterator[Plan]:
    yield plan
    children = plan.get("Plans", [])
    assert isinstance(children, list)
    for child in children:
        assert isinstance(child, dict)
        yield from _nodes(child)


def _plan(conn: Conn, name: LiteralString, params: dict[str, object]) -> list[Plan]:
    query = sql.SQL("EXPLAIN (FORMAT JSON) ") + queries.query(name, "pgq")
    row = conn.execute(query, params).fetchone()
    assert row is not None
    doc = row[0]
    assert isinstance(doc, list)
    top = doc[0]["Plan"]
    return list(_nodes(top))


def _job_scans(nodes: list[Plan]) -> list[Plan]:
    return [n for n in nodes if n.get("Relation Name") == "job" and "Scan" in str(n["Node Type"])]


def _fill(conn: Conn) -> None:
    conn.execute(FILL)
    conn.execute("ANALYZE pgq.job")
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FROM pgq.job"
    ).fetchone()
    assert row == (1000, 101_000)


def _pick_plan(
    conn: Conn, types: list[str], limit: int, *, analyze: LiteralString = "", due: bool = False
) -> list[Plan]:
    """The plan of claim_pick_rows's query for jobs due when inserted (`due`: for delayed
    jobs that have come due, schema/0009), the rows claim_pick picks behind its gates, planned
    as the function plans it: its own text from pg_proc, under its own SET clauses
    (proconfig). `analyze` ("ANALYZE, BUFFERS, ") runs it too, rolled back."""
    row = conn.execute(
        "SELECT p.prosrc, p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'pgq' AND p.proname = 'claim_pick_rows'"
    ).fetchone()
    assert row is not None
    src, config = row
    picks = re.findall(r"ARRAY\(\s*(SELECT p\.id\b.*?FOR UPDATE SKIP LOCKED)\)", src, re.DOTALL)
    mark = "p.start_at > p.created_at" if due else "p.start_at <= p.created_at"
    [inner] = [q for q in picks if mark in q]
    text = inner.replace("p_types", "%(types)s::text[]").replace("p_limit", "%(limit)s::int")
    with conn.transaction(force_rollback=True):
        for item in config:
            name, value = item.split("=", 1)
            conn.execute("SELECT set_config(%s, %s, true)", (name, value))
        row = conn.execute(
            sql.SQL("EXPLAIN (" + analyze + "FORMAT JSON) {}").format(sql.SQL(text)),
            {"types": types, "limit": limit},
        ).fetchone()
    assert row is not None
    return list(_nodes(row[0][0]["Plan"]))


def _assert_ordered_walk(picking: list[Plan]) -> None:
    scans = _job_scans(picking)
    assert [(s["Node Type"], s.get("Index Name")) for s in scans] == [
        ("Index Scan", "job_claim_idx")
    ], picking
    # walking the index in order means no sort of the pending rows
    assert not [n for n in picking if "Sort" in str(n["Node Type"])], picking
    assert [n["Node Type"] for n in picking[:2]] == ["Limit", "LockRows"], picking


def test_claim_walks_job_claim_idx(conn: Conn) -> None:
    _fill(conn)
    for types in (["a"], ["a", "b", "c"], ["c", "not-served-here"]):
        _assert_ordered_walk(_pick_plan(conn, types, 10))


def test_claim_walks_job_claim_idx_even_without_statistics(conn: Conn) -> None:
    """A fresh table (or a burst after a quiet spell) has statistics saying almost nothing is
    pending; the planner would then sort every pending row on each claim."""
    conn.execute(
        "INSERT INTO pgq.job (type, payload) SELECT 'a', '{}' FROM generate_series(1, 30000)"
    )
    row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'pgq.job'::regclass").fetchone()
    assert row is not None and row[0] < 1000  # never analyzed
    _assert_ordered_walk(_pick_plan(conn, ["a"], 100))


def test_claim_update_runs_pick_once_and_finds_rows_by_primary_key(conn: Conn) -> None:
    _fill(conn)
    nodes = _plan(
        conn,
        "claim",
        {"types": ["a"], "max_retry_counts": [3], "limit": 10, "worker_id": "w",
         "lease": uuid.uuid4()},
    )  # fmt: skip
    # claim_pick is volatile: called in the WHERE clause directly it would run once per row
    assert [n.get("Subplan Name") for n in nodes if n.get("Parent Relationship") == "InitPlan"]
    assert {n["Index Name"] for n in nodes if "Index Name" in n} == {"job_pkey"}, nodes
    assert not [n for n in _job_scans(nodes) if n["Node Type"] == "Seq Scan"], nodes


def _run_some(conn: Conn) -> None:
    """200 of the pending jobs running, each under a lease of its own."""
    conn.execute(
        "UPDATE pgq.job SET state = 'running', started_at = now(), worker_alive_at = now(),"
        " worker_id = 'w', lease = gen_random_uuid(), max_retry_count = 3"
        " WHERE id IN (SELECT id FROM pgq.job WHERE state = 'pending' LIMIT 200)"
    )
    conn.execute("ANALYZE pgq.job")


def test_rescue_reads_running_jobs_through_job_running_idx(conn: Conn) -> None:
    _fill(conn)
    _run_some(conn)
    nodes = _plan(conn, "rescue", {"dead_after": 30.0, "limit": 1000, "error": "x"})
    scans = _job_scans(nodes)
    assert scans, nodes
    assert not [s for s in scans if s["Node Type"] == "Seq Scan"], scans
    # an index scan of it, or a bitmap of it (the planner's pick since it is keyed on lease)
    assert {n["Index Name"] for n in nodes if "Index Name" in n} == {"job_running_idx"}, nodes


def test_succeed_and_claim_reads_jobs_by_index_only(conn: Conn) -> None:
    _fill(conn)
    nodes = _plan(
        conn,
        "succeed_and_claim",
        {"types": ["a"], "max_retry_counts": [3], "limit": 10, "worker_id": "w",
         "lease": uuid.uuid4(), "ids": [uuid.uuid4()], "results": [None],
         "done_lease": uuid.uuid4(), "ephemeral": [uuid.uuid4()]},
    )  # fmt: skip
    assert [n.get("Subplan Name") for n in nodes if n.get("Parent Relationship") == "InitPlan"]
    assert "job_pkey" in {n.get("Index Name") for n in nodes}, nodes
    assert not [n for n in _job_scans(nodes) if n["Node Type"] == "Seq Scan"], nodes


def test_waiters_and_progress_writes_find_jobs_by_index(conn: Conn) -> None:
    _fill(conn)
    ids = [uuid.uuid4() for _ in range(3)]
    cases: list[tuple[LiteralString, dict[str, object]]] = [
        ("job_states", {"ids": ids}),
        ("get_jobs", {"ids": ids}),
        ("set_progress", {"ids": ids, "leases": ids, "progress": ["0.5"] * 3}),
    ]
    for name, params in cases:
        nodes = _plan(conn, name, params)
        assert not [n for n in _job_scans(nodes) if n["Node Type"] == "Seq Scan"], name
        used = {n["Index Name"] for n in nodes if "Index Name" in n}
        # the running jobs are few (what workers hold): their index will do as well
        allowed = {"job_pkey", "job_running_idx"} if name == "set_progress" else {"job_pkey"}
        assert used and used <= allowed, (name, used)


def test_cancel_and_the_supervisors_cancel_check_find_jobs_by_primary_key(conn: Conn) -> None:
    """The check runs every poll_interval in every supervisor: a handful of ids, never a scan."""
    _fill(conn)
    ids = [uuid.uuid4() for _ in range(8)]
    samples: list[tuple[LiteralString, dict[str, object]]] = [
        ("cancelled_among", {"ids": ids}),
        ("cancel", {"id": ids[0]}),
    ]
    for name, params in samples:
        nodes = _plan(conn, name, params)
        assert {n["Index Name"] for n in nodes if "Index Name" in n} == {"job_pkey"}, nodes
        assert not [n for n in _job_scans(nodes) if n["Node Type"] == "Seq Scan"], nodes


def test_the_pause_limit_and_rate_gates_of_an_unlimited_claim_are_one_index_probe_each(
    conn: Conn,
) -> None:
    """claim_pick asks three tiny tables about the served types before picking: with many
    other types paused, limited and rated, each question stays one probe of its primary key
    per claim (not per job), and the rows are still picked by the ordered walk."""
    _fill(conn)
    conn.execute(
        "INSERT INTO pgq.type_pause (type) SELECT 'p' || g FROM generate_series(1, 2000) g;"
        "INSERT INTO pgq.type_rate (type, max_starts, period)"
        " SELECT 'r' || g, 10, 1 FROM generate_series(1, 2000) g;"
        "INSERT INTO pgq.type_limit (type, global_concurrency)"
        " SELECT 'l' || g, 10 FROM generate_series(1, 2000) g;"
        "ANALYZE pgq.type_pause; ANALYZE pgq.type_rate; ANALYZE pgq.type_limit"
    )
    row = conn.execute(
        "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'pgq' AND p.proname = 'claim_pick'"
    ).fetchone()
    assert row is not None
    probes = re.findall(
        r"EXISTS \((SELECT 1 FROM (type_\w+) WHERE type = ANY\(p_types\))\)", row[0]
    )
    assert [table for _, table in probes] == ["type_pause", "type_limit", "type_rate"]
    with conn.transaction():
        conn.execute("SET LOCAL search_path = pgq")
        for probe, table in probes:
            text = probe.replace("p_types", "%(types)s::text[]")
            plan = conn.execute(
                sql.SQL("EXPLAIN (FORMAT JSON) {}").format(sql.SQL(text)),
                {"types": ["a", "b"]},
            ).fetchone()
            assert plan is not None
            nodes = list(_nodes(plan[0][0]["Plan"]))
            assert {n.get("Index Name") for n in nodes} - {None} == {f"{table}_pkey"}, nodes
            assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes
    _assert_ordered_walk(_pick_plan(conn, ["a", "b"], 10))
    # and the claim of an unpaused, unrated type takes jobs
    row = conn.execute("SELECT cardinality(pgq.claim_pick(ARRAY['a'], 10))").fetchone()
    assert row == (10,)


def _function_query(
    conn: Conn, function: LiteralString, start: str, end: str, params: dict[str, str]
) -> tuple[str, list[str]]:
    """A query of a plpgsql function, from its text in pg_proc (`start` up to `end`), with its
    variables replaced by placeholders; and the function's SET clauses."""
    row = conn.execute(
        "SELECT p.prosrc, p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'pgq' AND p.proname = %s",
        (function,),
    ).fetchone()
    assert row is not None
    src, config = row
    text = src[src.index(start) : src.index(end, src.index(start))]
    for name, placeholder in params.items():
        text = text.replace(name, placeholder)
    return text, list(config)


def _explain(conn: Conn, text: str, config: list[str], params: dict[str, object]) -> list[Plan]:
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL search_path = pgq")
        for item in config:
            name, value = item.split("=", 1)
            conn.execute("SELECT set_config(%s, %s, true)", (name, value))
        row = conn.execute(
            sql.SQL("EXPLAIN (FORMAT JSON) {}").format(sql.SQL(text)), params
        ).fetchone()
    assert row is not None
    return list(_nodes(row[0][0]["Plan"]))


def test_a_key_limited_claim_walks_job_claim_idx_in_order(conn: Conn) -> None:
    """claim_pick_keyed reads the pending jobs of its type due when inserted in claim order, on
    job_claim_idx, never a sort of the backlog; the delayed jobs come due, merged in by the
    function, are read from job_delayed_idx (schema/0009)."""
    _fill(conn)
    walks: dict[str, list[Plan]] = {}
    for cursor in ("c_ready", "c_due"):
        text, config = _function_query(
            conn, "claim_pick_keyed", f"{cursor} CURSOR FOR", ";", {"p_type": "%(type)s::text"}
        )
        walks[cursor] = _explain(conn, text.split("FOR", 1)[1], config, {"type": "a"})
    nodes = walks["c_ready"]
    assert [(s["Node Type"], s.get("Index Name")) for s in _job_scans(nodes)] == [
        ("Index Scan", "job_claim_idx")
    ], nodes
    assert not [n for n in nodes if "Sort" in str(n["Node Type"])], nodes
    nodes = walks["c_due"]
    assert [s.get("Index Name") for s in _job_scans(nodes)] == ["job_delayed_idx"], nodes


def test_a_limited_claim_counts_running_jobs_on_the_running_index(conn: Conn) -> None:
    """The count of a limited type's running jobs reads job_running_idx (the running jobs
    only), never the table or the backlog."""
    _fill(conn)
    conn.execute("ANALYZE pgq.job")
    text, config = _function_query(
        conn,
        "claim_pick_limited",
        "SELECT count(*) INTO v_running",
        ";",
        {"INTO v_running ": "", "v_limited[i]": "%(type)s::text"},
    )
    nodes = _explain(conn, text, config, {"type": "a"})
    assert [s.get("Index Name") for s in _job_scans(nodes)] == ["job_running_idx"], nodes
    text, config = _function_query(
        conn,
        "claim_pick_keyed",
        "SELECT coalesce(jsonb_object_agg",
        ";",
        {"INTO v_taken": "", "p_type": "%(type)s::text"},
    )
    nodes = _explain(conn, text, config, {"type": "a"})
    assert [s.get("Index Name") for s in _job_scans(nodes)] == ["job_running_idx"], nodes


def test_a_striped_claim_counts_its_stripe_by_lease_on_the_running_index(conn: Conn) -> None:
    """limit_take_stripe counts the running jobs of its stripe's leases with an index
    condition on job_running_idx (keyed on lease, schema/0013): the running jobs of other
    leases are not read."""
    _fill(conn)
    _run_some(conn)
    text, config = _function_query(
        conn,
        "limit_take_stripe",
        "SELECT t.slots, t.slots - l.n, l.live",
        ";",
        {"INTO v_slots, v_free, v_live": "", "p_type": "%(type)s::text", "v_s": "0"},
    )
    nodes = _explain(conn, text, config, {"type": "a"})
    reads = [n for n in nodes if n.get("Index Name") == "job_running_idx"]
    assert reads and all("lease" in str(n.get("Index Cond")) for n in reads), nodes
    assert not [s for s in _job_scans(nodes) if s["Node Type"] == "Seq Scan"], nodes
