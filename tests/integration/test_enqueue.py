"""Enqueueing: transactional, bulk, notifications, unique keys, producers."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from tests.support.db import Listener, claim_one, count_rows, get, listening

AVAILABLE = "pgq_job_available"


def test_rolled_back_enqueue_leaves_no_job_and_no_notification(conn: Conn, dsn: str) -> None:
    with listening(dsn, AVAILABLE) as listener:
        with conn.transaction(force_rollback=True):
            pgq.enqueue(conn, "email", {"to": "a@example.com"})
            assert count_rows(conn) == 1  # visible inside the transaction
        assert count_rows(conn) == 0
        assert listener.collect()[AVAILABLE] == []


def test_committed_enqueue_leaves_exactly_one_job(conn: Conn, dsn: str) -> None:
    with listening(dsn, AVAILABLE) as listener:
        with conn.transaction():
            job_id = pgq.enqueue(conn, "email", {"to": "a@example.com"}, priority=5, origin="t")
        assert count_rows(conn) == 1
        assert listener.collect()[AVAILABLE] == ["email"]
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.PENDING
    assert rec.payload == {"to": "a@example.com"}
    assert (rec.priority, rec.origin, rec.current_retry_count) == (5, "t", 0)
    assert rec.attempts == []


def test_enqueue_in_callers_open_transaction_waits_for_its_commit(dsn: str, conn: Conn) -> None:
    with psycopg.connect(dsn) as producer:  # not autocommit: the caller owns the transaction
        job_id = pgq.enqueue(producer, "email", {})
        assert count_rows(conn) == 0  # another session sees nothing yet
        producer.commit()
    assert count_rows(conn) == 1
    assert get(conn, job_id).type == "email"


def test_bulk_enqueue_notifies_once_per_type_not_per_row(conn: Conn, dsn: str) -> None:
    jobs = [pgq.NewJob("a" if i % 2 else "b", {"i": i}) for i in range(10_000)]
    with listening(dsn, AVAILABLE) as listener:
        with conn.transaction():
            # Count how often our trigger functions run: PostgreSQL folds identical
            # notifications of one transaction, so only this tells per-row from per-statement.
            conn.execute("SET LOCAL track_functions = 'pl'")
            ids = pgq.enqueue_many(conn, jobs)
            row = conn.execute(
                "SELECT coalesce(sum(calls), 0)::int FROM pg_stat_xact_user_functions"
                " WHERE schemaname = 'pgq'"
            ).fetchone()
        notified = listener.collect()[AVAILABLE]
    assert row is not None and row[0] == 1, f"trigger functions ran {row[0] if row else 0} times"
    assert sorted(notified) == ["a", "b"]
    assert len(ids) == len(set(ids)) == 10_000
    assert count_rows(conn) == 10_000
    stored = conn.execute("SELECT id, payload->>'i' FROM pgq.job").fetchall()
    assert {r[0]: int(r[1]) for r in stored} == {job_id: i for i, job_id in enumerate(ids)}


def test_two_bulk_statements_of_one_type_notify_each(conn: Conn, dsn: str) -> None:
    with listening(dsn, AVAILABLE) as listener:
        pgq.enqueue_many(conn, [pgq.NewJob("a") for _ in range(100)])
        pgq.enqueue_many(conn, [pgq.NewJob("a") for _ in range(100)])
        assert listener.collect()[AVAILABLE] == ["a", "a"]


def test_delayed_jobs_do_not_notify(conn: Conn, dsn: str) -> None:
    later = db.db_now(conn, "pgq") + timedelta(hours=1)
    with listening(dsn, AVAILABLE) as listener:
        pgq.enqueue_many(conn, [pgq.NewJob("a", start_at=later) for _ in range(10)])
        pgq.enqueue(conn, "b", start_at=later)
        assert listener.collect()[AVAILABLE] == []
    assert count_rows(conn) == 11


def test_enqueue_many_of_nothing_writes_nothing(conn: Conn) -> None:
    assert pgq.enqueue_many(conn, []) == []
    assert count_rows(conn) == 0


def test_unique_key_returns_the_unfinished_holder(conn: Conn) -> None:
    first = pgq.enqueue(conn, "sync", {"n": 1}, unique_key="user:1")
    again = pgq.enqueue(conn, "sync", {"n": 2}, unique_key="user:1")
    assert again == first
    assert count_rows(conn) == 1
    assert get(conn, first).payload == {"n": 1}

    # still unfinished while running
    job = claim_one(conn, "sync")
    assert pgq.enqueue(conn, "sync", {"n": 3}, unique_key="user:1") == first
    assert pgq.enqueue_many(conn, [pgq.NewJob("sync", unique_key="user:1")]) == [first]
    assert count_rows(conn) == 1

    assert db.succeed(conn, "pgq", job.lease, [(job.id, None)]) == {job.id}
    fresh = pgq.enqueue(conn, "sync", {"n": 4}, unique_key="user:1")
    assert fresh != first
    assert count_rows(conn) == 2
    assert get(conn, fresh).state is pgq.JobState.PENDING


def test_unique_key_in_bulk_mixes_new_and_existing_in_input_order(conn: Conn) -> None:
    held = pgq.enqueue(conn, "sync", unique_key="k2")
    ids = pgq.enqueue_many(
        conn,
        [
            pgq.NewJob("sync", unique_key="k1"),
            pgq.NewJob("sync", unique_key="k2"),
            pgq.NewJob("sync"),
        ],
    )
    assert ids[1] == held
    assert len(set(ids)) == 3
    assert count_rows(conn) == 3
    assert get(conn, ids[0]).unique_key == "k1"


def test_a_bulk_enqueue_whose_key_lookup_fails_leaves_nothing_behind(
    conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder of a taken key can finish between the insert and the look-up of its id
    ("conflicted but its job is gone"): on an autocommit connection the batch's other rows must
    not stay committed behind the error (a retry would enqueue them twice)."""
    pgq.enqueue(conn, "sync", unique_key="k2")

    def holder_gone(*args: object) -> list[pgq.JobId]:
        raise pgq.InvalidInput("unique_key 'k2' conflicted but its job is gone; retry")

    monkeypatch.setattr("pgq_supervisor.db.enqueueing._existing_for_keys", holder_gone)
    batch = [pgq.NewJob("sync", unique_key="k1"), pgq.NewJob("sync", unique_key="k2")]
    with pytest.raises(pgq.InvalidInput, match="gone"):
        pgq.enqueue_many(conn, [*batch, pgq.NewJob("sync")])
    assert count_rows(conn) == 1  # only the holder


