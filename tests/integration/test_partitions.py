"""The job table in partitions (schema/0029, opt-in: `partition`): finished jobs leave with their
partition, and no partition is ever dropped with a job in it that is still to run. Each test's
database is partitioned first; the jobs here are made with ids of three days ago: in its oldest
partition (tests/support/partitions.py).
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db, schema
from pgq_supervisor.db import Conn
from pgq_supervisor.db import params as db_params
from pgq_supervisor.db.health import read_health
from pgq_supervisor.jobs import AttemptKind, JobId, JobState
from pgq_supervisor.supervisor.maintenance.partitions import PartitionRound, Partitions
from pgq_supervisor.supervisor.maintenance.retention import Pruner
from tests.property.invariants import violations
from tests.support.db import claim_one, count_rows, get, raw_row
from tests.support.partitions import (
    STILL_TO_RUN,
    made_days_ago,
    old_bundle,
    partition,
    partition_of,
    partitions,
    still_to_run,
)


@pytest.fixture(autouse=True)
def parted(conn: Conn) -> None:
    assert partition(conn)


@pytest.fixture
def old_ids() -> Iterator[None]:
    with made_days_ago():
        yield


WEEK = 7 * 86400.0


def run(conn: Conn, *, interval: float = 3600.0, lock_timeout: float = 0.5) -> PartitionRound:
    """A round in which succeeded jobs are past their window at once; failed and cancelled
    ones are kept a week."""
    parts = Partitions("pgq", interval, 0.001, WEEK, lock_timeout=lock_timeout)
    return parts.run_once(conn)


def test_the_job_table_is_partitioned_by_id_and_jobs_land_by_their_time(conn: Conn) -> None:
    kind = conn.execute("SELECT relkind::text FROM pg_class WHERE oid = 'pgq.job'::regclass")
    assert kind.fetchone() == ("p",)
    assert {"job_legacy", "job_default"} <= partitions(conn)
    now = pgq.enqueue(conn, "t", {})
    assert partition_of(conn, now).startswith("pgq.job_p")
    assert count_rows(conn, "job_unique") == 0  # no unique index is needed: the key's table


def _no_ranges_ahead(conn: Conn) -> None:
    """Drop the (empty) partitions the migration made for today and tomorrow."""
    for (name,) in conn.execute(
        "SELECT name FROM pgq.job_partitions() WHERE lo IS NOT NULL"
    ).fetchall():
        conn.execute(f'ALTER TABLE pgq.job DETACH PARTITION pgq."{name}"')
        conn.execute(f'DROP TABLE pgq."{name}"')


def test_a_round_makes_the_partitions_ahead(conn: Conn) -> None:
    _no_ranges_ahead(conn)
    made = run(conn, interval=600.0).made
    assert made and set(made) <= partitions(conn)
    ahead = conn.execute(
        "SELECT max(pgq.id_time(hi)) > now() + interval '2 hours' FROM pgq.job_partitions()"
    ).fetchone()
    assert ahead == (True,)
    assert partition_of(conn, pgq.enqueue(conn, "t", {})) in {f"pgq.{m}" for m in made}
    indexes = conn.execute(
        "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass",
        (f"pgq.{made[0]}",),
    ).fetchall()
    assert f"pgq.{made[0]}_claim_idx" in {r[0] for r in indexes}  # named after job's
    assert run(conn, interval=600.0).made == ()  # made once


def test_a_reader_holding_the_table_makes_the_round_wait_half_a_second_not_forever(
    conn: Conn, dsn: str
) -> None:
    _no_ranges_ahead(conn)
    with psycopg.connect(dsn) as reader:  # a report in an open transaction
        reader.execute("SELECT count(*) FROM pgq.job").fetchone()
        assert run(conn, interval=600.0).made == ()  # the ATTACH waited 0.5 s, then gave up
        assert pgq.enqueue(conn, "t", {}) is not None  # the queue was not held behind it
    assert run(conn, interval=600.0).made != ()


def test_finished_jobs_leave_with_their_partition(conn: Conn, old_ids: None) -> None:
    done = [pgq.enqueue(conn, "t", {"n": i}) for i in range(50)]
    while jobs := db.claim(conn, "pgq", worker_id="w", types=["t"], max_retry_counts=[0], limit=20):
        db.succeed(conn, "pgq", jobs[0].lease, [(j.id, None) for j in jobs])
    failed = pgq.enqueue(conn, "f", {}, max_retry_count=0)
    job = claim_one(conn, "f", max_retry_count=0)
    db.end_attempt(conn, "pgq", [job.id], error="boom", kind=AttemptKind.ERROR, lease=job.lease)
    before = raw_row(conn, failed)
    assert partition_of(conn, done[0]) == "pgq.job_legacy"

    result = run(conn)

    assert "job_legacy" in result.dropped and result.carried == 1
    assert "job_legacy" not in partitions(conn)
    assert count_rows(conn, where="type = 't'") == 0
    # the failed job is kept its week: the same row, with its id, in the default partition
    assert raw_row(conn, failed) == before
    assert partition_of(conn, failed) == "pgq.job_default"
    assert get(conn, failed).state is JobState.FAILED
    assert violations(conn) == []


@pytest.mark.parametrize("kind", STILL_TO_RUN)
def test_a_partition_with_a_job_still_to_run_is_never_dropped(conn: Conn, kind: str) -> None:
    # a job elsewhere (now: a current partition) for the old one to wait behind
    first = pgq.enqueue(conn, "blocker", {}, ordered_key="k" if kind == "ordered" else None)
    with made_days_ago():
        held, done = still_to_run(conn, kind, first)
    assert partition_of(conn, held) == "pgq.job_legacy"
    row = raw_row(conn, held)

    result = run(conn)

    assert "job_legacy" not in result.dropped and result.held["job_legacy"] == "unfinished"
    assert raw_row(conn, held) == row
    assert get(conn, done).state is JobState.SUCCEEDED  # left to the partition: not deleted
    assert violations(conn) == []


def test_carried_jobs_keep_their_edges_and_workflow_rows(conn: Conn) -> None:
    with made_days_ago():
        failed = pgq.enqueue(conn, "f", {}, max_retry_count=0)
    conn.execute(
        "INSERT INTO pgq.workflow_step (job_id, seq, name, kind, state) VALUES"
        " (%s, 0, 'fetch', 'step', 'succeeded')",
        (failed,),
    )
    # a dependent made now (a current partition) that runs whatever its dependency does
    dependent = pgq.enqueue(conn, "d", {}, depends_on=[failed], on_dependency_failure="run")
    job = claim_one(conn, "f", max_retry_count=0)
    db.end_attempt(conn, "pgq", [job.id], error="boom", kind=AttemptKind.ERROR, lease=job.lease)
    assert get(conn, dependent).state is JobState.PENDING

    result = run(conn)

    assert "job_legacy" in result.dropped and result.carried == 1
    edges = conn.execute("SELECT job_id, depends_on FROM pgq.job_dependency").fetchall()
    assert edges == [(dependent, failed)]
    steps = conn.execute("SELECT job_id, name FROM pgq.workflow_step").fetchall()
    assert steps == [(failed, "fetch")]
    assert violations(conn) == []


def test_bundles_stay_counted_when_their_jobs_leave(conn: Conn) -> None:
    gone = old_bundle(conn, ["t"] * 5)
    kept = old_bundle(conn, ["k", "c"])
    while jobs := db.claim(conn, "pgq", worker_id="w", types=["t"], max_retry_counts=[0], limit=5):
        db.succeed(conn, "pgq", jobs[0].lease, [(j.id, None) for j in jobs])
    job = claim_one(conn, "k", max_retry_count=0)
    db.end_attempt(conn, "pgq", [job.id], error="boom", kind=AttemptKind.ERROR, lease=job.lease)
    other = conn.execute("SELECT id FROM pgq.job WHERE type = 'c'").fetchone()
    assert other is not None
    db.cancel(conn, "pgq", other[0])
    assert partition_of(conn, other[0]) == "pgq.job_legacy"

    result = run(conn)

    assert "job_legacy" in result.dropped and result.carried == 2  # the failed, the cancelled
    assert count_rows(conn, where="type = 't'") == 0
    rows = conn.execute("SELECT id, num_jobs, num_jobs_stopped FROM pgq.job_bundle").fetchall()
    counts: dict[uuid.UUID, tuple[int, int]] = {r[0]: (r[1], r[2]) for r in rows}
    assert counts[kept] == (2, 2)
    assert counts.get(gone, (0, 0)) == (0, 0)  # emptied (the pruner deletes emptied bundles)
    assert violations(conn) == []


def test_one_maintainer_at_a_time(conn: Conn, dsn: str, old_ids: None) -> None:
    done = pgq.enqueue(conn, "t", {})
    db.succeed(conn, "pgq", claim_one(conn, "t").lease, [(done, None)])
    with psycopg.connect(dsn) as other:  # another supervisor's round, in its transaction
        assert other.execute("SELECT pgq.job_partition_lock()").fetchone() == (True,)
        result = run(conn)
        assert "job_legacy" not in result.dropped and result.held["job_legacy"] == "busy"
        assert run(conn).made == ()
    assert "job_legacy" in run(conn).dropped


def test_a_reader_holding_the_table_makes_the_drop_wait_not_the_queue(conn: Conn, dsn: str) -> None:
    with made_days_ago():
        done = pgq.enqueue(conn, "t", {})
    db.succeed(conn, "pgq", claim_one(conn, "t").lease, [(done, None)])
    with psycopg.connect(dsn) as reader:  # a long report
        reader.execute("SELECT count(*) FROM pgq.job").fetchone()
        result = run(conn, lock_timeout=0.05)
        assert result.held["job_legacy"] == "busy"
        # the queue is not held behind the drop that gave up
        assert pgq.enqueue(conn, "t2", {}) is not None
    assert get(conn, done).state is JobState.SUCCEEDED
    assert "job_legacy" in run(conn).dropped


def test_the_pruner_leaves_the_drop_zone_to_the_partitions(conn: Conn) -> None:
    recent = pgq.enqueue(conn, "t", {})
    db.succeed(conn, "pgq", claim_one(conn, "t").lease, [(recent, None)])
    carried = uuid.uuid4()  # an id out of every range: the default partition's
    conn.execute(
        "INSERT INTO pgq.job (id, type, payload, state, started_at, stopped_at) VALUES"
        " (%s, 'c', '{}', 'succeeded', now() - interval '1 hour', now() - interval '1 hour')",
        (carried,),
    )
    assert partition_of(conn, JobId(carried)) == "pgq.job_default"
    conn.execute(
        "UPDATE pgq.job SET stopped_at = now() - interval '1 hour' WHERE id = %s", (recent,)
    )

    pruned = Pruner("pgq", 60.0, None, zone=86400.0).run_once(conn)

    assert pruned.succeeded == 1
    assert count_rows(conn, where=f"id = '{carried}'") == 0
    assert get(conn, recent).state is JobState.SUCCEEDED  # its partition will take it


def test_concurrent_rounds_drop_once(dsn: str, conn: Conn, old_ids: None) -> None:
    for _ in range(3):
        done = pgq.enqueue(conn, "t", {})
        db.succeed(conn, "pgq", claim_one(conn, "t").lease, [(done, None)])
    results: list[PartitionRound] = []

    def round_() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            results.append(run(c))

    threads = [threading.Thread(target=round_) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.dropped.count("job_legacy") for r in results) == 1
    assert "job_legacy" not in partitions(conn)


def test_partitioning_keeps_every_job_where_it_is_and_runs_none_twice(
    empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From schema 28 (one wide table) with finished, pending, running, delayed, bundled,
    dependent, keyed and workflow jobs: migrate, then `partition` with the supervisors stopped
    (docs/operations.md). Every row is there afterwards, as it was, with its edges; each
    pending job runs once; the running one finishes under its lease; ids from a client whose
    clock ran ahead land in a range."""
    for mig in schema.available():
        if mig.version < 29:
            shutil.copy(mig.path, tmp_path / mig.path.name)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        monkeypatch.setattr(schema, "migrations_dir", lambda: tmp_path)
        pgq.migrate(c, schema="pgq")
        monkeypatch.undo()
        ready = [pgq.enqueue(c, "r", {"n": i}) for i in range(20)]
        for _ in range(10):
            db.succeed(c, "pgq", claim_one(c, "r").lease, [(ready.pop(0), None)])
        running = claim_one(c, "r")
        ready.remove(running.id)
        later = pgq.enqueue(c, "d", {}, start_at=datetime.now(UTC) + timedelta(days=9))
        keyed = pgq.enqueue(c, "k", {}, unique_key="one")
        dependent = pgq.enqueue(c, "r", {"dep": 1}, depends_on=[keyed])
        bundle = pgq.enqueue_bundle(c, "b", [pgq.NewJob("r", {"b": i}) for i in range(3)])
        ahead = uuid.UUID(int=db_params.time_ordered(uuid.uuid4().int, time.time_ns() + 10**12))
        c.execute("INSERT INTO pgq.job (id, type, payload) VALUES (%s, 'r', '{}')", (ahead,))
        c.execute(
            "INSERT INTO pgq.workflow_step (job_id, seq, name, kind, state) VALUES"
            " (%s, 0, 's', 'step', 'succeeded')",
            (keyed,),
        )
        rows = {r[0]: r for r in c.execute("SELECT * FROM pgq.job").fetchall()}
        edges = c.execute("SELECT * FROM pgq.job_dependency").fetchall()

        assert pgq.migrate(c, schema="pgq") == [m.version for m in schema.available()][28:]
        assert {r[0]: r for r in c.execute("SELECT * FROM pgq.job").fetchall()} == rows
        assert partition(c)  # `partition`, with the supervisors stopped

        assert {r[0]: r for r in c.execute("SELECT * FROM pgq.job").fetchall()} == rows
        assert c.execute("SELECT * FROM pgq.job_dependency").fetchall() == edges
        assert partition_of(c, later) == "pgq.job_legacy"
        assert partition_of(c, JobId(ahead)) != "pgq.job_legacy"  # moved to its id's range
        assert holders_of(c) == {"one": keyed}
        # the claim taken before the migration still holds: its worker finishes it
        assert db.succeed(c, "pgq", running.lease, [(running.id, None)]) == {running.id}
        ran: list[JobId] = []
        while jobs := db.claim(
            c, "pgq", worker_id="w", types=["r", "k"], max_retry_counts=[3, 3], limit=7
        ):
            ran += [j.id for j in jobs]
            db.succeed(c, "pgq", jobs[0].lease, [(j.id, None) for j in jobs])
        assert len(ran) == len(set(ran))  # none twice
        assert {*ready, keyed, dependent, JobId(ahead)} <= set(ran)
        assert pgq.get_bundle(c, bundle.id).is_complete
        assert violations(c) == []


def holders_of(conn: Conn) -> dict[str, JobId]:
    rows = conn.execute("SELECT unique_key, job_id FROM pgq.job_unique").fetchall()
    return {str(r[0]): JobId(r[1]) for r in rows}


def test_doctor_sums_the_table_over_its_partitions(conn: Conn, old_ids: None) -> None:
    for _ in range(3):
        pgq.enqueue(conn, "t", {})
    conn.execute("VACUUM ANALYZE pgq.job")
    table = read_health(conn, "pgq", older_than=60.0).table
    assert table is not None
    assert table.partitions == len(partitions(conn)) >= 3
    assert table.live_tuples == 3 and table.total_bytes > 0
    assert "fillfactor=90" in table.options  # the partitions' settings
