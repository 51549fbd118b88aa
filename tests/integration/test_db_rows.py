"""Rows read by column name: every column of a job reaches JobRecord, every statement returns
exactly the columns its row type reads, and a claimed batch comes back in claim order."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from psycopg.rows import dict_row

import pgq_supervisor as pgq
from pgq_supervisor import db, sql
from pgq_supervisor.db import Conn, params, rows, web_rows
from pgq_supervisor.jobs import AttemptKind, Bundle, JobId, JobRecord, JobState, LeaseToken
from pgq_supervisor.periodic import Schedule
from tests.support.db import SCHEMA, claim, claim_one, listening, make_due


def _columns_of(conn: Conn, table: str) -> list[str]:
    found = conn.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = 'pgq' AND table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [r[0] for r in found]


def _assert_record_is_the_row(conn: Conn, record: JobRecord) -> set[str]:
    """Every field equals the column of its name; returns the fields that were not NULL."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM pgq.job WHERE id = %s", (record.id,)).fetchone()
    assert row is not None
    for field in dataclasses.fields(JobRecord):
        value = getattr(record, field.name)
        assert value == row[field.name], field.name
    assert type(record.state) is JobState
    return {f.name for f in dataclasses.fields(JobRecord) if getattr(record, f.name) is not None}


def test_get_job_reads_every_column_by_name(conn: Conn) -> None:
    start_at = db.db_now(conn, SCHEMA) - timedelta(seconds=1)
    job = pgq.NewJob(
        "t",
        {"k": [1, 2]},
        priority=7,
        start_at=start_at,
        max_retry_count=4,
        unique_key="key-1",
        origin="tests",
        timeout=12.5,
        depends_on=[dep := pgq.enqueue(conn, "dep")],
        concurrency_key="customer:42",
        tenant="acme",
    )
    with conn.transaction():
        bundle = db.insert_bundle(conn, SCHEMA, "t", 1, "tests", None)
        (job_id,) = db.enqueue_many(conn, SCHEMA, [job], bundle_id=bundle.id)
    seen = _assert_record_is_the_row(conn, db.get_job(conn, SCHEMA, job_id))

    assert db.get_job(conn, SCHEMA, job_id).waiting_on == 1
    done = claim_one(conn, "dep", worker_id="w-0")
    assert db.succeed(conn, SCHEMA, done.lease, [(dep, None)]) == {dep}
    seen |= _assert_record_is_the_row(conn, db.get_job(conn, SCHEMA, dep))  # has_dependents
    running = claim_one(conn, "t", worker_id="w-1")
    assert running.dependencies == (dep,) and running.dependency_results == {dep: None}
    db.end_attempt(
        conn, SCHEMA, [running.id], error="boom", kind=AttemptKind.ERROR, lease=running.lease,
        worker_id="w-1", error_data={"why": "test"},
    )  # fmt: skip
    make_due(conn, job_id)
    running = claim_one(conn, "t", worker_id="w-2")
    assert db.set_progress(conn, SCHEMA, [(job_id, running.lease, '{"done": 3}')]) == {job_id}
    # enqueue writes it only under a recording OpenTelemetry span (test_tracing.py)
    conn.execute("UPDATE pgq.job SET trace_context = 'tp' WHERE id = %s", (job_id,))
    # set only on a debounced job that waits behind a running one (test_debounce.py)
    conn.execute(
        "UPDATE pgq.job SET debounce_key = 'dk', ordered_key = 'ok' WHERE id = %s", (job_id,)
    )
    # set on a workflow's child (ctx.enqueue, test_workflows.py)
    conn.execute("UPDATE pgq.job SET workflow_parent = %s WHERE id = %s", (dep, job_id))
    seen |= _assert_record_is_the_row(conn, db.get_job(conn, SCHEMA, job_id))
    assert db.succeed(conn, SCHEMA, running.lease, [(running.id, '{"ok": true}')]) == {job_id}
    seen |= _assert_record_is_the_row(conn, db.get_job(conn, SCHEMA, job_id))
    (listed,) = db.list_jobs(conn, SCHEMA, JobState.SUCCEEDED, "t", 10)
    assert listed == db.get_job(conn, SCHEMA, job_id)

    # every field held a real value at some point, so each was compared with its column
    assert seen == set(rows.JOB_RECORD.columns)


def test_job_record_and_bundle_have_every_column_of_their_tables(conn: Conn) -> None:
    # lease is deliberately not shown: it is the worker's fencing token; ordered_seq only
    # orders the jobs of an ordered_key among themselves
    hidden = ("lease", "ordered_seq")
    assert [c for c in _columns_of(conn, "job") if c not in hidden] == list(rows.JOB_RECORD.columns)
    assert _columns_of(conn, "job_bundle") == list(rows.BUNDLE.columns)


def _dependent(conn: Conn) -> object:
    row = conn.execute("SELECT job_id FROM pgq.job_dependency LIMIT 1").fetchone()
    assert row is not None
    return row[0]


