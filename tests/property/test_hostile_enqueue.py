"""The public enqueue calls driven with generated hostile values (issue 38): text with NULs and
lone surrogates, huge and boolean numbers, wrong types, deep and wide JSON, payloads around
the payload cap; enqueue one job at a time, enqueue_many and enqueue_bundle in batches.
Whatever comes, the answer is success or a PgqError, the caller's transaction is still usable
afterwards, and an error writes no row (and a success no payload over the cap)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, date, datetime

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import pgq_supervisor as pgq
from pgq_supervisor.jobs import JsonValue
from pgq_supervisor.jsontext import MAX_PAYLOAD_ENV, dump_json

# text from the whole code space: NUL, controls, lone surrogates, astral characters
CHARS = st.one_of(
    st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=[]),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=[]),
    st.sampled_from(["\x00", " ", "/", "%", "\x85"]),
    st.characters(min_codepoint=0x61, max_codepoint=0x7A),
)
TEXT = st.text(CHARS, max_size=40)
HUGE_TEXT = st.integers(1000, 3000).map(lambda n: "k" * n)
NUMBERS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
WRONG = st.one_of(st.none(), st.binary(max_size=5), st.just(date(2024, 1, 1)), st.just([1]))
ANY_SCALAR = st.one_of(TEXT, NUMBERS, WRONG)
JSON: st.SearchStrategy[JsonValue] = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=20,
)


def _deep(depth: int) -> JsonValue:
    value: JsonValue = {}
    for _ in range(depth):
        value = [value]
    return value


PAYLOADS = st.one_of(
    JSON,
    st.integers(900, 1500).map(_deep),  # around Python's recursion limit
    st.integers(1, 3000).map(lambda n: {str(i): i for i in range(n)}),  # wide
)
OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "priority": st.one_of(NUMBERS, ANY_SCALAR),
        "max_retry_count": st.one_of(NUMBERS, ANY_SCALAR),
        "unique_key": st.one_of(TEXT, HUGE_TEXT, ANY_SCALAR),
        "origin": st.one_of(TEXT, ANY_SCALAR),
        "timeout": st.one_of(NUMBERS, ANY_SCALAR),
        "start_at": st.one_of(
            st.just(datetime(2024, 1, 1, tzinfo=UTC)), st.just(datetime(2024, 1, 1)), ANY_SCALAR
        ),
        "concurrency_key": st.one_of(TEXT, ANY_SCALAR),
        "tenant": st.one_of(TEXT, ANY_SCALAR),
    },
)


@pytest.fixture(scope="module")
def caller(module_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(module_dsn) as conn:
        yield conn


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(type_=st.one_of(TEXT, st.just("t"), ANY_SCALAR), payload=PAYLOADS, options=OPTIONS)
def test_hostile_enqueue_is_success_or_a_pgq_error_and_the_transaction_goes_on(
    caller: psycopg.Connection[tuple[object, ...]],
    type_: object,
    payload: JsonValue,
    options: dict[str, object],
) -> None:
    conn = caller
    try:
        conn.execute("SELECT 1")  # the caller's transaction is open before the call
        before = conn.execute("SELECT count(*) FROM pgq.job").fetchone()
        try:
            pgq.enqueue(conn, type_, payload, **options)  # type: ignore[arg-type]
            failed = False
        except pgq.PgqError:
            failed = True
        # usable afterwards, whatever happened
        after = conn.execute("SELECT count(*) FROM pgq.job").fetchone()
        assert before is not None and after is not None
        if failed:
            assert after == before, "an error wrote a row"
        else:
            assert after[0] == int(str(before[0])) + 1  # each example starts empty: no key held
    finally:
        conn.rollback()


def _mostly(valid: object, hostile: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """`valid` most of the time: a batch holds up to four jobs, and one bad value in any of
    them fails the whole, so enough batches must be good for the writes to be checked."""
    return st.tuples(st.integers(0, 9), hostile).map(lambda d: d[1] if d[0] >= 8 else valid)


# the option mixes a batch may hold, hostile values in each (windows, ordered keys, tenants)
BATCH_OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "priority": _mostly(1, st.one_of(NUMBERS, ANY_SCALAR)),
        "unique_for": _mostly(None, st.one_of(NUMBERS, ANY_SCALAR)),
        "ordered_key": _mostly(None, st.one_of(TEXT, ANY_SCALAR)),
        "tenant": _mostly("a", st.one_of(TEXT, ANY_SCALAR)),
        "timeout": _mostly(5.0, st.one_of(NUMBERS, ANY_SCALAR)),
    },
)
CAP = 2000  # the payload cap for the batches: payloads around it, one in ten just over
SIZED = st.integers(CAP - 150, CAP + 15).map(lambda n: {"s": "x" * (n - 8)})
BATCH_PAYLOADS = st.one_of(SIZED, SIZED, JSON)
JOBS = st.lists(
    st.builds(
        lambda type_, payload, options: pgq.NewJob(type_, payload, **options),
        _mostly("t", st.one_of(TEXT, ANY_SCALAR)),
        BATCH_PAYLOADS,
        BATCH_OPTIONS,
    ),
    min_size=1,
    max_size=4,
)


@pytest.fixture(scope="module")
def capped() -> Iterator[None]:
    """PGQ_MAX_PAYLOAD_BYTES = CAP for this module's batches (hypothesis runs many examples
    per function-scoped fixture, so not monkeypatch)."""
    before = os.environ.get(MAX_PAYLOAD_ENV)
    os.environ[MAX_PAYLOAD_ENV] = str(CAP)
    yield
    if before is None:
        del os.environ[MAX_PAYLOAD_ENV]
    else:
        os.environ[MAX_PAYLOAD_ENV] = before


def _counts(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[object, ...]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgq.job), (SELECT count(*) FROM pgq.job_bundle)"
    ).fetchone()
    assert row is not None
    return row


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(jobs=JOBS, bundle=st.booleans())
@pytest.mark.usefixtures("capped")
def test_hostile_batches_are_success_or_a_pgq_error_and_the_transaction_goes_on(
    caller: psycopg.Connection[tuple[object, ...]], jobs: list[pgq.NewJob], bundle: bool
) -> None:
    conn = caller
    try:
        before = _counts(conn)  # the caller's transaction is open before the call
        try:
            if bundle:
                pgq.enqueue_bundle(conn, "b", jobs)
            else:
                pgq.enqueue_many(conn, jobs)
            failed = False
        except pgq.PgqError:
            failed = True
        event("written" if not failed else "error")
        after = _counts(conn)  # usable afterwards, whatever happened
        if failed:
            assert after == before, "an error wrote a row"
        else:
            assert all(len(dump_json(j.payload)) <= CAP for j in jobs), "over the cap, written"
            # no unique keys here: every job is a row (and the bundle one)
            assert after == (int(str(before[0])) + len(jobs), int(str(before[1])) + bundle)
    finally:
        conn.rollback()
