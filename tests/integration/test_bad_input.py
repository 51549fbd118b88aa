"""Bad input gets one clear error naming what was wrong, and nothing is written."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable
from datetime import datetime

import psycopg
import pydantic
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import testing
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import BundleId, JobId, JobState, JsonValue
from tests.support.db import count_rows, finished, get


def _nothing_written(conn: Conn) -> None:
    assert (count_rows(conn), count_rows(conn, "job_bundle")) == (0, 0)


BAD_TYPES = [
    pytest.param("", id="empty"),
    pytest.param("x" * 101, id="101-chars"),
    pytest.param("has space", id="whitespace"),
    pytest.param("nul\x00", id="nul"),
]


@pytest.mark.parametrize("type_", BAD_TYPES)
def test_bad_type_is_rejected_everywhere(conn: Conn, type_: str) -> None:
    with pytest.raises(pgq.InvalidInput, match="invalid job type") as info:
        pgq.enqueue(conn, type_, {})
    assert "1 to 100 characters" in str(info.value)
    with pytest.raises(pgq.InvalidInput, match="invalid job type"):
        pgq.enqueue_many(conn, [pgq.NewJob("fine"), pgq.NewJob(type_), pgq.NewJob("fine")])
    with pytest.raises(pgq.InvalidInput, match="invalid job type"):
        pgq.enqueue_bundle(conn, type_, [pgq.NewJob("fine")])
    with pytest.raises(pgq.InvalidInput, match="invalid job type"):
        pgq.enqueue_bundle(conn, "fine", [pgq.NewJob("fine")], on_complete=type_)
    _nothing_written(conn)


def test_a_type_of_exactly_100_characters_is_fine(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "x" * 100, {})
    assert get(conn, job_id).type == "x" * 100


def nested(depth: int) -> JsonValue:
    """[[[...{}...]]], `depth` lists deep (built without recursion)."""
    value: JsonValue = {}
    for _ in range(depth):
        value = [value]
    return value


NOT_JSON: list[object] = [
    pytest.param({1, 2}, id="set"),
    pytest.param(object(), id="object"),
    pytest.param({"when": datetime(2024, 1, 1)}, id="datetime"),
    pytest.param({"x": float("nan")}, id="nan"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param({"text": "a\x00b"}, id="nul-char"),
    pytest.param({"k\x00": 1}, id="nul-in-key"),
    # jsonb takes no lone surrogate: the server's error would fail a whole batch
    pytest.param({"text": "\ud800"}, id="lone-high-surrogate"),
    pytest.param({"text": "a\udfff"}, id="lone-low-surrogate"),
    pytest.param({"\udc00": 1}, id="surrogate-in-key"),
    pytest.param({"text": "\udc00\ud800"}, id="surrogates-the-wrong-way-round"),
    pytest.param({"deep": nested(60_000)}, id="60000-deep"),
]


@pytest.mark.parametrize("payload", NOT_JSON)
def test_payload_that_cannot_be_stored_as_json_is_rejected(conn: Conn, payload: object) -> None:
    bad: JsonValue = payload  # type: ignore[assignment]
    with pytest.raises(pgq.InvalidInput, match="payload"):
        pgq.enqueue(conn, "t", bad)
    with pytest.raises(pgq.InvalidInput, match="payload"):
        pgq.enqueue_many(conn, [pgq.NewJob("t", {}), pgq.NewJob("t", bad)])
    with pytest.raises(pgq.InvalidInput, match="payload"):
        pgq.enqueue_bundle(conn, "b", [pgq.NewJob("t", {}), pgq.NewJob("t", bad)])
    _nothing_written(conn)


def test_backslashes_that_only_look_like_a_nul_escape_are_fine(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t", {"path": "C:\\u0000dir", "raw": "\\\\u0000"})
    assert get(conn, job_id).payload == {"path": "C:\\u0000dir", "raw": "\\\\u0000"}


def test_backslashes_that_only_look_like_a_surrogate_escape_are_fine(conn: Conn) -> None:
    fine: JsonValue = {"path": "C:\\ud800", "emoji": "\U0001f600", "deep": nested(200)}
    job_id = pgq.enqueue(conn, "t", fine)
    assert get(conn, job_id).payload == fine


@pytest.mark.parametrize(
    ("options", "named"),
    [
        pytest.param({"priority": 2**31}, "priority", id="priority-too-big"),
        pytest.param({"priority": -(2**31) - 1}, "priority", id="priority-too-small"),
        pytest.param({"max_retry_count": -1}, "max_retry_count", id="negative-retries"),
        pytest.param({"max_retry_count": 2**31}, "max_retry_count", id="retries-too-big"),
        pytest.param({"timeout": 0.0}, "timeout", id="zero-timeout"),
        pytest.param({"start_at": datetime(2030, 1, 1)}, "start_at", id="naive-start-at"),
    ],
)
def test_bad_options_are_rejected_naming_the_option(
    conn: Conn, options: dict[str, int | float | datetime], named: str
) -> None:
    job = pgq.NewJob("t", {}, **options)  # type: ignore[arg-type]
    with pytest.raises(pgq.InvalidInput, match=named):
        pgq.enqueue_many(conn, [job])
    with pytest.raises(pgq.InvalidInput, match=named):
        pgq.enqueue(conn, "t", {}, **options)  # type: ignore[arg-type]
    _nothing_written(conn)


def test_a_rejected_enqueue_leaves_the_callers_transaction_usable(conn: Conn) -> None:
    with conn.transaction():
        with pytest.raises(pgq.InvalidInput):
            pgq.enqueue(conn, "", {})
        with pytest.raises(pgq.InvalidInput):
            pgq.enqueue(conn, "t", {"x": "\x00"})
        with pytest.raises(pgq.InvalidInput):
            pgq.enqueue(conn, "t", {}, priority=2**40)
        kept = pgq.enqueue(conn, "t", {"ok": True})
    assert count_rows(conn) == 1
    assert get(conn, kept).payload == {"ok": True}


def test_bad_batches_and_bundles_are_rejected_whole(conn: Conn) -> None:
    with pytest.raises(pgq.InvalidInput, match="appears twice"):
        pgq.enqueue_many(conn, [pgq.NewJob("t", unique_key="k"), pgq.NewJob("t", unique_key="k")])
    with pytest.raises(pgq.InvalidInput, match="at least one job"):
        pgq.enqueue_bundle(conn, "b", [])
    with pytest.raises(pgq.InvalidInput, match="unique_key"):
        pgq.enqueue_bundle(conn, "b", [pgq.NewJob("t", unique_key="k")])
    _nothing_written(conn)


def test_unknown_ids_raise_job_not_found_naming_the_id(conn: Conn) -> None:
    pgq.enqueue(conn, "t", {})
    before = conn.execute("SELECT * FROM pgq.job").fetchall()
    missing = JobId(uuid.uuid4())
    with pytest.raises(pgq.JobNotFound, match=str(missing)):
        pgq.get_job(conn, missing)
    with pytest.raises(pgq.JobNotFound, match=str(missing)):
        pgq.cancel_job(conn, missing)
    with pytest.raises(pgq.JobNotFound, match=str(missing)):
        pgq.reset_job(conn, missing)
    with pytest.raises(pgq.JobNotFound, match=str(missing)):
        pgq.reset_job(conn, missing, force=True)
    bundle = BundleId(uuid.uuid4())
    with pytest.raises(pgq.JobNotFound, match=f"no bundle with id {bundle}"):
        pgq.get_bundle(conn, bundle)
    assert conn.execute("SELECT * FROM pgq.job").fetchall() == before


def test_every_call_that_takes_a_job_id_takes_its_string_form(dsn: str, conn: Conn) -> None:
    """As the CLI prints an id and a URL carries it (issue 36: wait said JobNotFound)."""
    done = finished(conn, "t", JobState.SUCCEEDED)
    text = str(done)
    assert pgq.get_job(conn, text).id == done
    assert pgq.get_job(conn, text.upper()).id == done
    assert pgq.wait(conn, text, timeout=0).id == done
    assert [r.id for r in pgq.wait_many(conn, [text, done], timeout=0)] == [done, done]

    async def waits_async() -> list[JobId]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            one = await pgq.wait_async(aconn, text, timeout=0)
            many = await pgq.wait_many_async(aconn, [text], timeout=0)
            return [one.id, *(r.id for r in many)]

    assert asyncio.run(waits_async()) == [done, done]
    pgq.reset_job(conn, text)
    assert pgq.get_job(conn, done).state is JobState.PENDING
    assert pgq.cancel_job(conn, text) is JobState.PENDING
    assert pgq.signal(conn, text, "go") is True
    later = pgq.enqueue(conn, "t", depends_on=[text])
    assert get(conn, later).depends_on == [done]
    bundle = pgq.enqueue_bundle(conn, "b", [pgq.NewJob("t")])
    assert pgq.get_bundle(conn, str(bundle.id)).id == bundle.id


BAD_IDS = [
    pytest.param("nope", id="word"),
    pytest.param("", id="empty"),
    pytest.param(12345, id="int"),
    pytest.param(None, id="none"),
    pytest.param(str(uuid.uuid4())[:-1], id="one-digit-short"),
]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_bad_job_id_is_invalid_input_naming_the_argument(
    dsn: str, conn: Conn, bad: object
) -> None:
    known = pgq.enqueue(conn, "t", {})
    before = conn.execute("SELECT * FROM pgq.job").fetchall()
    calls: list[tuple[str, Callable[[], object]]] = [
        ("id", lambda: pgq.get_job(conn, bad)),  # type: ignore[arg-type]
        ("id", lambda: pgq.cancel_job(conn, bad)),  # type: ignore[arg-type]
        ("id", lambda: pgq.reset_job(conn, bad, force=True)),  # type: ignore[arg-type]
        ("id", lambda: pgq.get_bundle(conn, bad)),  # type: ignore[arg-type]
        ("job_id", lambda: pgq.wait(conn, bad, timeout=0)),  # type: ignore[arg-type]
        ("ids[1]", lambda: pgq.wait_many(conn, [known, bad], timeout=0)),  # type: ignore[list-item]
        ("job_id", lambda: pgq.signal(conn, bad, "go")),  # type: ignore[arg-type]
        ("depends_on[1]", lambda: pgq.enqueue(conn, "t", depends_on=[known, bad])),  # type: ignore[list-item]
    ]
    for argument, call in calls:
        with pytest.raises(pgq.InvalidInput, match=rf"^{re.escape(argument)}: .* is not a"):
            call()

    async def waits_async() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            with pytest.raises(pgq.InvalidInput, match=r"^job_id: "):
                await pgq.wait_async(aconn, bad, timeout=0)  # type: ignore[arg-type]
            with pytest.raises(pgq.InvalidInput, match=r"^ids\[0\]: "):
                await pgq.wait_many_async(aconn, [bad], timeout=0)  # type: ignore[list-item]

    asyncio.run(waits_async())
    with pytest.raises(pgq.InvalidInput, match="not a string"):
        pgq.wait_many(conn, str(known), timeout=0)
    assert conn.execute("SELECT * FROM pgq.job").fetchall() == before


def test_purge_options_are_checked(conn: Conn) -> None:
    for bad in (-1, float("nan"), float("inf"), 1e12):
        with pytest.raises(pgq.InvalidInput, match="older_than"):
            pgq.delete_finished(conn, older_than=bad)
    with pytest.raises(pgq.InvalidInput, match="only finished jobs"):
        pgq.delete_finished(conn, older_than=0, states=[pgq.JobState.RUNNING])


class Echo(pydantic.BaseModel):
    echo: str


class Invoice(pydantic.BaseModel):
    customer: str
    amount_cents: int


def test_payload_failing_its_model_at_run_time_fails_the_job_naming_the_field(
    conn: Conn,
) -> None:
    registry = pgq.Registry()

    @registry.handler("invoice", max_retry_count=4)
    def invoice(payload: Invoice) -> None:
        raise AssertionError("must not run with a bad payload")

    job_id = pgq.enqueue(conn, "invoice", {"customer": "acme"})
    assert testing.drain(conn, registry).failed == 1
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert rec.current_retry_count == 0
    assert rec.error_msg is not None
    assert "amount_cents" in rec.error_msg and "invoice" in rec.error_msg


@pytest.mark.parametrize("as_model", [False, True], ids=["a str", "a pydantic model"])
def test_a_result_that_cannot_be_stored_fails_only_its_own_job(conn: Conn, as_model: bool) -> None:
    registry = pgq.Registry()

    @registry.handler("echo")
    def echo(payload: dict[str, str]) -> dict[str, str]:
        return {"echo": payload["s"]}

    @registry.handler("nul", max_retry_count=3)
    def nul(payload: dict[str, str]) -> str | Echo:
        # fine in Python, but jsonb cannot hold a NUL (a model's result is checked too)
        return Echo(echo="a\x00b") if as_model else "a\x00b"

    good = pgq.enqueue_many(conn, [pgq.NewJob("echo", {"s": str(i)}) for i in range(3)])
    nul_job = pgq.enqueue(conn, "nul", {})
    # one claim batch: the bad result must not sink the other jobs' completion
    result = testing.drain(conn, registry, batch=10)
    assert sorted(o.kind for o in result.outcomes) == [
        "failed",
        "succeeded",
        "succeeded",
        "succeeded",
    ]
    for i, job_id in enumerate(good):
        assert get(conn, job_id).result == {"echo": str(i)}
    rec = get(conn, nul_job)
    assert rec.state is pgq.JobState.FAILED
    assert rec.current_retry_count == 0  # storing it again would fail again: no retry
    assert rec.error_msg is not None and "NUL" in rec.error_msg
