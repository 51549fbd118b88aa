"""Issue 27: a server started here at max_connections = 20, its app role limited to 16, as a
small managed database looks. The supervisor runs within its connection budget (the app's
enqueues succeed), a child never claims a job it cannot keep alive, children that cannot
connect back off while the others work, and a heartbeat that cannot reach the database gives
its job back before the rescuer would charge it: no job discarded, no attempt charged."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgq_supervisor as pgq
from tests.acceptance.apps.pgq_test_app import EFFECTS_DDL
from tests.acceptance.pgserver import OwnServer, local_binaries
from tests.acceptance.scrape import free_port, get, metric, scrape
from tests.support.processes import APP, FAST, Supervisor
from tests.support.waiting import wait_for

T = TypeVar("T")
ROLE = "app"
ROLE_LIMIT = 16


@pytest.fixture(scope="module")
def small(server_dsn: str) -> Iterator[OwnServer]:
    """The issue's server: the local PostgreSQL's binaries where the suite runs on it, the
    embedded package's otherwise (inside unshare -n)."""
    server = OwnServer(settings=["max_connections=20"], binaries=local_binaries(server_dsn))
    with server, psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT {}").format(
                sql.Identifier(ROLE), sql.Literal(ROLE_LIMIT)
            )
        )
        yield server


