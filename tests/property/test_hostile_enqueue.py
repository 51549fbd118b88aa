"""The public enqueue calls driven with generated hostile values (issue 38): text with NULs and
lone surrogates, huge and boolean numbers, wrong types, deep and wide JSON. Whatever comes,
the answer is success or a PgqError, the caller's transaction is still usable afterwards, and
an error writes no row."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgq_supervisor as pgq
from pgq_supervisor.jobs import JsonValue

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
