"""The dedup window's look-up (inside unique_holders, schema/0018) walks its partial index,
even for a key with a long history (5,000 finished jobs): its plan read from auto_explain, which
explains the statements a function runs."""

from __future__ import annotations

import json

import psycopg

from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.db.plans import run
from pgq_supervisor.jobs import NewJob

FILL = """
INSERT INTO pgq.job (type, payload, state, max_retry_count, started_at, stopped_at, worker_id,
                     unique_key, created_at)
SELECT 't', '{}', 'succeeded', 3, now() - interval '1 hour', now() - interval '59 minutes',
       'old-worker', 'key-' || (g % 20), now() - make_interval(secs => g)
FROM generate_series(1, 100000) g;
ANALYZE pgq.job;
"""


def _nested_plans(conn: Conn) -> list[str]:
    plans: list[str] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if "Plan" in text:
            plans.append(text[text.index("{") :])

    conn.add_notice_handler(keep)
    conn.execute("LOAD 'auto_explain'")
    for setting, value in (
        ("auto_explain.log_min_duration", "0"),
        ("auto_explain.log_nested_statements", "on"),
        ("auto_explain.log_format", "json"),
        ("client_min_messages", "log"),
    ):
        conn.execute("SELECT set_config(%s, %s, false)", (setting, value))
    with conn.transaction():
        run(conn, db.windows.holders("pgq", [NewJob("t", unique_key="key-7", unique_for=600.0)]))
    conn.execute("SET client_min_messages = notice")
    return plans


def _scans(plan: object) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(plan, dict):
        if "Relation Name" in plan or "Index Name" in plan:
            out.append((str(plan.get("Node Type")), str(plan.get("Index Name", ""))))
        for value in plan.values():
            out += _scans(value)
    elif isinstance(plan, list):
        for value in plan:
            out += _scans(value)
    return out


def test_the_window_lookup_uses_its_partial_index(conn: Conn) -> None:
    conn.execute(FILL)
    plans = _nested_plans(conn)
    lookups = [p for p in plans if "unique_key" in p and "coalesce" in p.lower()]
    assert lookups, plans
    scans = _scans(json.loads(lookups[0]))
    assert ("Seq Scan", "") not in scans, scans
    indexes = {index for _, index in scans}
    assert {"job_unique_pkey", "job_unique_finished_idx"} <= indexes, scans  # schema/0027
