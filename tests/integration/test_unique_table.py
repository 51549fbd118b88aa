"""The unique key's own table (schema/0027): one unfinished job per key without the wide
table's unique index.

job_unique_key_idx stays for one version (producers of the previous version name it in their
ON CONFLICT); each test here drops it first, so that only job_unique can refuse a second
holder, as it alone will once the job table is partitioned (issue 35, step 4).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db, schema
from pgq_supervisor.db import Conn
from pgq_supervisor.periodic import Schedule
from tests.property.invariants import violations
from tests.support.db import SCHEMA, count_rows, get, in_threads


@pytest.fixture
def bare(conn: Conn) -> Iterator[Conn]:
    """A queue whose wide table has no unique index on unique_key."""
    conn.execute("DROP INDEX pgq.job_unique_key_idx")
    yield conn
    assert violations(conn) == []  # U1: job_unique is exactly the unfinished keyed jobs


def holders(conn: Conn) -> dict[str, str]:
    rows = conn.execute("SELECT unique_key, job_id::text FROM pgq.job_unique").fetchall()
    return {r[0]: r[1] for r in rows}


def test_a_held_key_returns_its_holder_and_inserts_nothing(bare: Conn) -> None:
    first = pgq.enqueue(bare, "sync", {"n": 1}, unique_key="user:1")
    assert pgq.enqueue(bare, "sync", {"n": 2}, unique_key="user:1") == first
    assert pgq.enqueue_many(bare, [pgq.NewJob("sync", unique_key="user:1")]) == [first]
    assert count_rows(bare, "job") == 1
    assert holders(bare) == {"user:1": str(first)}


def test_a_batch_inserts_the_jobs_whose_keys_are_free(bare: Conn) -> None:
    held = pgq.enqueue(bare, "sync", unique_key="k2")
    ids = pgq.enqueue_many(
        bare,
        [
            pgq.NewJob("sync", {"i": 0}, unique_key="k1"),
            pgq.NewJob("sync", {"i": 1}, unique_key="k2"),
            pgq.NewJob("sync", {"i": 2}),
        ],
    )
    assert ids[1] == held and len(set(ids)) == 3
    assert get(bare, ids[0]).payload == {"i": 0}
    assert count_rows(bare, "job") == 3
    assert set(holders(bare)) == {"k1", "k2"}


def test_the_key_is_let_go_when_its_job_ends_and_taken_back_by_a_reset(bare: Conn) -> None:
    # a reset of a job whose key another job holds is refused (unique_violation, InvalidInput)
    first = pgq.enqueue(bare, "sync", unique_key="k")
    pgq.cancel_job(bare, first)
    assert holders(bare) == {}
    second = pgq.enqueue(bare, "sync", unique_key="k")
    assert second != first
    # the cancelled job cannot come back while the new one holds its key: nothing changes
    with pytest.raises(pgq.InvalidInput, match="unique_key conflict"):
        pgq.reset_job(bare, first)
    assert get(bare, first).state is pgq.JobState.CANCELLED
    pgq.cancel_job(bare, second)
    pgq.reset_job(bare, first)  # the key is free again: the reset takes it
    assert holders(bare) == {"k": str(first)}


def test_deleting_or_truncating_unfinished_jobs_frees_their_keys(bare: Conn) -> None:
    pgq.enqueue(bare, "sync", unique_key="a")
    pgq.enqueue(bare, "sync", unique_key="b")
    bare.execute("DELETE FROM pgq.job WHERE unique_key = 'a'")
    assert set(holders(bare)) == {"b"}
    bare.execute("TRUNCATE pgq.job CASCADE")
    assert holders(bare) == {}
    assert pgq.enqueue(bare, "sync", unique_key="b") is not None
    assert set(holders(bare)) == {"b"}


def test_users_own_insert_of_a_held_key_inserts_nothing(bare: Conn) -> None:
    held = pgq.enqueue(bare, "sync", unique_key="k")
    insert = "INSERT INTO pgq.job (type, payload, unique_key) VALUES ('t', '{}', %s) RETURNING id"
    assert bare.execute(insert, ("k",)).fetchall() == []  # as ON CONFLICT DO NOTHING did
    (other,) = bare.execute(insert, ("k2",)).fetchall()
    assert holders(bare) == {"k": str(held), "k2": str(other[0])}
    assert count_rows(bare, "job") == 2


def test_concurrent_producers_of_one_key_make_one_job(bare: Conn, dsn: str) -> None:
    conns = [db.connect(dsn) for _ in range(4)]
    barrier = threading.Barrier(4)
    try:

        def produce(i: int) -> pgq.JobId:
            with conns[i].transaction():
                barrier.wait()
                return pgq.enqueue(conns[i], "sync", {"i": i}, unique_key="race")

        for _ in range(5):
            ids = in_threads(4, produce)
            assert len(set(ids)) == 1, ids
            assert count_rows(bare, "job") == 1
            bare.execute("DELETE FROM pgq.job")
    finally:
        for c in conns:
            c.close()


def test_a_schedule_tick_whose_key_is_held_enqueues_nothing(bare: Conn) -> None:
    hour = timedelta(hours=1)
    schedule = Schedule.make("s", type="t", every=hour)
    tick = schedule.next_tick(db.db_now(bare, SCHEMA)) - 3 * hour
    db.declare_schedules(bare, SCHEMA, [schedule])
    first = db.enqueue_tick(bare, SCHEMA, schedule, tick)
    assert first is not None
    # the same tick's key is held by its unfinished job: even past last_tick, no second job
    bare.execute("UPDATE pgq.schedule SET last_tick = NULL")
    assert db.enqueue_tick(bare, SCHEMA, schedule, tick) is None
    assert count_rows(bare, "job") == 1


def test_migrating_gives_the_unfinished_jobs_their_keys(
    empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = [m for m in schema.available() if m.version < 27]
    for mig in before:
        shutil.copy(mig.path, tmp_path / mig.path.name)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        monkeypatch.setattr(schema, "migrations_dir", lambda: tmp_path)
        pgq.migrate(c, schema="pgq")
        monkeypatch.undo()
        # jobs written at version 26, as its producers wrote them
        c.execute(
            "INSERT INTO pgq.job (id, type, payload, unique_key, state, stopped_at) VALUES"
            " ('00000000-0000-0000-0000-000000000001', 't', '{}', 'p', 'pending', NULL),"
            " ('00000000-0000-0000-0000-000000000002', 't', '{}', 'd', 'cancelled', now()),"
            " ('00000000-0000-0000-0000-000000000003', 't', '{}', NULL, 'pending', NULL)"
        )
        assert pgq.migrate(c, schema="pgq") == [m.version for m in schema.available()][26:]
        assert holders(c) == {"p": "00000000-0000-0000-0000-000000000001"}


# schema/0026's enqueue_unique, as a producer of the previous version still sends it
PREVIOUS_ENQUEUE_UNIQUE = (
    "INSERT INTO pgq.job (type, payload, unique_key) VALUES ('sync', '{}', %s)"
    " ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('pending', 'running')"
    " DO NOTHING RETURNING id"
)


def test_a_producer_of_the_previous_version_still_takes_keys(conn: Conn) -> None:
    (old,) = conn.execute(PREVIOUS_ENQUEUE_UNIQUE, ("k",)).fetchall()
    assert holders(conn) == {"k": str(old[0])}
    assert conn.execute(PREVIOUS_ENQUEUE_UNIQUE, ("k",)).fetchall() == []
    assert pgq.enqueue(conn, "sync", unique_key="k") == old[0]
    new = pgq.enqueue(conn, "sync", unique_key="n")
    assert conn.execute(PREVIOUS_ENQUEUE_UNIQUE, ("n",)).fetchall() == []
    assert set(holders(conn)) == {"k", "n"} and holders(conn)["n"] == str(new)
    assert violations(conn) == []