@pytest.fixture
def app_dsn(small: OwnServer) -> Iterator[str]:
    """A database of the app role's, migrated by it, with the test app's effects table."""
    name = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(small.dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(ROLE)
            )
        )
    dsn = make_conninfo(small.dsn, user=ROLE, dbname=name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        pgq.migrate(conn)
        conn.execute(EFFECTS_DDL)
    yield dsn
    with psycopg.connect(small.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def sups() -> Iterator[list[Supervisor]]:
    started: list[Supervisor] = []
    yield started
    for s in started:
        s.close()


def as_superuser(dsn: str) -> str:
    """The superuser may use the reserved slots: the test's own looks never take the app's."""
    return make_conninfo(dsn, user="postgres")


def one(dsn: str, query: str) -> int:
    with psycopg.connect(as_superuser(dsn)) as conn:
        row = conn.execute(query.encode()).fetchone()  # the test's own statements
    assert row is not None
    return int(row[0])


def charged(dsn: str) -> int:
    """Jobs that lost an attempt: rescued, died, or failed."""
    return one(
        dsn, "SELECT count(*) FROM pgq.job WHERE current_retry_count > 0 OR attempts <> '[]'"
    )


def succeeded(dsn: str) -> int:
    return one(dsn, "SELECT count(*) FROM pgq.job WHERE state = 'succeeded'")


def effects_once(dsn: str) -> tuple[int, int]:
    """(jobs with an effect, effects): equal when no job's work landed twice."""
    with psycopg.connect(as_superuser(dsn)) as conn:
        row = conn.execute("SELECT count(DISTINCT job_id), count(*) FROM effects").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def supervisor_connections(dsn: str) -> int:
    return one(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgq-%'"
        " AND datname = current_database()",
    )


def alive(sup: Supervisor) -> None:
    assert sup.proc.poll() is None, f"the supervisor exited:\n{sup.log()[-3000:]}"


def while_alive(sup: Supervisor, check: Callable[[], T]) -> Callable[[], T]:
    """`check`, failing at once if the supervisor has exited."""

    def run() -> T:
        alive(sup)
        return check()

    return run


def test_procs_16_run_within_the_budget_and_the_app_enqueues(
    app_dsn: str, sups: list[Supervisor]
) -> None:
    """The issue's first run: --procs 16 asked for 34 connections of 16. Before: no control
    connection, three boot failures and the supervisor exited 1; the app's enqueues failed."""
    with psycopg.connect(app_dsn, autocommit=True) as conn:
        pgq.enqueue_many(conn, [pgq.NewJob("sleep", {"seconds": 0.3}) for _ in range(40)])
    port = free_port()
    sup = Supervisor(app_dsn, APP, "--procs", "16", "--metrics-port", str(port), *FAST)
    sups.append(sup)
    most = [0]

    def working() -> bool:
        alive(sup)
        most[0] = max(most[0], supervisor_connections(app_dsn))
        return one(app_dsn, "SELECT count(*) FROM pgq.job WHERE state = 'running'") >= 2

    wait_for("children at work", working, timeout=60)
    failed = []
    for i in range(12):  # the app's requests, each on a connection of its own
        try:
            with psycopg.connect(app_dsn, autocommit=True) as conn:
                pgq.enqueue(conn, "noop", {"request": i})
        except psycopg.OperationalError as exc:
            failed.append(str(exc).strip())
        most[0] = max(most[0], supervisor_connections(app_dsn))
    assert failed == []

    def done() -> bool:
        alive(sup)
        most[0] = max(most[0], supervisor_connections(app_dsn))
        return succeeded(app_dsn) == 52

    wait_for("every job succeeded", done, timeout=120)
    assert charged(app_dsn) == 0
    assert effects_once(app_dsn) == (40, 40)
    # connection_headroom (5 by default) of the role's 16 stayed free
    assert most[0] <= ROLE_LIMIT - 5
    assert "connection budget: 16 procs need 34 connections" in sup.log()
    assert get(port, "/readyz")[0] == 200
    assert sup.stop() == 0


def test_procs_15_long_jobs_no_claim_without_a_heartbeat(
    app_dsn: str, sups: list[Supervisor]
) -> None:
    """The issue's second run (40 s jobs, here 3 s), with the budget check off, so that
    children do run short of connections. Before: 14 children claimed jobs with no heartbeat
    connection, the rescuer took them back while they ran, 14 attempts charged, work thrown
    away. Now a child starts with both connections or not at all, and one that cannot is
    retried with backoff while the others work."""
    with psycopg.connect(app_dsn, autocommit=True) as conn:
        pgq.enqueue_many(conn, [pgq.NewJob("sleep", {"seconds": 3.0}) for _ in range(14)])
    port = free_port()
    sup = Supervisor(
        app_dsn, APP, "--procs", "15", "--metrics-port", str(port), "--connect-timeout", "2",
        *FAST, env={"PGQ_CONNECTION_BUDGET": "off"},
    )  # fmt: skip
    sups.append(sup)

    def done() -> bool:
        alive(sup)
        return succeeded(app_dsn) == 14

    wait_for("every job succeeded", done, timeout=120)
    assert charged(app_dsn) == 0
    assert effects_once(app_dsn) == (14, 14)

    def boot_failures() -> float | None:
        return metric(scrape(port), "pgq_child_boot_failures_total")

    wait_for("boot failures counted", while_alive(sup, boot_failures), timeout=30)
    assert get(port, "/readyz") == (503, "not ready\n")  # some children cannot start
    assert metric(scrape(port), "pgq_jobs_rescued_total") == 0
    assert sup.stop() == 0


def test_a_heartbeat_that_cannot_reconnect_gives_its_job_back_uncharged(
    small: OwnServer, app_dsn: str, sups: list[Supervisor]
) -> None:
    """The heartbeat's connection is lost mid-job and the role has no slot left to make it
    again. Before: the rescuer took the job at dead_after and charged an attempt while its
    worker ran on. Now the child gives it up at half of dead_after: released, uncharged, run
    again once connections are back."""
    with psycopg.connect(app_dsn, autocommit=True) as conn:
        job_id = pgq.enqueue(conn, "sleep", {"seconds": 5.0})
    sup = Supervisor(
        app_dsn, APP, "--procs", "1", "--heartbeat-interval", "0.5", "--dead-after", "4",
        "--poll-interval", "0.5",
    )  # fmt: skip
    sups.append(sup)
    state = f"SELECT state = 'running' FROM pgq.job WHERE id = '{job_id}'"
    wait_for("the job running", while_alive(sup, lambda: one(app_dsn, state)), timeout=60)
    with psycopg.connect(small.dsn, autocommit=True) as admin:
        try:
            # the slots the supervisor holds are all the role may have now
            admin.execute(sql.SQL("ALTER ROLE {} CONNECTION LIMIT 3").format(sql.Identifier(ROLE)))
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'pgq-heartbeat' AND datname = %s",
                (psycopg.conninfo.conninfo_to_dict(app_dsn)["dbname"],),
            )
            pending = f"SELECT state = 'pending' FROM pgq.job WHERE id = '{job_id}'"
            wait_for("the job given back", while_alive(sup, lambda: one(app_dsn, pending)), 30)
            assert charged(app_dsn) == 0, "charged an attempt for a connection shortage"
            assert "heartbeat cannot reach the database" in sup.log()
        finally:
            admin.execute(
                sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(
                    sql.Identifier(ROLE), sql.Literal(ROLE_LIMIT)
                )
            )
    wait_for("the job succeeded", while_alive(sup, lambda: succeeded(app_dsn) == 1), timeout=60)
    assert charged(app_dsn) == 0
    assert effects_once(app_dsn) == (1, 1)
    assert sup.stop() == 0
