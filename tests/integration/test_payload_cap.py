"""The payload cap (issue 38 item 5; docs/guide.md#payload-size): a payload over
PGQ_MAX_PAYLOAD_BYTES (1 MiB of JSON text unset) is an InvalidInput naming it and both sizes,
from every public enqueue call, raised before the first statement: the caller's transaction
goes on and nothing is written. A handler's result over the cap fails its job."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import testing
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobState, JsonValue, NewJob
from pgq_supervisor.jsontext import DEFAULT_MAX_PAYLOAD_BYTES, MAX_PAYLOAD_ENV
from pgq_supervisor.periodic import Schedule
from pgq_supervisor.settings import load_settings
from tests.integration.caller_states import SYNC_STATES
from tests.support.db import get

Call = Callable[[Conn], object]
CAP = 1000
# {"s":"xxx..."}: 8 bytes of JSON around the text
OVER: JsonValue = {"s": "x" * (CAP - 7)}  # 1001 bytes of JSON
AT: JsonValue = {"s": "x" * (CAP - 8)}  # 1000 bytes: at the cap, accepted


def _async(conn: Conn) -> object:
    async def run() -> object:
        async with await psycopg.AsyncConnection.connect(conn.info.dsn) as aconn:
            return await pgq.enqueue_async(aconn, "t", OVER)

    return asyncio.run(run())


CALLS: list[tuple[str, Call, str]] = [
    ("enqueue", lambda c: pgq.enqueue(c, "t", OVER), "payload is 1001 bytes"),
    ("enqueue-unique", lambda c: pgq.enqueue(c, "t", OVER, unique_key="k"), "payload is 1001"),
    (
        "enqueue-window",
        lambda c: pgq.enqueue(c, "t", OVER, unique_key="k", unique_for=60),
        "payload is 1001",
    ),
    (
        "enqueue-replace",
        lambda c: pgq.enqueue(c, "t", OVER, unique_key="k", replace=True),
        "payload is 1001",
    ),
    ("enqueue-ordered", lambda c: pgq.enqueue(c, "t", OVER, ordered_key="o"), "payload is 1001"),
    (
        "many-copy",
        lambda c: pgq.enqueue_many(c, [NewJob("t", {}), NewJob("t", OVER)]),
        "payload of jobs[1] is 1001 bytes",
    ),
    (
        "many-insert",
        lambda c: pgq.enqueue_many(c, [NewJob("t", {}, unique_key="a"), NewJob("t", OVER)]),
        "payload of jobs[1] is 1001 bytes",
    ),
    (
        "many-window",
        lambda c: pgq.enqueue_many(c, [NewJob("t", OVER, unique_key="a", unique_for=60)]),
        "payload is 1001 bytes",
    ),
    (
        "many-ordered",
        lambda c: pgq.enqueue_many(c, [NewJob("t", {}), NewJob("t", OVER, ordered_key="o")]),
        "payload of jobs[1] is 1001 bytes",
    ),
    (
        "bundle",
        lambda c: pgq.enqueue_bundle(c, "b", [NewJob("t", {}), NewJob("t", OVER)]),
        "payload of jobs[1] is 1001 bytes",
    ),
    (
        "signal",
        lambda c: pgq.signal(c, pgq.JobId(uuid.uuid4()), "go", OVER),
        "signal payload is 1001 bytes",
    ),
]


@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_PAYLOAD_ENV, str(CAP))


# idle: the call's first statement would open the transaction; in_transaction: inside the
# caller's open one (test_bad_input_caller.py covers every state for the same checks)
@pytest.mark.parametrize("state", ["idle", "in_transaction"])
@pytest.mark.parametrize(("call", "says"), [(c, s) for _, c, s in CALLS], ids=[c[0] for c in CALLS])
@pytest.mark.usefixtures("capped")
def test_a_payload_over_the_cap_is_refused_before_any_statement(
    dsn: str, state: str, call: Call, says: str
) -> None:
    with SYNC_STATES[state](dsn, True) as conn:
        with pytest.raises(pgq.InvalidInput) as info:
            call(conn)
        assert says in str(info.value)
        assert f"over the {CAP}-byte cap ({MAX_PAYLOAD_ENV})" in str(info.value)
        # not aborted: a statement and a good enqueue go on, and commit
        assert conn.execute("SELECT 1").fetchone() == (1,)
        good = pgq.enqueue(conn, "good", AT)
    with psycopg.connect(dsn) as check:
        assert check.execute("SELECT id, type FROM pgq.job").fetchall() == [(good, "good")]
        assert check.execute("SELECT count(*) FROM pgq.job_bundle").fetchone() == (0,)


@pytest.mark.usefixtures("capped")
def test_enqueue_async_is_capped_the_same(conn: Conn) -> None:
    with pytest.raises(pgq.InvalidInput, match=r"payload is 1001 bytes of JSON, over the 1000"):
        _async(conn)
    assert conn.execute("SELECT count(*) FROM pgq.job").fetchone() == (0,)


def test_the_default_cap_is_1_mib(conn: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_PAYLOAD_ENV, raising=False)
    big = "x" * (DEFAULT_MAX_PAYLOAD_BYTES - 2)  # a JSON string: its quotes make 1 MiB
    pgq.enqueue(conn, "t", big)
    with pytest.raises(pgq.InvalidInput) as info:
        pgq.enqueue(conn, "t", big + "x")
    assert str(info.value) == (
        "payload is 1048577 bytes of JSON, over the 1048576-byte cap (PGQ_MAX_PAYLOAD_BYTES)"
    )
    assert conn.execute("SELECT count(*) FROM pgq.job").fetchone() == (1,)


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "1MiB", str(2**40)])
def test_a_bad_cap_is_a_config_error_naming_the_variable(
    conn: Conn, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(MAX_PAYLOAD_ENV, value)
    with pytest.raises(pgq.ConfigError, match=f"invalid setting {MAX_PAYLOAD_ENV}: must be"):
        pgq.enqueue(conn, "t", {})
    assert conn.execute("SELECT count(*) FROM pgq.job").fetchone() == (0,)


def test_the_setting_reads_the_variable_and_checks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES
    monkeypatch.setenv(MAX_PAYLOAD_ENV, "5000")
    assert load_settings().max_payload_bytes == 5000
    assert load_settings(max_payload_bytes="7000").max_payload_bytes == 7000  # a flag wins
    with pytest.raises(pgq.ConfigError, match="invalid setting max_payload_bytes"):
        load_settings(max_payload_bytes="0")


@pytest.mark.usefixtures("capped")
def test_a_schedule_payload_over_the_cap_is_refused_at_declaration() -> None:
    with pytest.raises(pgq.ConfigError, match=r"periodic 'p': payload is 1001 bytes of JSON"):
        Schedule.make("p", type="t", every=timedelta(minutes=1), payload=OVER)


@pytest.mark.usefixtures("capped")
def test_a_result_over_the_cap_fails_its_job_for_good(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("big", max_retry_count=3)
    def big(payload: dict[str, object]) -> JsonValue:
        return OVER

    @registry.handler("fits")
    def fits(payload: dict[str, object]) -> JsonValue:
        return AT

    refused = pgq.enqueue(conn, "big", {})
    kept = pgq.enqueue(conn, "fits", {})
    testing.drain(conn, registry)
    failed = get(conn, refused)
    assert failed.state is JobState.FAILED and failed.result is None
    assert failed.error_msg == (
        "InvalidInput: handler result is 1001 bytes of JSON, over the 1000-byte cap"
        " (PGQ_MAX_PAYLOAD_BYTES)"
    )
    assert failed.current_retry_count == 0  # permanent: the same handler would say the same
    assert get(conn, kept).result == AT