def _epoch(conn: Conn) -> str:
    row = conn.execute("SELECT pgq.server_epoch()").fetchone()
    assert row is not None
    return str(row[0])


def _sample_params(conn: Conn) -> dict[str, dict[str, object]]:
    """Parameters that make each row-returning statement return at least one row."""
    ids = [pgq.enqueue(conn, "t", {"n": i}, unique_key=f"u{i}", origin="o") for i in range(3)]
    bundle = db.insert_bundle(conn, SCHEMA, "t", 0, None, None)
    running = claim(conn, ["t"], limit=2)
    pgq.enqueue(conn, "snz", {})
    snoozing = claim(conn, ["snz"])[0]
    pgq.pause(conn, "other", reason="sample")  # any paused type gives type_controls a row
    db.sync_limits(conn, SCHEMA, ["other"], {"other": (2, 1)})  # and type_limits one
    claim_args = {"worker_id": "w", "types": ["t"], "max_retry_counts": [3], "limit": 1}
    db.declare_schedules(conn, SCHEMA, [Schedule.make("s0", type="t", every=timedelta(seconds=5))])
    # the dashboard's: a dependency edge, a job finished now, a registered supervisor
    pgq.enqueue(conn, "later", {}, depends_on=[ids[0]])
    pgq.enqueue(conn, "done", {})
    done = claim(conn, ["done"])[0]
    db.succeed(conn, SCHEMA, done.lease, [(done.id, None)])
    completed = pgq.enqueue_bundle(conn, "b", [pgq.NewJob("bm", {})], on_complete="after")
    (member,) = claim(conn, ["bm"])
    db.succeed(conn, SCHEMA, member.lease, [(member.id, None)])  # enqueues its "after" job
    db.register_supervisor(
        conn, SCHEMA, id="h:1:0", host="h", pid=1, procs=1, types=["t"],
        started_at=db.db_now(conn, SCHEMA), children=[],
    )  # fmt: skip
    # a supervisor that said it held its lock, which nobody holds, and its child's job
    db.register_supervisor(
        conn, SCHEMA, id="g:1:0", host="g", pid=1, procs=1, types=["orphan"],
        started_at=db.db_now(conn, SCHEMA), children=[], locked_on=_epoch(conn),
    )  # fmt: skip
    pgq.enqueue(conn, "orphan", {})
    claim(conn, ["orphan"], worker_id="g:1:0:0:0")
    return {
        "claim": {**claim_args, "lease": uuid.uuid4()},
        "succeed_and_claim": {
            **claim_args,
            "lease": uuid.uuid4(),
            "ids": [running[0].id],
            "results": [None],
            "done_lease": running[0].lease,
            "ephemeral": [],
        },
        "get_job": {"id": ids[0]},
        "get_jobs": {"ids": ids},
        "job_states": {"ids": ids},
        "list_jobs": {"state": "running", "type": None, "limit": 10},
        "insert_bundle": {
            "id": uuid.uuid4(),
            "type": "t",
            "origin": None,
            "num_jobs": 0,
            "on_complete": None,
        },
        "get_bundle": {"id": bundle.id},
        "end_attempt": {
            "ids": [running[1].id],
            "lease": running[1].lease,
            "worker_id": None,
            "error": "x",
            "error_data": None,
            "kind": "error",
            "allow_retry": True,
            "delay": 0.0,
        },
        "rescue": {"dead_after": -1.0, "limit": 10, "error": "x"},
        "rescue_orphans": {"ids": ["g:1:0"], "error": "x", "quiet": 0.0},
        "snooze": {
            "id": snoozing.id, "lease": snoozing.lease, "delay": 1.0, "max_snoozes": 1,
            "error": "x",
        },
        "queue_stats": {},
        "active_stats": {},
        "summary_by_origin": {"origin": "o"},
        "unfinished_by_unique_keys": {"keys": ["u0", "u1", "u2"]},
        "unique_holders": {"keys": ["u0"], "windows": [60.0], "states": ["succeeded"]},
        "cancel": {"id": ids[2]},
        "schedule_declare": {
            "names": ["s1"],
            "types": ["t"],
            "crons": ["* * * * *"],
            "everys": [None],
            "timezones": ["UTC"],
            "priorities": [0],
            "catch_ups": [0],
            "payloads": ["null"],
        },
        "schedule_states": {"names": ["s0"]},
        "schedules_list": {},
        "type_controls": {},
        "type_limits": {},
        "supervisors_list": {},
        "jobs_page": {
            "state": None, "type": None, "unique_key": None, "payload": None,
            "bundle_id": None, "since": None, "until": None, "before_at": None,
            "before_id": None, "limit": 10,
        },
        "job_dependencies": {"id": _dependent(conn)},
        "job_dependents": {"id": ids[0], "limit": 10},
        "job_page_record": {"id": ids[0], "inline": 65536},
        "bundles_page": {"limit": 10, "window": 60.0},
        "bundle_completion": {
            "id": completed.id, "type": "after", "since": params.id_floor(completed.created_at),
            "done_from": params.id_floor(completed.created_at),
            "done_until": params.id_floor(datetime.now(UTC) + timedelta(minutes=1)),
        },
        "throughput": {"minutes": 60},
        "type_throughput": {"type": "done", "window": 3600, "bucket": 60},
        "type_durations": {"type": "done", "window": 3600},
        "type_active": {"type": "t"},
        "running_on": {"workers": ["worker-1"]},
    }  # fmt: skip