def test_unique_key_is_free_again_after_cancel(conn: Conn) -> None:
    first = pgq.enqueue(conn, "sync", unique_key="k")
    pgq.cancel_job(conn, first)
    second = pgq.enqueue(conn, "sync", unique_key="k")
    assert second != first
    assert count_rows(conn) == 2


def test_enqueue_async_commits_with_the_callers_transaction(dsn: str, conn: Conn) -> None:
    async def scenario() -> tuple[pgq.JobId, pgq.JobId]:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            async with aconn.transaction(force_rollback=True):
                await pgq.enqueue_async(aconn, "email", {"n": 1})
            async with aconn.transaction():
                kept = await pgq.enqueue_async(aconn, "email", {"n": 2}, unique_key="u")
            async with aconn.transaction():
                same = await pgq.enqueue_async(aconn, "email", {"n": 3}, unique_key="u")
            return kept, same

    kept, same = asyncio.run(scenario())
    assert kept == same
    assert count_rows(conn) == 1
    assert get(conn, kept).payload == {"n": 2}


def test_producer_enqueues_through_a_pool(dsn: str, conn: Conn) -> None:
    with (
        listening(dsn, AVAILABLE) as listener,
        ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool,
    ):
        producer = pgq.Producer(pool)
        job_id = producer.enqueue("email", {"n": 1}, priority=3)
        ids = producer.enqueue_many([pgq.NewJob("email"), pgq.NewJob("sms")])
        assert sorted(_payloads(listener)) == ["email", "email", "sms"]
    assert count_rows(conn) == 3
    assert get(conn, job_id).priority == 3
    assert {get(conn, i).type for i in ids} == {"email", "sms"}


def test_a_producer_with_a_registry_refuses_a_type_it_does_not_know(dsn: str, conn: Conn) -> None:
    """Issue 36, opt-in: a misspelt type fails at once instead of waiting forever."""
    registry = pgq.Registry()

    @registry.handler("greet")
    def greet(payload: dict[str, str]) -> None:
        return None

    with ConnectionPool(dsn, min_size=1, max_size=1, open=True) as pool:
        producer = pgq.Producer(pool, registry=registry)
        unknown = r"^no handler for job type 'gret' \(did you mean 'greet'\?\)$"
        with pytest.raises(pgq.InvalidInput, match=unknown):
            producer.enqueue("gret", {"name": "Ada"})
        with pytest.raises(pgq.InvalidInput, match=unknown):
            producer.enqueue_many([pgq.NewJob("greet"), pgq.NewJob("gret")])
        with pytest.raises(pgq.InvalidInput, match=r"^payload for 'greet' is invalid: name: "):
            producer.enqueue("greet", {"name": 1})
        with pytest.raises(pgq.InvalidInput, match=r"^invalid job type "):
            producer.enqueue("", {})
        assert count_rows(conn) == 0  # nothing written, not even the batch's known first job
        job_id = producer.enqueue("greet", {"name": "Ada"})
        assert get(conn, job_id).type == "greet"
        # without a registry, as before: any type goes in
        assert get(conn, pgq.Producer(pool).enqueue("gret")).type == "gret"

    async def refused_async() -> None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as apool:
            with pytest.raises(pgq.InvalidInput, match=unknown):
                await pgq.Producer(apool, registry=registry).enqueue_async("gret")

    asyncio.run(refused_async())
    assert count_rows(conn) == 2


