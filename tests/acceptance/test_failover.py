"""Failover: a supervisor on a libpq multi-host DSN with target_session_attrs=read-write
follows a promoted standby. A primary and its synchronous streaming standby (pg_basebackup) of
the embedded package's binaries; the primary is stopped mid-run, the standby promoted: every
job enqueued before and after ends succeeded on the new primary, none lost, and each effect
written through the job's connection lands exactly once."""

from __future__ import annotations

import time

import psycopg

import pgq_supervisor as pgq
from tests.acceptance.apps.pgq_test_app import EFFECTS_DDL
from tests.acceptance.pgserver import OwnServer
from tests.support.processes import APP, FAST, Supervisor
from tests.support.waiting import wait_for

BEFORE, AFTER = 300, 50


def streaming(primary: OwnServer) -> bool:
    with psycopg.connect(primary.dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
        ).fetchone()
    return row == (1,)


def enqueue(dsn: str, n: int, start: int) -> list[object]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(
            pgq.enqueue_many(conn, [pgq.NewJob("sleep", {"seconds": 0.01, "n": i})
                                    for i in range(start, start + n)])
        )  # fmt: skip


def test_a_multi_host_dsn_follows_a_promoted_standby(sups: list[Supervisor]) -> None:
    with OwnServer() as primary:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            pgq.migrate(conn)
            conn.execute(EFFECTS_DDL)
        with primary.standby() as standby:
            wait_for("the standby streaming", lambda: streaming(primary), timeout=30)
            with psycopg.connect(primary.dsn, autocommit=True) as conn:
                # synchronous: a commit the primary acknowledged is on the standby too
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("SELECT pg_reload_conf()")
            # the standby first: read-write is what makes libpq pass it over while it is one
            both = (
                f"host=127.0.0.1,127.0.0.1 port={standby.port},{primary.port} user=postgres"
                " dbname=postgres target_session_attrs=read-write connect_timeout=2"
            )
            ids = enqueue(both, BEFORE, 0)
            sup = Supervisor(both, APP, "--procs", "2", *FAST)
            sups.append(sup)
            wait_for("some done", lambda: primary.count("state = 'succeeded'") >= 30, 30)

            primary.stop()
            stopped_at = time.monotonic()
            standby.promote()

            def succeeded() -> int:
                return standby.count("state = 'succeeded'")

            replicated = succeeded()  # what the primary finished, streamed before it stopped
            assert replicated < BEFORE
            wait_for("a job done on the new primary", lambda: succeeded() > replicated, 30)
            first = time.monotonic() - stopped_at
            ids += enqueue(both, AFTER, BEFORE)  # reaches the new primary
            wait_for("every job done", lambda: succeeded() == BEFORE + AFTER, 60)
            print(f"first success {first:.2f} s after the primary stopped")
            with psycopg.connect(standby.dsn) as conn:
                found = conn.execute("SELECT array_agg(id) FROM pgq.job").fetchone()
                assert found is not None and set(found[0]) == set(ids), "a job was lost"
                effects = conn.execute(
                    "SELECT count(*), count(DISTINCT job_id) FROM effects"
                ).fetchone()
                assert effects == (BEFORE + AFTER, BEFORE + AFTER)
            assert sup.proc.poll() is None, sup.log()[-3000:]
            assert sup.stop() == 0, sup.log()[-3000:]
