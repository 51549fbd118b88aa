"""`doctor`: a real REPEATABLE READ transaction held open and a real replication slot are named,
with what to do, and the job table's dead tuples they keep; exit 1 then, 0 when nothing needs
action."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import psycopg
import pytest
from starlette.testclient import TestClient

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.db import partitions as db_partitions
from pgq_supervisor.db.health import read_health
from pgq_supervisor.supervisor.maintenance.vacuum_health import VacuumHealth
from pgq_supervisor.supervisor.metrics import Metrics, QueueMetrics
from pgq_supervisor.web import create_app
from tests.support.db import flush_stats
from tests.support.processes import run_cli
from tests.support.waiting import wait_for

DEAD = 12_000  # past the floor (10,000) of the dead-tuple finding
# findings of the server's own: a slot (another test's), autovacuum off (this suite's server)
SERVER_WIDE = ("replication slot ", "autovacuum is off")


def doctor(dsn: str, *args: str) -> tuple[int, str]:
    result = run_cli(["doctor", *args], dsn)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, result.stdout


@pytest.fixture
def held(dsn: str) -> Iterator[Conn]:
    """A report's snapshot: REPEATABLE READ, one query, then idle in transaction."""
    with psycopg.connect(dsn, application_name="monthly-report") as c:
        c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        c.execute("SELECT count(*) FROM pgq.job")
        yield c
        c.rollback()


def make_dead_tuples(conn: Conn) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t") for _ in range(DEAD)])
    conn.execute("DELETE FROM pgq.job")
    flush_stats(conn)  # before VACUUM, which sets the count of what it found and left
    conn.execute("VACUUM pgq.job")  # the held snapshot keeps every version it removes nothing of
    flush_stats(conn)


def test_a_held_snapshot_is_named_with_its_pid_and_the_dead_tuples_it_keeps(
    conn: Conn, dsn: str, held: Conn
) -> None:
    make_dead_tuples(conn)
    pid = held.info.backend_pid

    def named() -> tuple[int, str] | None:
        code, out = doctor(dsn, "--max-transaction-age", "1s")
        return (code, out) if f"pid {pid}" in out else None

    code, out = wait_for("the held transaction named, past 1 s", named, timeout=30)
    assert code == 1, out
    assert "application 'monthly-report', idle in transaction" in out
    assert "'SELECT count(*) FROM pgq.job'" in out
    assert f"SELECT pg_terminate_backend({pid})" in out
    assert f"the job table has {DEAD:,} dead row versions" in out
    assert "VACUUM (VERBOSE) pgq.job; first end what holds the horizon" in out
    assert "last autovacuum" in out and "autovacuum=" in out

    # the same as one JSON document
    code, text = doctor(dsn, "--max-transaction-age", "1s", "--json")
    report = json.loads(text)
    assert code == 1 and report["ok"] is False
    backend = next(b for b in report["backends"] if b["pid"] == pid)
    assert backend["state"] == "idle in transaction" and backend["transaction_age"] >= 1
    assert report["table"]["dead_tuples"] == DEAD

    # once it ends, a vacuum removes them, and the session is no longer named
    held.rollback()
    conn.execute("VACUUM pgq.job")
    flush_stats(conn)
    code, text = doctor(dsn, "--max-transaction-age", "1s", "--json")
    report = json.loads(text)
    assert report["table"]["dead_tuples"] == 0
    # what is left is the server's own: a slot (another test's), autovacuum off (this
    # suite's server runs without it); with none of them, exit 0
    assert all(f["what"].startswith(SERVER_WIDE) for f in report["findings"]), report
    assert code == (1 if report["findings"] else 0)
    if not report["findings"]:
        assert (
            doctor(dsn)[1].splitlines()[-1]
            == "ok: nothing holds vacuum back; every pending job type is served"
        )


def test_a_replication_slot_is_named_with_how_to_drop_it(conn: Conn, dsn: str) -> None:
    name = f"pgq_doctor_{secrets.token_hex(4)}"
    # a physical slot that reserves WAL now: works at any wal_level; nobody consumes it
    conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (name,))
    try:
        code, out = doctor(dsn)
        assert code == 1, out
        assert f"replication slot '{name}' (physical, inactive) holds" in out
        assert "MiB of WAL" in out
        assert f"SELECT pg_drop_replication_slot('{name}')" in out
    finally:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    code, out = doctor(dsn)
    assert f"'{name}'" not in out


def test_a_bad_age_is_a_usage_error(dsn: str) -> None:
    result = run_cli(["doctor", "--max-transaction-age", "soon"], dsn)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: invalid duration 'soon': use e.g. 30s, 15m, 2h, 7d"
    result = run_cli(["doctor", "--max-xmin-age", "0"], dsn)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: invalid --max-xmin-age: must be > 0 (transactions)"


def test_the_supervisors_gauges_show_the_held_snapshot_and_the_dead_tuples(
    conn: Conn, held: Conn
) -> None:
    metrics = Metrics()
    gauges = VacuumHealth("pgq", metrics)
    make_dead_tuples(conn)

    def value(name: str) -> float:
        got = metrics.registry.get_sample_value(name)
        assert got is not None, name
        return got

    def aged() -> bool:
        gauges.run_once(conn)
        return value("pgq_vacuum_horizon_age_seconds") >= 1.0

    wait_for("the held snapshot's age in the gauge", aged, timeout=30)
    assert value("pgq_job_dead_tuples") == DEAD
    assert value("pgq_job_table_bytes") > 0
    server = {r[0]: r[1] for r in conn.execute("SELECT name, setting FROM pg_settings")}
    # at the default age (5 min) the snapshot is not a finding yet; the table is
    assert value("pgq_vacuum_findings") == 1 + (server["autovacuum"] == "off") + slots(conn)
    held.rollback()
    gauges.run_once(conn)
    assert value("pgq_vacuum_horizon_age_seconds") == 0


