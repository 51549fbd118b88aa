"""Issue 38: the grants docs/operations.md gives for a worker, a producer and a read-only
dashboard role (pgq_supervisor/sql/roles.sql, included in the doc verbatim), run as written on
a migrated database with real roles, each shown to do its job and nothing more: the worker runs
a job through a real supervisor and child, the producer enqueues and reads, the dashboard reads
every page; none may do DDL, nor what the others may."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import LiteralString

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from starlette.testclient import TestClient

import pgq_supervisor as pgq
from pgq_supervisor.web import create_app
from tests.support.processes import APP, FAST, ROOT, Supervisor, run_cli
from tests.support.waiting import wait_for

ROLES_SQL = ROOT / "pgq_supervisor" / "sql" / "roles.sql"
DOC = ROOT / "docs" / "operations.md"
DENIED = psycopg.errors.InsufficientPrivilege
GROUPS = ("worker", "producer", "dashboard")


def test_the_doc_shows_the_roles_sql_verbatim() -> None:
    block = r"<!-- not-run: pgq_supervisor/sql/roles\.sql, verbatim;.*?-->\n```sql\n(.*?)```"
    found = re.search(block, DOC.read_text(), re.S)
    assert found is not None, "docs/operations.md lost its roles.sql block"
    assert found.group(1) == ROLES_SQL.read_text()


@pytest.fixture(scope="module")
def logins(module_dsn: str) -> Iterator[dict[str, str]]:
    """roles.sql as written (its group roles renamed apart: roles are the server's, and other
    runs share it), then a login role in each group: their DSNs by group."""
    tag = uuid.uuid4().hex[:8]
    text = re.sub(r"\bpgq_(worker|producer|dashboard)\b", rf"pgq_\1_{tag}", ROLES_SQL.read_text())
    made = [f"pgq_{g}_{tag}" for g in GROUPS] + [f"login_{g}_{tag}" for g in GROUPS]
    with psycopg.connect(module_dsn, autocommit=True) as admin:
        # the database's defaults out of the way: what PUBLIC may do is what a role may do
        dbname = sql.Identifier(admin.info.dbname)
        admin.execute(sql.SQL("REVOKE CREATE, TEMPORARY ON DATABASE {} FROM PUBLIC").format(dbname))
        admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        admin.execute("CREATE SCHEMA other")
        admin.execute("CREATE TABLE other.secrets (x text)")
        try:
            admin.execute(text)  # our file, as one script (as psql would run it)
            admin.execute(text)  # and again, as after a migrate: it may run any number of times
            for group in GROUPS:
                admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                    sql.Identifier(f"login_{group}_{tag}"), sql.Identifier(f"pgq_{group}_{tag}")
                ))  # fmt: skip
            yield {g: make_conninfo(module_dsn, user=f"login_{g}_{tag}") for g in GROUPS}
        finally:
            for role in reversed(made):
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _refused(dsn: str, statement: LiteralString) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(DENIED):
        conn.execute(statement)


NO_DDL: list[LiteralString] = [
    "CREATE TABLE pgq.mine (x int)",
    "CREATE SCHEMA mine",
    "DROP TABLE pgq.job",
    "ALTER TABLE pgq.job ADD COLUMN x int",
    "SELECT * FROM other.secrets",
]


def test_the_worker_runs_a_job_and_may_not_do_ddl(logins: dict[str, str]) -> None:
    worker = logins["worker"]
    with psycopg.connect(logins["producer"], autocommit=True) as producer:
        job_id = pgq.enqueue(producer, "noop", {"n": 1})
    sup = Supervisor(worker, APP, "--procs", "1", *FAST)
    try:
        sup.wait_ready(1)
        with psycopg.connect(worker, autocommit=True) as conn:
            done = wait_for(
                "the job done by the worker role",
                lambda: pgq.get_job(conn, job_id).state is pgq.JobState.SUCCEEDED or None,
                timeout=30,
            )
            assert done, sup.log()
        assert sup.stop() == 0, sup.log()
        assert "ERROR" not in sup.log() and "permission denied" not in sup.log(), sup.log()
    finally:
        sup.close()
    result = run_cli(["migrate", "--dsn", worker])  # nothing to apply: no DDL needed
    assert result.returncode == 0 and "up to date" in result.stdout, result.stderr
    for statement in NO_DDL:
        _refused(worker, statement)


def test_the_producer_enqueues_and_reads_and_nothing_more(logins: dict[str, str]) -> None:
    producer = logins["producer"]
    with psycopg.connect(producer, autocommit=True) as conn:
        first = pgq.enqueue(conn, "noop", {"n": 1}, unique_key=f"k-{uuid.uuid4()}")
        pgq.enqueue(conn, "noop", {"n": 2}, depends_on=[first], tenant="acme",
                    concurrency_key="c")  # fmt: skip
        pgq.enqueue(conn, "noop", {"n": 3}, ordered_key="o")
        key = f"d-{uuid.uuid4()}"
        pgq.enqueue(conn, "noop", {"n": 3}, unique_key=key, replace=True)
        pgq.enqueue(conn, "noop", {"n": 4}, unique_key=key, replace=True)  # debounced
        bundle = pgq.enqueue_bundle(conn, "batch", [pgq.NewJob("noop", {"n": 5})])
        assert pgq.get_job(conn, first).state is pgq.JobState.PENDING
        assert pgq.get_bundle(conn, bundle.id).num_jobs == 1
        with pytest.raises(TimeoutError, match=r"no supervisor .* serves type .noop."):
            pgq.wait(conn, first, timeout=0.1)
        assert pgq.queue_depth(conn) >= 1
        assert pgq.signal(conn, first, "go", {"ok": True}) is True
    for statement in [
        "DELETE FROM pgq.job",
        "TRUNCATE pgq.job",
        "INSERT INTO pgq.type_pause (type) VALUES ('noop')",
        "UPDATE pgq.supervisor SET procs = 0",
        "DELETE FROM pgq.schedule",
        *NO_DDL,
    ]:
        _refused(producer, statement)


def test_the_dashboard_reads_every_page_and_writes_nothing(logins: dict[str, str]) -> None:
    dashboard = logins["dashboard"]
    with psycopg.connect(logins["producer"], autocommit=True) as producer:
        job_id = pgq.enqueue(producer, "noop", {"n": 1})
    app = create_app(dashboard, read_only=True)
    try:
        with TestClient(app) as client:
            for page in ["/", "/jobs", f"/jobs/{job_id}", "/types/noop", "/bundles", "/workers",
                         "/schedules", "/jobs?q=payload.n = 1"]:  # fmt: skip
                answer = client.get(page)
                assert answer.status_code == 200, (page, answer.text[:500])
    finally:
        app.state.pgq_close()
    for statement in [
        "UPDATE pgq.job SET priority = 1",
        "DELETE FROM pgq.job",
        "INSERT INTO pgq.job (type, payload) VALUES ('noop', '{}')",
        "INSERT INTO pgq.type_pause (type) VALUES ('noop')",
        *NO_DDL,
    ]:
        _refused(dashboard, statement)