def _payloads(listener: Listener) -> list[str]:
    return listener.collect()[AVAILABLE]


# COPY's text format escapes backslash, tab, newline and CR, and spells NULL \N: each appears
# here, where a formatting slip would store something else or shift a column.
AWKWARD = [
    pgq.NewJob("plain"),
    pgq.NewJob(
        "back\\slash",
        {"s": 'a\\b\t"c"\n\r\\N', "u": "é ✓ \U0001f600", "n": [1.5, None, True]},
        priority=-7,
        max_retry_count=0,
        origin="tab\there\\N\nnew\rline",
        timeout=0.25,
    ),
    pgq.NewJob("\\N", [], priority=2**31 - 1, origin="", timeout=3),
]


def test_bulk_copy_stores_every_field_as_given_in_input_order(conn: Conn) -> None:
    bundle = pgq.enqueue_bundle(conn, "awkward", AWKWARD)
    ids = pgq.enqueue_many(conn, AWKWARD * 80)  # 240 jobs: several chunks of the COPY
    for job_id, job in zip(ids, AWKWARD * 80, strict=True):
        got = get(conn, job_id)
        assert (got.type, got.payload, got.priority, got.max_retry_count) == (
            job.type, job.payload, job.priority, job.max_retry_count,
        )  # fmt: skip
        assert (got.origin, got.timeout, got.bundle_id) == (job.origin, job.timeout, None)
    in_bundle = conn.execute("SELECT count(*) FROM pgq.job WHERE bundle_id = %s", (bundle.id,))
    assert in_bundle.fetchone() == (len(AWKWARD),)
    claimed = [claim_one(conn, "plain") for _ in range(81)]  # the bundle's first
    assert [c.id for c in claimed[1:]] == ids[::3], "a batch is claimed in its order"


def test_a_bad_job_late_in_a_bulk_batch_writes_nothing(conn: Conn) -> None:
    with conn.transaction():
        bad = pgq.NewJob("t", {"x": object()})  # type: ignore[dict-item]
        batch = [pgq.NewJob("t")] * 999 + [bad]
        with pytest.raises(pgq.InvalidInput, match="payload"):
            pgq.enqueue_many(conn, batch)
        late = pgq.NewJob("t", priority=1.5)  # type: ignore[arg-type]
        with pytest.raises(pgq.InvalidInput, match="priority"):
            pgq.enqueue_many(conn, [pgq.NewJob("t")] * 500 + [late])
        assert count_rows(conn) == 0
        pgq.enqueue_many(conn, [pgq.NewJob("t")])  # the transaction is still usable
    assert count_rows(conn) == 1


def test_ids_are_time_ordered_wherever_they_are_made(conn: Conn) -> None:
    """Version-7 ids (schema/0012, db.params.time_ordered): made by enqueue, by both
    enqueue_many paths and by the database's default, each later one sorts later."""
    made = [pgq.enqueue(conn, "t", {})]
    made += pgq.enqueue_many(conn, [pgq.NewJob("t", {})] * 3)  # COPY
    made += pgq.enqueue_many(conn, [pgq.NewJob("t", {}, unique_key=f"k{i}") for i in range(3)])
    row = conn.execute(
        "INSERT INTO pgq.job (type, payload) VALUES ('t', '{}') RETURNING id"
    ).fetchone()
    assert row is not None
    made.append(row[0])
    made.append(pgq.enqueue(conn, "t", {}))
    assert [u.version for u in made] == [7] * len(made)
    # later ones sort later: by their millisecond (within one, the random tail decides), and
    # within one batch by the whole id (FIFO by id where created_at ties)
    assert [u.int >> 80 for u in made] == sorted(u.int >> 80 for u in made)
    assert made[1:4] == sorted(made[1:4]) and made[4:7] == sorted(made[4:7])
    # the first 48 bits are the time in milliseconds: within the test's run
    now_ms = conn.execute("SELECT extract(epoch FROM clock_timestamp()) * 1000").fetchone()
    assert now_ms is not None
    assert all(abs((u.int >> 80) - float(now_ms[0])) < 60_000 for u in made)
