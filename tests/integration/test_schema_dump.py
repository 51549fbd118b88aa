"""schema/current.sql is what the migrations make, as `schema-dump` reads it back from the
catalogs: a migration that changes the schema without regenerating the file fails here."""

from __future__ import annotations

import difflib
import re
import subprocess
from typing import LiteralString

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.admin import schema as admin_schema
from pgq_supervisor.db import Conn
from tests.support.processes import ROOT, run_cli

CURRENT = ROOT / "schema" / "current.sql"


def dump_cli(dsn: str, *args: str) -> str:
    result: subprocess.CompletedProcess[str] = run_cli(["schema-dump", *args], dsn)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def dump(conn: Conn, schema: str = "pgq") -> str:
    return admin_schema.render(db.schema_objects(conn, schema))


def test_current_sql_is_what_the_migrations_make(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        pgq.migrate(conn, schema="pgq")
    dumped = dump_cli(empty_dsn, "--schema", "pgq")
    current = CURRENT.read_text(encoding="utf-8")
    if dumped != current:
        diff = difflib.unified_diff(
            current.splitlines(),
            dumped.splitlines(),
            "schema/current.sql",
            "a freshly migrated database",
            lineterm="",
            n=1,
        )
        pytest.fail(
            f"schema/current.sql is stale: run {admin_schema.REGENERATE}\n"
            + "\n".join(list(diff)[:80]),
            pytrace=False,
        )


def test_the_dump_names_no_schema_and_fresh_leaves_nothing_behind(empty_dsn: str) -> None:
    """The same text whatever the schema is called (quoted, a keyword), and --fresh (which
    migrates a scratch schema) gives it too, without leaving that schema behind."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for name in ("pgq", "Odd \"Sch'ema", "select"):
            pgq.migrate(conn, schema=name)
        expected = dump(conn)
        assert re.search(r"\bpgq\b", expected) is None
        assert dump(conn, "Odd \"Sch'ema") == expected
        assert dump(conn, "select") == expected
        assert dump_cli(empty_dsn, "--fresh") == expected
        scratch = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgq\\_schema\\_dump\\_%'"
        ).fetchone()
        assert scratch == (0,)


# Each change a migration could make, and the line (a regex) the dump must then show.
CHANGES: list[tuple[LiteralString, str]] = [
    ("ALTER TABLE job ADD COLUMN dummy integer", r"^    dummy +integer,$"),
    ("ALTER TABLE job ALTER COLUMN priority SET DEFAULT 5", r"^    priority +integer DEFAULT 5 "),
    ("ALTER TABLE job ALTER COLUMN origin SET NOT NULL", r"^    origin +text NOT NULL,$"),
    ("ALTER TABLE job ADD CONSTRAINT job_dummy CHECK (priority < 1000)", r"job_dummy CHECK"),
    ("ALTER TABLE job SET (fillfactor = 80)", r"fillfactor=80\)"),
    ("CREATE INDEX job_dummy_idx ON job (origin)", r"^CREATE INDEX job_dummy_idx ON job "),
    ("ALTER TYPE job_state ADD VALUE 'dummy'", r"'cancelled', 'dummy'\);$"),
    (
        "CREATE FUNCTION dummy() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        r"^CREATE OR REPLACE FUNCTION dummy\(\)$",
    ),
    (
        "CREATE OR REPLACE FUNCTION new_id() RETURNS uuid LANGUAGE sql AS 'SELECT NULL::uuid'",
        r"SELECT NULL::uuid",
    ),
    (
        "CREATE TRIGGER job_dummy AFTER DELETE ON job FOR EACH STATEMENT"
        " EXECUTE FUNCTION job_notify_inserted()",
        r"^CREATE TRIGGER job_dummy AFTER DELETE ON job ",
    ),
    ("CREATE SEQUENCE dummy_seq", r"^CREATE SEQUENCE dummy_seq AS bigint "),
    ("CREATE VIEW dummy_view AS SELECT 1 AS one", r"^CREATE VIEW dummy_view AS$"),
    ("CREATE DOMAIN dummy_domain AS text", r"^CREATE DOMAIN dummy_domain AS text;$"),
]


@pytest.mark.parametrize(("change", "shown"), CHANGES, ids=[c for c, _ in CHANGES])
def test_each_kind_of_schema_change_shows_in_the_dump(
    conn: Conn, change: LiteralString, shown: str
) -> None:
    before = dump(conn)
    assert re.search(shown, before, re.MULTILINE) is None
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL search_path TO pgq, pg_catalog")
        conn.execute(change)
        after = dump(conn)
    assert re.search(shown, after, re.MULTILINE), f"the dump does not show {shown!r}"


def test_a_schema_not_migrated_is_one_line_and_nothing_on_stdout(empty_dsn: str) -> None:
    result = run_cli(["schema-dump", "--schema", "pgq"], empty_dsn)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: schema 'pgq' is at version 0"), result.stderr
