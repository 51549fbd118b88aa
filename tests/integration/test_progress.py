"""Progress on a real database: fenced by the lease (the statement and the heartbeat's writer),
throttled by the writer thread (writes counted by a trigger), notified on pgq_job_progress,
written in a `conn` handler's transaction by drain, cleared by reset, and a HOT update."""

from __future__ import annotations

import threading
import time

import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db, testing
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobState
from pgq_supervisor.worker.executor import Executor
from pgq_supervisor.worker.heartbeat import Heartbeat
from tests.support.db import SCHEMA, claim_one, get, listening
from tests.support.waiting import DEADLINE, until

COUNT_WRITES = """
CREATE TABLE progress_writes (job_id uuid, progress jsonb);
CREATE FUNCTION count_progress() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO progress_writes (job_id, progress) VALUES (NEW.id, NEW.progress);
    RETURN NULL;
END $$;
CREATE TRIGGER count_progress AFTER UPDATE OF progress ON pgq.job
    FOR EACH ROW EXECUTE FUNCTION count_progress();
"""


def _writes(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM progress_writes").fetchone()
    assert row is not None
    return int(row[0])


def test_a_write_lands_only_under_the_jobs_lease_and_is_notified(conn: Conn, dsn: str) -> None:
    job_id = pgq.enqueue(conn, "t")
    stale = claim_one(conn, "t")
    pgq.reset_job(conn, job_id, force=True)  # its worker is fenced out
    current = claim_one(conn, "t", worker_id="worker-2")
    with listening(dsn, "pgq_job_progress") as listener:
        assert db.set_progress(conn, SCHEMA, [(job_id, stale.lease, "0.9")]) == set()
        assert get(conn, job_id).progress is None
        assert db.set_progress(conn, SCHEMA, [(job_id, current.lease, '{"n": 1}')]) == {job_id}
        assert listener.collect()["pgq_job_progress"] == [str(job_id)]
    assert get(conn, job_id).progress == {"n": 1}
    db.succeed(conn, SCHEMA, current.lease, [(job_id, None)])
    assert db.set_progress(conn, SCHEMA, [(job_id, current.lease, "1")]) == set()  # finished
    assert get(conn, job_id).progress == {"n": 1}
    pgq.reset_job(conn, job_id)
    assert get(conn, job_id).progress is None  # a fresh run starts from nothing


def test_a_progress_write_is_a_hot_update(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")

    def hot_updates() -> int:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'pgq.job'::regclass"
        ).fetchone()
        assert row is not None
        return int(row[0])

    before = hot_updates()
    for i in range(10):
        db.set_progress(conn, SCHEMA, [(job_id, job.lease, str(i / 10))])
    assert hot_updates() - before >= 5  # most, whatever the page's free space did


def test_the_heartbeats_writer_drops_a_stale_leases_value(conn: Conn, dsn: str) -> None:
    job_id = pgq.enqueue(conn, "t")
    stale = claim_one(conn, "t")
    hb = Heartbeat(lambda: db.connect(dsn), SCHEMA, 5.0, "worker-1")
    try:
        hb.progress.put(stale, "0.5")
        assert hb.write_progress() == 1
        assert get(conn, job_id).progress == 0.5
        pgq.reset_job(conn, job_id, force=True)
        claim_one(conn, "t", worker_id="worker-2")
        hb.progress.min_interval = 0.0
        hb.progress.put(stale, "0.75")
        assert hb.write_progress() == 0  # another worker's job now: nothing written
        assert get(conn, job_id).progress is None  # as the reset left it
    finally:
        hb.stop()


def test_the_writer_thread_throttles_and_writes_the_last_value(conn: Conn, dsn: str) -> None:
    conn.execute(COUNT_WRITES)
    job_id = pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    hb = Heartbeat(lambda: db.connect(dsn), SCHEMA, 5.0, "worker-1")
    hb.start()
    try:
        hb.hold(job.lease, [job.id])
        started = time.monotonic()
        reports = 400
        for i in range(reports):
            hb.progress.put(job, db.dump_json({"i": i + 1}))
            time.sleep(0.002)  # a handler reporting from a tight loop, ~1 s of it
        elapsed = time.monotonic() - started
        until(lambda: get(conn, job_id).progress == {"i": reports})
    finally:
        hb.stop()
    writes = _writes(conn)
    # one write at once, then at most one per 0.25 s (a slack of one for the final value)
    assert 2 <= writes <= elapsed / 0.25 + 2, (writes, elapsed)


def test_a_handler_reports_through_the_executor_while_it_runs(conn: Conn, dsn: str) -> None:
    registry = pgq.Registry()
    go_on = threading.Event()

    @registry.handler("steps")
    def steps(payload: dict[str, int], job: pgq.Job) -> str:
        job.report_progress(0.5)
        assert go_on.wait(DEADLINE)
        return "done"

    job_id = pgq.enqueue(conn, "steps")
    job = claim_one(conn, "steps")
    hb = Heartbeat(lambda: db.connect(dsn), SCHEMA, 5.0, "worker-1")
    hb.start()
    executor = Executor(registry, "worker-1", progress=hb.progress)
    runner = threading.Thread(target=executor.run, args=(job,), daemon=True)
    try:
        runner.start()
        until(lambda: get(conn, job_id).progress == 0.5)
        assert get(conn, job_id).state is JobState.RUNNING
    finally:
        go_on.set()
        runner.join(DEADLINE)
        hb.stop()


def test_drain_records_and_writes_progress_in_a_conn_handlers_transaction(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("steps")
    def steps(payload: dict[str, int], job: pgq.Job, conn: Conn) -> None:
        job.report_progress(0.5)
        job.report_progress({"step": "last"})

    @registry.handler("bad", max_retry_count=0)
    def bad(payload: dict[str, int], job: pgq.Job) -> None:
        job.report_progress(1.5)

    ok, failing = pgq.enqueue(conn, "steps"), pgq.enqueue(conn, "bad")
    result = testing.drain(conn, registry)
    assert result.progress == {ok: [0.5, {"step": "last"}]}
    assert get(conn, ok).progress == {"step": "last"}
    record = get(conn, failing)
    assert record.state is JobState.FAILED and "from 0 to 1" in (record.error_msg or "")


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_the_bounds_are_accepted_by_the_database(conn: Conn, value: float) -> None:
    job_id = pgq.enqueue(conn, "t")
    job = claim_one(conn, "t")
    assert db.set_progress(conn, SCHEMA, [(job_id, job.lease, db.dump_json(value))]) == {job_id}
    assert get(conn, job_id).progress == value
