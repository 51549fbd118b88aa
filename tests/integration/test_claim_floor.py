"""Claim floors (schema/0022, issue 23 item 2): while a snapshot holds vacuum's horizon back,
claims start past the entries of the jobs claimed since, and no ready job is skipped for it:
jobs committed late, made ready by a dependency or raised by aging are claimed all the same.
Reads are counted as heap pages visited (pg_stat_get_xact_blocks_fetched), never timed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.supervisor.maintenance.floors import HELD_AFTER, ClaimFloors
from tests.support.db import SCHEMA, claim

CLAIMED = 10_000  # jobs claimed behind the held snapshot: the dead prefix


@pytest.fixture
def held(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A REPEATABLE READ transaction that read the job table and stays open."""
    with psycopg.connect(dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgq.job").fetchone()
        yield holder
        holder.rollback()


def _floors(conn: Conn, types: list[str], *, full: bool = False) -> None:
    """A floor for the types: the first call makes it empty, the second walks."""
    db.refresh_floors(conn, SCHEMA, types, full=full)
    db.refresh_floors(conn, SCHEMA, types, full=True)


def _fetched(conn: Conn, types: list[str], limit: int) -> tuple[int, int]:
    """(jobs picked, heap pages visited) by one claim_pick, rolled back."""
    with conn.transaction(force_rollback=True):
        before = _blocks_fetched(conn)
        row = conn.execute(
            "SELECT cardinality(pgq.claim_pick(%s::text[], %s))", (types, limit)
        ).fetchone()
        after = _blocks_fetched(conn)
    assert row is not None
    return int(str(row[0])), after - before


def _blocks_fetched(conn: Conn) -> int:
    row = conn.execute("SELECT pg_stat_get_xact_blocks_fetched('pgq.job'::regclass)").fetchone()
    assert row is not None
    return int(str(row[0]))


def _dead_prefix(conn: Conn, type_: str, priority: int = 0) -> None:
    """CLAIMED jobs of `priority`, enqueued and claimed (highest priority first)."""
    conn.execute(
        "INSERT INTO pgq.job (type, payload, priority)"
        " SELECT %s, '{}', %s FROM generate_series(1, %s)",
        (type_, priority, CLAIMED),
    )
    n = 0
    while n < CLAIMED:
        batch = claim(conn, [type_], limit=min(500, CLAIMED - n))
        assert batch and all(j.priority == priority for j in batch)
        n += len(batch)


def test_a_claim_with_a_floor_reads_past_the_dead_prefix(
    conn: Conn, held: psycopg.Connection[tuple[object, ...]]
) -> None:
    _dead_prefix(conn, "a")
    pgq.enqueue_many(conn, [pgq.NewJob("a", {"n": i}) for i in range(5)], schema=SCHEMA)
    picked, plain = _fetched(conn, ["a"], 5)
    # each claimed job's entry followed to its page: every page the dead prefix fills
    assert picked == 5 and plain >= CLAIMED // 100, plain
    _floors(conn, ["a"])
    picked, floored = _fetched(conn, ["a"], 5)
    assert picked == 5 and floored <= 10, (floored, plain)


def test_the_walk_records_each_level_and_the_claim_keeps_claim_order(
    conn: Conn, held: psycopg.Connection[tuple[object, ...]]
) -> None:
    _dead_prefix(conn, "a")
    low = pgq.enqueue_many(conn, [pgq.NewJob("a", {})] * 3, schema=SCHEMA)
    high = pgq.enqueue_many(conn, [pgq.NewJob("a", {}, priority=5)] * 2, schema=SCHEMA)
    _floors(conn, ["a"])
    row = conn.execute("SELECT levels, cardinality(ats) FROM pgq.claim_floor WHERE type = 'a'")
    assert row.fetchone() == ([5, 0], 2)
    # a level that had no ready job at the walk: found all the same, in its place
    mid = pgq.enqueue(conn, "a", {}, priority=3, schema=SCHEMA)
    assert [j.id for j in claim(conn, ["a"], limit=10)] == [*high, mid, *low]


def test_a_walk_reads_a_few_index_pages_when_the_queue_is_empty(
    conn: Conn, held: psycopg.Connection[tuple[object, ...]]
) -> None:
    """The default level is always listed, so the walk of a type with nothing ready (another
    type's claimed jobs in the index, or its own) starts at its floor instead of reading every
    entry of the level."""
    _dead_prefix(conn, "a")
    _floors(conn, ["a", "b"])
    conn.execute("UPDATE pgq.claim_floor SET walked_at = '-infinity'")  # due again
    with conn.transaction(force_rollback=True):
        before = _index_blocks(conn)
        assert db.refresh_floors(conn, SCHEMA, ["a", "b"], full=False) == 2
        read = _index_blocks(conn) - before
    assert read <= 40, read  # 124 when the default level is not kept (a range over it)


def _index_blocks(conn: Conn) -> int:
    row = conn.execute(
        "SELECT pg_stat_get_xact_blocks_fetched('pgq.job_claim_idx'::regclass)"
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def test_a_job_committed_after_the_walk_by_a_transaction_open_before_it_is_claimed(
    conn: Conn, dsn: str, held: psycopg.Connection[tuple[object, ...]]
) -> None:
    _dead_prefix(conn, "a")
    with psycopg.connect(dsn) as late:
        late_id = pgq.enqueue(late, "a", {}, schema=SCHEMA)  # created now, committed later
        pgq.enqueue_many(conn, [pgq.NewJob("a", {}) for _ in range(3)], schema=SCHEMA)
        _floors(conn, ["a"])
        late.commit()
    claimed = [j.id for j in claim(conn, ["a"], limit=10)]
    assert late_id in claimed and len(claimed) == 4


def test_a_job_whose_dependency_ends_is_claimed_past_the_floor(
    conn: Conn, held: psycopg.Connection[tuple[object, ...]]
) -> None:
    first = pgq.enqueue(conn, "dep", {}, schema=SCHEMA)
    dependent = pgq.enqueue(conn, "a", {}, depends_on=[first], schema=SCHEMA)  # oldest of "a"
    _dead_prefix(conn, "a")
    _floors(conn, ["a", "dep"])
    [job] = claim(conn, ["dep"])
    db.succeed(conn, SCHEMA, job.lease, [(job.id, None)])
    assert [j.id for j in claim(conn, ["a"], limit=10)] == [dependent]


def test_a_job_raised_by_aging_is_claimed_past_the_floor(
    conn: Conn, held: psycopg.Connection[tuple[object, ...]]
) -> None:
    old = pgq.enqueue(conn, "a", {}, schema=SCHEMA)
    conn.execute("UPDATE pgq.job SET updated_at = now() - interval '1 hour' WHERE id = %s", (old,))
    _dead_prefix(conn, "a", priority=1)
    newer = pgq.enqueue(conn, "a", {}, priority=1, schema=SCHEMA)
    _floors(conn, ["a"])  # level 1 from `newer`, level 0 from `old`
    assert db.age_priorities(conn, SCHEMA, "a", every=60, max_priority=5, limit=10) == 1
    # `old` is at level 1 now, created before that level's floor: claimed all the same, first
    assert [j.id for j in claim(conn, ["a"], limit=10)] == [old, newer]


def test_a_debounce_that_moves_a_job_start_back_is_claimed_past_the_floor(
    conn: Conn, held: psycopg.Connection[tuple[object, ...]]
) -> None:
    now = db.db_now(conn, SCHEMA)
    later = pgq.enqueue(conn, "a", {}, unique_key="k", start_at=now + timedelta(hours=1))
    _dead_prefix(conn, "a")
    _floors(conn, ["a"])
    again = pgq.enqueue(conn, "a", {"v": 2}, unique_key="k", replace=True, start_at=now)
    assert again == later  # the pending holder took the new start_at: before its creation
    assert [j.id for j in claim(conn, ["a"], limit=10)] == [later]


def test_types_without_a_floor_are_walked_from_the_start(
    conn: Conn, held: psycopg.Connection[tuple[object, ...]]
) -> None:
    _dead_prefix(conn, "a")
    b = pgq.enqueue(conn, "b", {}, schema=SCHEMA)
    a = pgq.enqueue(conn, "a", {}, schema=SCHEMA)
    _floors(conn, ["a"])  # b has none: a claim of both takes the plain walk
    assert {j.id for j in claim(conn, ["a", "b"], limit=10)} == {a, b}


def test_the_service_keeps_floors_while_a_snapshot_is_held_and_drops_them_after(
    conn: Conn, dsn: str
) -> None:
    floors = ClaimFloors(SCHEMA, ["a", "b"], held_after=0.5)
    assert floors.held_after < HELD_AFTER
    with psycopg.connect(dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1").fetchone()
        if db.horizon_held(conn, SCHEMA) < 0.5:
            assert floors.run_once(conn).walked == 0  # not held long enough yet
            assert _floor_types(conn) == []
        while db.horizon_held(conn, SCHEMA) < 0.5:  # the service acts on the snapshot's age
            conn.execute("SELECT pg_sleep(0.05)")
        floors.run_once(conn)  # the empty floors
        assert _floor_types(conn) == ["a", "b"]
        assert floors.run_once(conn).walked == 2
        holder.rollback()
    assert floors.run_once(conn).walked == 0
    assert _floor_types(conn) == []


def _floor_types(conn: Conn) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT type FROM pgq.claim_floor ORDER BY type")]


def test_no_floor_while_a_writer_may_be_unseen(conn: Conn, dsn: str) -> None:
    """A session whose transaction start the walking role may not read (another role's): its
    jobs could be committed behind a floor, so the types get none."""
    role = f"pgq_floor_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        for grant in (
            "GRANT USAGE ON SCHEMA pgq TO {}",
            "GRANT ALL ON ALL TABLES IN SCHEMA pgq TO {}",
        ):
            conn.execute(sql.SQL(grant).format(sql.Identifier(role)))
        with psycopg.connect(make_conninfo(dsn, user=role), autocommit=True) as walker:
            assert db.refresh_floors(walker, SCHEMA, ["a"], full=False) == -1  # conn: unseen
            assert _floor_types(conn) == []
        assert db.refresh_floors(conn, SCHEMA, ["a"], full=False) == 0  # all seen: made
        assert _floor_types(conn) == ["a"]
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
