"""Issue 38: `migrate` and the migration advisory lock any role may take, and `migrate` for a
role without DDL rights. The real CLI in a subprocess, the lock held from another connection
with the key the code uses, a real role."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgq_supervisor as pgq
from pgq_supervisor import schema as migrations
from tests.support.processes import ROOT, run_cli
from tests.support.waiting import wait_for

HOLDER = "the-lock-holder"


@pytest.fixture
def holder(empty_dsn: str) -> Iterator[int]:
    """A session holding the migration lock (session-level, as any role may): its pid."""
    with psycopg.connect(empty_dsn, autocommit=True, application_name=HOLDER) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (migrations._LOCK_KEY,))
        yield conn.info.backend_pid


def _schema_exists(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgq'").fetchone()
    return row == (1,)


def test_migrate_gives_up_after_its_lock_timeout_naming_the_holder(
    empty_dsn: str, holder: int
) -> None:
    result = run_cli(["migrate", "--dsn", empty_dsn, "--lock-timeout", "1"], timeout=30)
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    named = rf"pid {holder} \(user postgres, application_name '{HOLDER}'\)"
    assert len(lines) == 2, lines
    assert re.search(rf"WARNING .*waiting up to 1 s .* for the migration lock, held by {named}$",
                     lines[0]), lines[0]  # fmt: skip
    assert re.fullmatch(
        rf"error: the migration lock is held by {named}: waited 1 s for it"
        r" \(migrate_lock_timeout, migrate --lock-timeout\); nothing applied",
        lines[1],
    ), lines[1]
    assert not _schema_exists(empty_dsn)


def test_migrate_goes_ahead_once_the_holder_lets_go(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True, application_name=HOLDER) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (migrations._LOCK_KEY,))
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgq_supervisor", "migrate", "--dsn", empty_dsn],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        try:

            def waiting() -> bool:
                row = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()
                return row == (1,)

            wait_for("migrate waiting for the lock", waiting, timeout=20)
            conn.execute("SELECT pg_advisory_unlock(%s)", (migrations._LOCK_KEY,))
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.startswith("applied migrations 1, 2, "), out
    # the default wait, said once
    assert re.search(r"waiting up to 60 s \(migrate_lock_timeout\)", err), err
    assert err.count("waiting up to") == 1, err


def test_the_librarys_migrate_raises_migration_locked_and_keeps_the_callers_transaction(
    empty_dsn: str, holder: int
) -> None:
    with psycopg.connect(empty_dsn) as conn:  # a transaction of the caller's
        conn.execute("CREATE TABLE mine (x int)")
        with pytest.raises(pgq.MigrationLocked, match=rf"held by pid {holder} "):
            pgq.migrate(conn, lock_timeout=0.2)
        conn.execute("INSERT INTO mine VALUES (1)")  # still usable
        row = conn.execute("SHOW lock_timeout").fetchone()
        assert row == ("0",)  # the caller's setting, not the wait's
        conn.commit()
    assert not _schema_exists(empty_dsn)


def test_migrate_with_nothing_to_apply_needs_no_ddl_rights(dsn: str) -> None:
    """A role that may log in, connect and use schema pgq (and read its schema_version), with
    no CREATE anywhere: nothing to apply succeeds, as before it failed on CREATE SCHEMA."""
    role = f"pgq_noddl_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(role)
    with psycopg.connect(dsn, autocommit=True) as admin:
        dbname = sql.Identifier(admin.info.dbname)
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        try:
            admin.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
            admin.execute(sql.SQL("REVOKE CREATE, TEMPORARY ON DATABASE {} FROM PUBLIC")
                          .format(dbname))  # fmt: skip
            admin.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(dbname, ident))
            admin.execute(sql.SQL("GRANT USAGE ON SCHEMA pgq TO {}").format(ident))
            admin.execute(sql.SQL("GRANT SELECT ON pgq.schema_version TO {}").format(ident))
            as_role = make_conninfo(dsn, user=role)
            with (
                psycopg.connect(as_role, autocommit=True) as mine,
                pytest.raises(psycopg.errors.InsufficientPrivilege),
            ):
                mine.execute("CREATE SCHEMA IF NOT EXISTS pgq")  # no DDL indeed
            result = run_cli(["migrate", "--dsn", as_role])
            assert result.returncode == 0, result.stderr
            assert result.stdout == "schema pgq is up to date\n"
        finally:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            admin.execute(sql.SQL("DROP ROLE {}").format(ident))
