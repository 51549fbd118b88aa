"""Issue 38: the grants docs/operations.md gives for a worker, a producer and a read-only
dashboard role (pgq_supervisor/sql/roles.sql, included in the doc verbatim), run as written on
a migrated database with real roles, each shown to do its job and nothing more: the worker runs
a job through a real supervisor and child, the producer enqueues and reads, the dashboard reads
every page; none may do DDL, nor what the others may."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from typing import LiteralString

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool
from starlette.testclient import TestClient

import pgq_supervisor as pgq
from pgq_supervisor.db import partitions as db_partitions
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
            for statement in PARTITIONING:  # the maintenance DDL, through its definers
                conn.execute(statement)
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
        "UPDATE pgq.job SET priority = 1",
        "SELECT 1 FROM pgq.job FOR NO KEY UPDATE",
        "INSERT INTO pgq.job (type, payload, state) VALUES ('noop', '{}', 'succeeded')",
        "INSERT INTO pgq.job_dependency SELECT id, id FROM pgq.job LIMIT 1",
        "UPDATE pgq.job_bundle SET num_jobs_stopped = 0",
        "TRUNCATE pgq.job",
        "INSERT INTO pgq.type_pause (type) VALUES ('noop')",
        "UPDATE pgq.supervisor SET procs = 0",
        "DELETE FROM pgq.schedule",
        *PARTITIONING,
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
        *DEFINERS,
        *PARTITIONING,
        *NO_DDL,
    ]:
        _refused(dashboard, statement)


# The functions that write job rows as their owner (schema/0030), called with nothing to do.
DEFINERS: list[LiteralString] = [
    "SELECT pgq.link_dependencies('{}', '{}')",
    "SELECT pgq.ordered_link(gen_random_uuid(), 'k')",
    "SELECT pgq.debounce_wait(gen_random_uuid(), 'k')",
    "SELECT * FROM pgq.debounce_holder('k', '{}', NULL, 0)",
    "SELECT pgq.workflow_signal(gen_random_uuid(), 'go', '{}')",
]
# The job table's partition maintenance, as its owner (schema/0029): the worker's alone.
PARTITIONING: list[LiteralString] = [
    "SELECT pgq.job_partition_ensure(interval '1 hour', 1)",
    "SELECT * FROM pgq.job_partition_clean(interval '1 day', interval '7 days', NULL)",
    "SELECT * FROM pgq.job_partition_expire(interval '1 day', interval '7 days', 10, '1s', NULL)",
]


def _failed_job(admin: psycopg.Connection[tuple[object, ...]]) -> uuid.UUID:
    job_id = pgq.enqueue(admin, "noop", {"failed": True})
    admin.execute(
        "UPDATE pgq.job SET state = 'failed', stopped_at = now(), error_msg = 'boom' WHERE id = %s",
        (job_id,),
    )
    return job_id


def _running_job(admin: psycopg.Connection[tuple[object, ...]], unique_key: str) -> uuid.UUID:
    """A job holding `unique_key`, claimed (by no real worker)."""
    job_id = pgq.enqueue(admin, "noop", {"running": True}, unique_key=unique_key)
    admin.execute(
        "UPDATE pgq.job SET state = 'running', started_at = now(), worker_alive_at = now(),"
        " worker_id = 'w', lease = gen_random_uuid(), max_retry_count = 3 WHERE id = %s",
        (job_id,),
    )
    return job_id


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "transaction"])
def test_the_producer_enqueues_with_every_option_and_updates_no_job_row(
    logins: dict[str, str], module_dsn: str, in_transaction: bool
) -> None:
    """Issue 38: the producer holds no UPDATE or DELETE on job rows, and every enqueue option
    works for it, also those that write job rows after the insert: a dependency on a failed job
    (the new job cancelled at once, its bundle counted), debounce of a pending and of a running
    holder, strict order; directly and through savepoints in its own transaction."""
    producer = logins["producer"]
    tag = uuid.uuid4().hex[:8]
    with psycopg.connect(module_dsn, autocommit=True) as admin:
        held = admin.execute(
            "SELECT t, p FROM unnest(ARRAY['pgq.job', 'pgq.job_bundle', 'pgq.job_dependency']) t,"
            " unnest(ARRAY['UPDATE', 'DELETE', 'TRUNCATE']) p"
            " WHERE has_table_privilege(%(r)s, t, p)"
            "    OR p = 'UPDATE' AND has_any_column_privilege(%(r)s, t, p)",
            {"r": conninfo_to_dict(producer)["user"]},
        ).fetchall()
        assert held == []
        failed = _failed_job(admin)
        running = _running_job(admin, unique_key=f"run-{tag}")
    with psycopg.connect(producer, autocommit=True) as conn:
        with conn.transaction() if in_transaction else contextlib.nullcontext():
            doomed = pgq.enqueue(conn, "noop", {"n": 1}, depends_on=[failed])
            waiting = pgq.enqueue(conn, "noop", {"n": 2}, depends_on=[running, failed],
                                  on_dependency_failure="run", priority=3, timeout=5,
                                  max_retry_count=1, origin="o", concurrency_key="c",
                                  tenant="acme")  # fmt: skip
            key = f"d-{tag}"
            first = pgq.enqueue(conn, "noop", {"n": 3}, unique_key=key, replace=True)
            again = pgq.enqueue(conn, "noop", {"n": 4}, unique_key=key, replace=True)
            behind = pgq.enqueue(conn, "noop", {"n": 5}, unique_key=f"run-{tag}", replace=True)
            behind_again = pgq.enqueue(
                conn, "noop", {"n": 6}, unique_key=f"run-{tag}", replace=True
            )
            head = pgq.enqueue(conn, "noop", {"n": 7}, ordered_key=f"o-{tag}")
            second = pgq.enqueue(conn, "noop", {"n": 8}, ordered_key=f"o-{tag}")
            windowed = pgq.enqueue(conn, "noop", {"n": 9}, unique_key=f"w-{tag}", unique_for=60)
            many = pgq.enqueue_many(conn, [
                pgq.NewJob("noop", {"n": 10}, depends_on=[failed]),
                pgq.NewJob("noop", {"n": 11}, ordered_key=f"o-{tag}"),
            ])  # fmt: skip
            bundle = pgq.enqueue_bundle(
                conn, "batch", [pgq.NewJob("noop", {"n": 12}, depends_on=[failed])],
                on_complete="batch_done",
            )  # fmt: skip
            in_sql = conn.execute(
                "SELECT pgq.enqueue('noop', '{}', jsonb_build_object('depends_on',"
                " jsonb_build_array(%s::text)))",
                (str(failed),),
            ).fetchone()
        with ConnectionPool(producer, min_size=1, max_size=1, open=True) as pool:
            pooled = pgq.Producer(pool).enqueue("noop", {"n": 13}, depends_on=[failed])
        assert in_sql is not None
        state = {j: pgq.get_job(conn, j) for j in
                 [doomed, waiting, first, behind, head, second, windowed, *many, in_sql[0],
                  pooled]}  # fmt: skip
    cancelled = [doomed, many[0], in_sql[0], pooled]
    assert {state[j].state for j in cancelled} == {pgq.JobState.CANCELLED}
    assert state[waiting].waiting_on == 1 and state[waiting].state is pgq.JobState.PENDING
    assert again == first and state[first].payload == {"n": 4}
    assert behind_again == behind and state[behind].payload == {"n": 6}
    assert state[behind].debounce_key == f"run-{tag}"
    assert (state[head].waiting_on, state[second].waiting_on, state[many[1]].waiting_on) == (
        0,
        1,
        1,
    )
    assert state[windowed].state is pgq.JobState.PENDING
    with psycopg.connect(producer, autocommit=True) as conn:
        done = pgq.get_bundle(conn, bundle.id)
        assert (done.num_jobs, done.num_jobs_stopped) == (1, 1)
        callbacks = conn.execute(
            "SELECT count(*) FROM pgq.job WHERE type = 'batch_done' AND payload->>'bundle_id' = %s",
            (str(bundle.id),),
        ).fetchone()
        assert callbacks == (1,)


def test_the_producer_cannot_use_the_definer_functions_on_others_jobs(
    logins: dict[str, str], module_dsn: str
) -> None:
    """The functions that write job rows as their owner act only on jobs the caller's own
    transaction just enqueued, also once that transaction has written the victim's row (a new
    job depending on it sets its has_dependents); refused, they leave the victim as it was."""
    tag = uuid.uuid4().hex[:8]
    with psycopg.connect(module_dsn, autocommit=True) as admin:
        failed = _failed_job(admin)
        running = _running_job(admin, unique_key=f"run-{tag}")
        victim = pgq.enqueue(admin, "noop", {"victim": True})
        # as a debounced job waiting behind `running` is, but its producer asked for no key
        behind = pgq.enqueue(admin, "noop", {"victim": 2}, depends_on=[running],
                             on_dependency_failure="run")  # fmt: skip
        blocker = pgq.enqueue(admin, "noop", {}, ordered_key=f"o-{tag}")
        admin.execute(
            "UPDATE pgq.job SET state = 'failed', stopped_at = now(), error_msg = 'x'"
            " WHERE id = %s",
            (blocker,),
        )  # fmt: skip  (a failed head blocks the key)
        before = {j: pgq.get_job(admin, j) for j in (victim, behind)}
    abuses: list[tuple[LiteralString, tuple[object, ...]]] = [
        ("SELECT pgq.link_dependencies(ARRAY[%s], ARRAY[%s])", (victim, failed)),
        ("SELECT pgq.ordered_link(%s, %s)", (victim, f"o-{tag}")),
        ("SELECT pgq.debounce_wait(%s, %s)", (behind, f"run-{tag}")),
    ]
    with psycopg.connect(logins["producer"], autocommit=True) as conn:
        for touch_first in (False, True):
            for statement, args in abuses:
                refused = pytest.raises(DENIED, match="not a job this transaction just enqueued")
                with refused, conn.transaction():
                    if touch_first:  # this transaction writes the victims' rows
                        pgq.enqueue(conn, "noop", {}, depends_on=[victim, behind])
                    conn.execute(statement, args)
        for job_id, was in before.items():
            now = pgq.get_job(conn, job_id)
            assert (now.state, now.waiting_on, now.ordered_key, now.debounce_key) == (
                was.state, was.waiting_on, was.ordered_key, was.debounce_key
            )  # fmt: skip


def test_a_producers_temporary_table_does_not_stand_in_for_the_queues(
    logins: dict[str, str], module_dsn: str
) -> None:
    """Every function of the schema names pg_temp last in its search_path (schema/0030): else
    a producer's temporary `job_unique` stands in for the queue's in the insert's trigger and in
    the key's release by the definer that cancels the job (as its owner), and the key is lost
    or stays held by a cancelled job."""
    key = f"t-{uuid.uuid4().hex[:8]}"
    login = str(conninfo_to_dict(logins["producer"])["user"])
    with psycopg.connect(module_dsn, autocommit=True) as admin:
        failed = _failed_job(admin)
        admin.execute(sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(
            sql.Identifier(admin.info.dbname), sql.Identifier(login)
        ))  # fmt: skip
        try:
            with psycopg.connect(logins["producer"], autocommit=True) as conn:
                conn.execute("CREATE TEMP TABLE job_unique (unique_key text, job_id uuid)")
                job_id = pgq.enqueue(conn, "noop", {}, unique_key=key, depends_on=[failed])
                assert pgq.get_job(conn, job_id).state is pgq.JobState.CANCELLED
                assert conn.execute("SELECT count(*) FROM pg_temp.job_unique").fetchone() == (0,)
            held = admin.execute(
                "SELECT count(*) FROM pgq.job_unique WHERE unique_key = %s", (key,)
            ).fetchone()
            assert held == (0,)
        finally:
            admin.execute(sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM {}").format(
                sql.Identifier(admin.info.dbname), sql.Identifier(login)
            ))  # fmt: skip


def test_the_roles_keep_their_rights_once_the_table_is_partitioned(
    logins: dict[str, str], module_dsn: str
) -> None:
    """`partition` (schema/0029) makes a new job table: it carries the old one's privileges,
    table and columns, so every role does what it did, and nothing more. The last test of
    the module: the module's database stays partitioned."""
    with psycopg.connect(module_dsn, autocommit=True) as admin:
        assert db_partitions.convert(admin, "pgq", interval=86400.0, lock_timeout=10.0)
    with psycopg.connect(logins["producer"], autocommit=True) as conn:
        first = pgq.enqueue(conn, "noop", {"n": 1}, tenant="acme")
        pgq.enqueue(conn, "noop", {"n": 2}, depends_on=[first])
        pgq.enqueue(conn, "noop", {"n": 3}, ordered_key="o")
        assert pgq.get_job(conn, first).state is pgq.JobState.PENDING
    for statement in [
        "UPDATE pgq.job SET priority = 1",
        "INSERT INTO pgq.job (type, payload, state) VALUES ('noop', '{}', 'succeeded')",
        *PARTITIONING,
    ]:
        _refused(logins["producer"], statement)
    _refused(logins["dashboard"], "UPDATE pgq.job SET priority = 1")
    with psycopg.connect(logins["worker"], autocommit=True) as conn:
        for statement in PARTITIONING:  # the maintenance DDL, through its definers
            conn.execute(statement)
        claimed = conn.execute("SELECT count(*) FROM pgq.job WHERE type = 'noop'").fetchone()
        assert claimed is not None and claimed[0] >= 2
