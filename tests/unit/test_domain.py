"""Domain types, JSON encoding, named SQL and the inline test helper. No database."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db, sql, testing
from pgq_supervisor.jobs import TERMINAL_STATES, BundleId, check_type_name


@pytest.mark.parametrize("name", ["a", "resize_image", "x" * 100, "ns.sub:type-2", "é"])
def test_valid_type_names(name: str) -> None:
    assert check_type_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 101, "a b", "tab\there", "new\nline", "nul\x00"])
def test_invalid_type_names(name: str) -> None:
    with pytest.raises(ValueError, match="1 to 100 characters"):
        check_type_name(name)


def test_long_invalid_names_are_shortened_in_the_message() -> None:
    with pytest.raises(ValueError) as info:
        check_type_name("y" * 500)
    assert len(str(info.value)) < 200


def test_terminal_states() -> None:
    assert {s for s in pgq.JobState if s.is_terminal} == TERMINAL_STATES
    expected = {pgq.JobState.SUCCEEDED, pgq.JobState.FAILED, pgq.JobState.CANCELLED}
    assert expected == TERMINAL_STATES


@pytest.mark.parametrize(
    ("num_jobs", "stopped", "complete"), [(0, 0, False), (3, 2, False), (3, 3, True)]
)
def test_bundle_is_complete(num_jobs: int, stopped: int, complete: bool) -> None:
    now = datetime.now(UTC)
    bundle = pgq.Bundle(BundleId(uuid4()), "b", None, num_jobs, stopped, None, now, now)
    assert bundle.is_complete is complete


@pytest.mark.parametrize(
    "value",
    [
        {"a": [1, 2.5, None, True, "x"]},
        "plain \\u0000 text with a backslash",
        {"k": "\\\\u0000"},
        {"emoji": "\U0001f600"},
    ],
)
def test_storable_json_is_encoded(value: object) -> None:
    assert json.loads(db.dump_json(value)) == value


@pytest.mark.parametrize(
    "value", ["\x00", {"a": "x\x00"}, {"a\x00": 1}, ["\\\x00"], {"a": "\\\\\x00"}]
)
def test_nul_characters_are_refused_before_the_database_sees_them(value: object) -> None:
    with pytest.raises(pgq.InvalidInput, match="NUL"):
        db.dump_json(value, "payload")


def test_every_named_query_binds_a_quoted_schema() -> None:
    names = sql.query_names()
    assert {"enqueue", "enqueue_many", "claim", "heartbeat", "succeed", "rescue"} <= names
    for name in names:
        text = sql.query(name, 'odd"schema').as_string(None)
        assert "{schema}" not in text, name
        if "job" in text:
            # as a quoted identifier, or as a parameter (a catalog lookup: health_table)
            assert '"odd""schema"' in text or "%(schema)s" in text, name


def test_every_percent_sign_in_a_query_is_a_placeholder() -> None:
    # comments are sent too: a stray "%" anywhere makes psycopg refuse the statement
    for name in sql.query_names():
        text = sql.query(name, "pgq").as_string(None)
        assert not re.findall(r"%(?!\(\w+\)s|%)", text), name


def _queries_the_db_layer_names() -> set[str]:
    used: set[str] = set()
    for module in Path(db.__file__).parent.glob("*.py"):
        for call in re.findall(r"statement\(([^)]*)\)", module.read_text(encoding="utf-8")):
            used.update(re.findall(r'"(\w+)"', call))
    return used


def test_every_query_the_db_layer_names_exists() -> None:
    used = _queries_the_db_layer_names()
    assert used, "the db layer names no queries?"
    assert used <= sql.query_names()


def test_every_query_is_used_by_the_db_layer() -> None:
    assert sql.query_names() <= _queries_the_db_layer_names()


# `conn.execute(...).fetch...`: rows read off the connection's own cursor
READ_OFF_EXECUTE = re.compile(r"\bconn\.execute\((?:[^()]|\([^()]*\))*\)\s*\.fetch")


def test_the_db_layer_reads_rows_only_through_its_own_cursors() -> None:
    """db.connection.cursor() gives a cursor our json and jsonb loaders: a caller's connection
    may load them as text (Django does), and a row read any other way would bring that back."""
    for module in Path(db.__file__).parent.glob("*.py"):
        if module.name == "connection.py":
            continue
        text = module.read_text(encoding="utf-8")
        assert ".cursor(" not in text, module.name
        assert not READ_OFF_EXECUTE.search(text), module.name


def test_run_inline_validates_and_calls_the_handler() -> None:
    registry = pgq.Registry()

    @registry.handler("add")
    def add(payload: dict[str, int], job: pgq.Job) -> int:
        assert job.attempt == 1 and job.type == "add"
        return payload["a"] + payload["b"]

    @registry.handler("needs_db")
    def needs_db(payload: dict[str, int], conn: object) -> None:
        return None

    assert testing.run_inline(registry, "add", {"a": 2, "b": 3}) == 5
    with pytest.raises(pgq.InvalidInput, match="add"):
        testing.run_inline(registry, "add", {"a": "two"})
    with pytest.raises(TypeError, match="drain"):
        testing.run_inline(registry, "needs_db", {})
    with pytest.raises(pgq.InvalidInput, match="no handler"):
        testing.run_inline(registry, "missing", {})


def test_new_job_defaults() -> None:
    job = pgq.NewJob("t")
    assert (job.payload, job.priority, job.start_at, job.max_retry_count) == ({}, 0, None, None)
