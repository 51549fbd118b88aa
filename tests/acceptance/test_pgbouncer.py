"""Through a real PgBouncer in transaction mode (issue 15, item 5).

The supervisor's children and producers use the pooler (`--dsn`, server-side prepared
statements off: Debian 12's PgBouncer 1.18 has no max_prepared_statements, and synchronous
commit on: a session SET would leak), its LISTEN connection goes to PostgreSQL directly
(`--listen-dsn`). Small job counts: the point is the pooler, not the load.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgq_supervisor as pgq
from tests.acceptance import pgbouncer
from tests.acceptance.conftest import Conn
from tests.property.invariants import violations
from tests.support.processes import APP, FAST, Supervisor, count, run_cli
from tests.support.waiting import wait_for

if pgbouncer.binary() is None:
    # CI installs it (.ci/run), so there a missing pgbouncer fails the run instead of hiding
    if os.environ.get("CI"):
        pytest.fail("pgbouncer not installed (Debian: apt-get install pgbouncer)", pytrace=False)
    pytest.skip(
        "pgbouncer not installed (Debian: apt-get install pgbouncer)", allow_module_level=True
    )

POOLED = ("--prepare-threshold", "none")
POOLED_ENV = {"PGQ_WORKER_SYNCHRONOUS_COMMIT": "true"}


@pytest.fixture(scope="module")
def bouncer(server_dsn: str) -> Iterator[str]:
    with pgbouncer.pgbouncer(server_dsn) as base:
        yield base


@pytest.fixture
def pooled(bouncer: str, dsn: str) -> str:
    """The test's database, through the pooler."""
    return make_conninfo(bouncer, dbname=conninfo_to_dict(dsn)["dbname"])


def _supervisor(pooled: str, direct: str, *args: str) -> Supervisor:
    return Supervisor(pooled, APP, "--listen-dsn", direct, *POOLED, *args, env=dict(POOLED_ENV))


def test_sigkill_chaos_through_the_pooler_loses_and_repeats_nothing(
    dsn: str, pooled: str, bouncer: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = _supervisor(pooled, dsn, "--procs", "2", *FAST)
    sups.append(sup)
    sup.wait_ready(2)
    names = pgbouncer.clients(bouncer)
    assert "pgq-worker" in names, f"children do not use the pooler: {names}"
    assert "pgq-supervisor-listen" not in names, "LISTEN went through the pooler"
    total = 300
    with psycopg.connect(pooled, prepare_threshold=None) as producer:
        # 30 ms each: the two children stay busy through the kills
        jobs = [pgq.NewJob("sleep", {"seconds": 0.03}, max_retry_count=20) for _ in range(total)]
        pgq.enqueue_many(producer, jobs)
        producer.commit()
    rng = random.Random(20261130)
    kills = 0
    stop = threading.Event()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if children := sup.children():
            try:
                os.kill(rng.choice(children), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass  # it exited between ps and kill
        stop.wait(0.3)  # the chaos schedule itself, not a wait for a condition
    assert kills >= 5
    wait_for("every job succeeded", lambda: count(dsn, "state = 'succeeded'") == total, 90)
    assert count(dsn) == total
    assert violations(db) == []
    effects = db.execute("SELECT count(*), count(DISTINCT job_id) FROM effects").fetchone()
    assert effects == (total, total), "an effect is missing or landed twice"
    deaths = db.execute(
        "SELECT count(*) FROM pgq.job, jsonb_array_elements(attempts) a"
        " WHERE a->>'kind' = 'worker_death'"
    ).fetchone()
    assert deaths is not None and deaths[0] != 0  # the kills did hit running jobs
    assert sup.stop() == 0
    # prepared statements through a transaction pooler fail now and then, and are retried:
    # the jobs would still end well, so the log is what tells
    assert "prepared statement" not in sup.log()


def test_wakeups_arrive_through_the_direct_listen_connection(
    dsn: str, pooled: str, db: Conn, sups: list[Supervisor]
) -> None:
    # polling every 60 s: a job done within seconds was woken by a notification
    sup = _supervisor(pooled, dsn, "--procs", "1", "--poll-interval", "60")
    sups.append(sup)
    sup.wait_ready(1)
    wait_for("the LISTEN connection", lambda: "listening on" in sup.log())
    with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as producer:
        for _ in range(3):  # the first could ride on the wake-up that follows LISTEN
            job = pgq.enqueue(producer, "record", {})
            wait_for(f"job {job} done", lambda: count(dsn, "state = 'succeeded'") > 0, 10)
            db.execute("DELETE FROM pgq.job")
    assert sup.stop() == 0


def test_admin_cli_through_the_pooler(dsn: str, pooled: str) -> None:
    env = {"PGQ_PREPARE_THRESHOLD": "none"}
    enq = run_cli(["enqueue", "noop", "{}"], dsn=pooled, env=env)
    assert enq.returncode == 0, enq.stderr
    job_id = enq.stdout.strip()
    depth = run_cli(["depth"], dsn=pooled, env=env)
    assert (depth.returncode, depth.stdout.strip()) == (0, "1"), depth.stderr
    status = run_cli(["status", "--json"], dsn=pooled, env=env)
    assert status.returncode == 0, status.stderr
    assert "noop" in json.dumps(json.loads(status.stdout))
    cancel = run_cli(["cancel", job_id], dsn=pooled, env=env)
    assert cancel.returncode == 0, cancel.stderr
    assert count(dsn, "state = 'cancelled'") == 1