def test_each_statement_returns_exactly_the_columns_its_row_type_reads(conn: Conn) -> None:
    samples = _sample_params(conn)
    every = {**rows.ROWS, **web_rows.ROWS}
    assert set(samples) == set(every)
    for name, columns in every.items():
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            cur.execute(sql.query(name, SCHEMA), samples[name])
            assert cur.description is not None and cur.rowcount > 0, name
            assert tuple(c.name for c in cur.description) == columns, name


def test_a_missing_column_is_named(conn: Conn) -> None:
    with conn.cursor(row_factory=rows.BUNDLE) as cur, pytest.raises(TypeError, match="on_complete"):
        cur.execute(
            "SELECT id, type, origin, num_jobs, num_jobs_stopped, created_at, updated_at"
            " FROM pgq.job_bundle"
        )
        cur.fetchall()


def test_columns_are_read_by_name_whatever_their_order(conn: Conn) -> None:
    bundle = db.insert_bundle(conn, SCHEMA, "t", 3, "o", "done")
    with conn.cursor(row_factory=rows.BUNDLE) as cur:
        got = cur.execute(
            "SELECT updated_at, created_at, on_complete, num_jobs_stopped, num_jobs, origin, type,"
            " 'ignored' AS extra, id FROM pgq.job_bundle"
        ).fetchone()
    assert got == bundle and isinstance(got, Bundle)


def _set_created_at(conn: Conn, order: list[JobId]) -> None:
    """Make created_at follow `order` (ids are random, so id order differs)."""
    for i, job_id in enumerate(order):
        conn.execute(
            "UPDATE pgq.job SET created_at = now() - make_interval(secs => %s) WHERE id = %s",
            (1000 - i, job_id),
        )


def _enqueue_mixed(conn: Conn, n: int) -> list[JobId]:
    """n jobs of priorities 0..2, returned in the order a claim must give them."""
    ids = [pgq.enqueue(conn, "t", {"n": i}, priority=i % 3) for i in range(n)]
    _set_created_at(conn, ids)
    return sorted(ids, key=lambda i: -(ids.index(i) % 3))  # stable: oldest first per priority


def test_a_claimed_batch_comes_in_claim_order(conn: Conn) -> None:
    expected = _enqueue_mixed(conn, 30)
    assert sorted(expected) != expected  # id order would not do
    assert [j.id for j in claim(conn, ["t"], limit=30)] == expected


def test_succeed_and_claim(conn: Conn, dsn: str) -> None:
    first = _enqueue_mixed(conn, 4)
    batch = claim(conn, ["t"], limit=4)
    assert [j.id for j in batch] == first
    later = _enqueue_mixed(conn, 12)
    # one job of the batch lost its lease: its success must not land
    conn.execute("UPDATE pgq.job SET lease = gen_random_uuid() WHERE id = %s", (batch[0].id,))
    results = [(j.id, f'{{"n": {i}}}') for i, j in enumerate(batch)]
    with listening(dsn, "pgq_job_stopped") as listener:
        done, claimed = db.succeed_and_claim(
            conn, SCHEMA, batch[0].lease, results,
            worker_id="w-2", types=["t"], max_retry_counts=[5], limit=10,
        )  # fmt: skip
        notified = listener.collect()["pgq_job_stopped"]
    assert done == {j.id for j in batch[1:]}
    assert sorted(",".join(notified).split(",")) == sorted(str(i) for i in done)
    assert [j.id for j in claimed] == later[:10]
    assert len({j.lease for j in claimed}) == 1 and claimed[0].lease != batch[0].lease
    assert all(j.max_retry_count == 5 and j.attempt == 1 for j in claimed)
    assert db.get_job(conn, SCHEMA, batch[1].id).result == {"n": 1}
    assert db.get_job(conn, SCHEMA, batch[0].id).state is JobState.RUNNING

    # nothing left to claim: still the successes
    rest = claim(conn, ["t"], limit=10)
    done, claimed = db.succeed_and_claim(
        conn, SCHEMA, claimed[0].lease, [(j.id, None) for j in claimed],
        worker_id="w-2", types=["t"], max_retry_counts=[5], limit=10,
    )  # fmt: skip
    assert done == set(later[:10]) and claimed == []

    # nothing succeeded (the lease is gone): still the claim
    pgq.enqueue(conn, "t", {})
    done, claimed = db.succeed_and_claim(
        conn, SCHEMA, LeaseToken(uuid.uuid4()), [(rest[0].id, None)],
        worker_id="w-2", types=["t"], max_retry_counts=[5], limit=10,
    )  # fmt: skip
    assert done == set() and len(claimed) == 1