def slots(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE NOT active").fetchone()
    assert row is not None
    return int(row[0])


def test_the_dashboard_overview_shows_the_findings_as_a_banner(conn: Conn, dsn: str) -> None:
    name = f"pgq_banner_{secrets.token_hex(4)}"
    app = create_app(dsn, read_only=True)
    with TestClient(app) as client:
        assert f"'{name}'" not in client.get("/").text
        conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (name,))
        try:
            page = client.get("/").text
            assert 'aria-label="vacuum health"' in page
            assert f"replication slot &#39;{name}&#39; (physical, inactive)" in page
            assert f"pg_drop_replication_slot(&#39;{name}&#39;)" in page
            # the live refresh renders the page's live part only: no banner, nothing read
            live = client.get("/", headers={"x-pgq-live": "1"}).text
            assert "vacuum health" not in live
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    app.state.pgq_close()


def test_pending_types_no_live_supervisor_serves_are_findings(conn: Conn, dsn: str) -> None:
    """Issue 36: a misspelt type is named, with the served ones, and needs action (exit 1)."""

    def judged(*args: str) -> tuple[int, str]:
        # stale only after 3 x 600 s: the row written below stays live however slow the start
        env = {"PGQ_HEARTBEAT_INTERVAL": "600", "PGQ_DEAD_AFTER": "1800"}
        result = run_cli(["doctor", *args], dsn, env=env)
        assert result.returncode in (0, 1), result.stderr
        return result.returncode, result.stdout

    def ours(findings: list[dict[str, str]]) -> list[str]:
        return [f["what"] for f in findings if not f["what"].startswith(SERVER_WIDE)]

    pgq.enqueue_many(conn, [pgq.NewJob("gret"), pgq.NewJob("gret"), pgq.NewJob("greet")])
    code, out = judged()
    assert code == 1 and "supervisors: none live" in out
    assert "no live supervisor is registered: 3 pending jobs of types 'greet', 'gret'" in out
    db.register_supervisor(
        conn, "pgq", id="a", host="h", pid=1, procs=1, types=["greet", "resize"],
        started_at=db.db_now(conn, "pgq"), children=[],
    )  # fmt: skip
    code, out = judged()
    assert code == 1 and "supervisors: serving greet, resize (1 live supervisor)" in out
    assert (
        "type 'gret': 2 pending jobs that no live supervisor serves (did you mean 'greet'?);"
        " served: greet, resize (1 live supervisor)"
    ) in out
    assert "start a supervisor whose app has a handler for 'gret'" in out
    code, text = judged("--json")
    report = json.loads(text)
    assert report["coverage"]["served"] == ["greet", "resize"]
    assert report["coverage"]["unserved"] == [
        {"type": "gret", "pending": 2, "did_you_mean": "greet"}
    ]
    assert [w for w in ours(report["findings"]) if "gret" in w] == ours(report["findings"])
    conn.execute("DELETE FROM pgq.job WHERE type = 'gret'")
    code, text = judged("--json")
    report = json.loads(text)
    assert ours(report["findings"]) == [] and report["coverage"]["unserved"] == []


def test_the_unserved_gauge_counts_pending_jobs_no_live_supervisor_serves(conn: Conn) -> None:
    metrics = Metrics()
    gauges = QueueMetrics("pgq", metrics, stale_after=3.0)

    def unserved(type_: str) -> float | None:
        gauges.run_once(conn)
        return metrics.registry.get_sample_value("pgq_unserved_jobs", {"type": type_})

    pgq.enqueue_many(conn, [pgq.NewJob("gret") for _ in range(3)] + [pgq.NewJob("greet")])
    assert (unserved("gret"), unserved("greet")) == (3, 1)  # no supervisor at all
    db.register_supervisor(
        conn, "pgq", id="a", host="h", pid=1, procs=1, types=["greet"],
        started_at=db.db_now(conn, "pgq"), children=[],
    )  # fmt: skip
    assert (unserved("gret"), unserved("greet")) == (3, 0)  # served now: 0, not a stale 1
    conn.execute("UPDATE pgq.supervisor SET seen_at = now() - interval '4 seconds'")
    assert unserved("greet") == 1  # its row is older than 3 x heartbeat_interval: stale


def test_the_job_tables_figures_and_options_are_read_whether_partitioned_or_not(
    conn: Conn,
) -> None:
    """One table, or its partitions summed (schema/0029, `partition`): the same figures."""
    for _ in range(3):
        pgq.enqueue(conn, "t", {})
    conn.execute("VACUUM ANALYZE pgq.job")
    one = read_health(conn, "pgq", older_than=60.0).table
    assert one is not None and one.partitions == 1 and one.live_tuples == 3
    assert "fillfactor=90" in one.options  # the table's own settings
    assert db_partitions.convert(conn, "pgq", interval=86400.0, lock_timeout=10.0)
    conn.execute("VACUUM ANALYZE pgq.job")
    parted = read_health(conn, "pgq", older_than=60.0).table
    assert parted is not None and parted.partitions >= 3 and parted.live_tuples == 3
    assert "fillfactor=90" in parted.options  # the settings its partitions are made with
