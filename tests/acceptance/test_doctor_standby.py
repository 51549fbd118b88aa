"""`doctor` against a real streaming standby with hot_standby_feedback and no slot: its
walsender holds an xmin outside any transaction (xact_start NULL). A healthy standby is no
finding; one whose query holds an old snapshot is, by how far behind its xmin is."""

from __future__ import annotations

import json

import psycopg

import pgq_supervisor as pgq
from pgq_supervisor.db.health import read_health
from tests.acceptance.pgserver import OwnServer, local_binaries
from tests.support.processes import run_cli
from tests.support.waiting import wait_for

BEHIND = 30  # transactions the primary runs while the standby's query holds its snapshot


def walsender_xmin_age(primary: OwnServer) -> int | None:
    with psycopg.connect(primary.dsn) as conn:
        row = conn.execute(
            "SELECT age(backend_xmin) FROM pg_stat_activity"
            " WHERE backend_type = 'walsender' AND backend_xmin IS NOT NULL"
        ).fetchone()
    return None if row is None else int(row[0])


def walsender_findings(primary: OwnServer, max_xmin_age: int) -> list[str]:
    result = run_cli(["doctor", "--json", "--max-xmin-age", str(max_xmin_age)], primary.dsn)
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    return [f["what"] for f in report["findings"] if f["what"].startswith("walsender")]


def test_a_standbys_feedback_counts_only_once_its_xmin_is_far_behind(server_dsn: str) -> None:
    with OwnServer(binaries=local_binaries(server_dsn)) as primary:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            pgq.migrate(conn)
        standby = primary.standby()
        with open(standby.data / "postgresql.auto.conf", "a") as conf:
            conf.write("hot_standby_feedback = on\nwal_receiver_status_interval = 1\n")
        with standby:
            fed = lambda: walsender_xmin_age(primary) is not None  # noqa: E731
            wait_for("the walsender's xmin", fed, 60, 0.2)
            # healthy: the feedback xmin is a few transactions behind at most
            assert walsender_findings(primary, BEHIND) == []

            with psycopg.connect(standby.dsn) as report:
                report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                report.execute("SELECT count(*) FROM pgq.job")  # the snapshot it holds
                with psycopg.connect(primary.dsn, autocommit=True) as conn:
                    for _ in range(BEHIND + 5):
                        conn.execute("SELECT pg_current_xact_id()")  # one xid each
                    held = read_health(conn, "pgq", older_than=300)
                (walsender,) = [b for b in held.backends if b.backend_type == "walsender"]
                assert walsender.transaction_age is None
                found = wait_for(
                    "the walsender named",
                    lambda: walsender_findings(primary, BEHIND),
                    timeout=30,
                    interval=0.5,
                )
                assert f"walsender pid {walsender.pid} " in found[0]
                assert "hot_standby_feedback" in found[0]
                report.rollback()
            # the query over, the next feedback moves the xmin up
            wait_for("no finding", lambda: walsender_findings(primary, BEHIND) == [], 30, 0.5)
