"""Heartbeats per child (schema/0025, docs/storage.md): a beat writes its child's own `worker`
row and no job row; a running job is alive while its claim's stamp or its owner's beat is
young; while a supervisor of an older version is registered, jobs' rows are beaten as before."""

from __future__ import annotations

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobId
from tests.support.db import claim

S = "pgq"


def _age_stamps(conn: Conn, seconds: int) -> None:
    conn.execute(
        "UPDATE pgq.job SET worker_alive_at = now() - make_interval(secs => %s)"
        " WHERE state = 'running'",
        (seconds,),
    )


def _stamp_ages(conn: Conn, ids: list[JobId]) -> list[float]:
    rows = conn.execute(
        "SELECT extract(epoch FROM now() - worker_alive_at)::float8 FROM pgq.job"
        " WHERE id = ANY(%s) ORDER BY id",
        (ids,),
    ).fetchall()
    return [float(r[0]) for r in rows]


def _workers(conn: Conn) -> dict[str, float]:
    rows = conn.execute(
        "SELECT id, extract(epoch FROM now() - alive_at)::float8 FROM pgq.worker"
    ).fetchall()
    return {str(r[0]): float(r[1]) for r in rows}


def _register(conn: Conn, id: str) -> None:
    db.register_supervisor(
        conn, S, id=id, host="h", pid=1, procs=1, types=["t"],
        started_at=db.db_now(conn, S), children=[],
    )  # fmt: skip


def test_one_beat_writes_the_childs_row_once_and_no_job_row(conn: Conn) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t") for _ in range(50)])
    jobs = claim(conn, ["t"], limit=50, worker_id="h:1:0:0:0")
    ids = sorted(j.id for j in jobs)
    _age_stamps(conn, 120)
    assert _workers(conn) == {}  # a child that has not beaten has no row

    held = db.heartbeat(conn, S, ids, jobs[0].lease)

    assert held == set(ids)
    workers = _workers(conn)
    assert list(workers) == ["h:1:0:0:0"] and workers["h:1:0:0:0"] < 30
    assert min(_stamp_ages(conn, ids)) >= 119  # the jobs' rows were not written
    # and every job is alive by its owner's beat: what the API reads, and what rescue reads
    now = db.db_now(conn, S)
    for r in db.get_jobs(conn, S, ids).values():
        assert r.worker_alive_at is not None and (now - r.worker_alive_at).total_seconds() < 30
    assert db.rescue(conn, S, dead_after=30) == []


def test_a_job_is_rescued_only_when_its_stamp_and_its_owners_beat_are_both_old(
    conn: Conn,
) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t"), pgq.NewJob("t")])
    (quiet,) = claim(conn, ["t"], limit=1, worker_id="quiet")
    (beating,) = claim(conn, ["t"], limit=1, worker_id="beating")
    assert db.heartbeat(conn, S, [quiet.id], quiet.lease) == {quiet.id}
    assert db.heartbeat(conn, S, [beating.id], beating.lease) == {beating.id}
    _age_stamps(conn, 120)
    conn.execute("UPDATE pgq.worker SET alive_at = now() - interval '2 min' WHERE id = 'quiet'")

    ended = db.rescue(conn, S, dead_after=30)

    assert [e.job_id for e in ended] == [quiet.id]
    assert db.get_job(conn, S, beating.id).state is pgq.JobState.RUNNING


def test_while_an_older_supervisor_is_registered_jobs_rows_are_beaten_too(conn: Conn) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t"), pgq.NewJob("t")])
    jobs = claim(conn, ["t"], limit=2, worker_id="h:1:0:0:0")
    ids = sorted(j.id for j in jobs)
    _register(conn, "new:1:0")  # this version's supervisor: its children beat their own rows
    _age_stamps(conn, 120)
    db.heartbeat(conn, S, ids, jobs[0].lease)
    assert min(_stamp_ages(conn, ids)) >= 119

    # a supervisor of a version before 25 judges jobs by worker_alive_at alone (a rolling
    # upgrade): its row says nothing of child beats
    _register(conn, "old:1:0")
    conn.execute("UPDATE pgq.supervisor SET child_beats = false WHERE id = 'old:1:0'")
    assert db.heartbeat(conn, S, ids, jobs[0].lease) == set(ids)
    assert max(_stamp_ages(conn, ids)) < 30

    # once it is gone, the jobs' rows are left alone again
    conn.execute("DELETE FROM pgq.supervisor WHERE id = 'old:1:0'")
    _age_stamps(conn, 120)
    db.heartbeat(conn, S, ids, jobs[0].lease)
    assert min(_stamp_ages(conn, ids)) >= 119


def test_a_childs_row_goes_when_it_leaves_and_stale_rows_with_the_hourly_sweep(
    conn: Conn,
) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("t"), pgq.NewJob("t")])
    (a,) = claim(conn, ["t"], limit=1, worker_id="a")
    (b,) = claim(conn, ["t"], limit=1, worker_id="b")
    db.heartbeat(conn, S, [a.id], a.lease)
    db.heartbeat(conn, S, [b.id], b.lease)
    assert sorted(_workers(conn)) == ["a", "b"]

    db.worker_gone(conn, S, "a")
    assert sorted(_workers(conn)) == ["b"]

    conn.execute("UPDATE pgq.worker SET alive_at = now() - interval '61 min'")
    _register(conn, "s:1:0")
    assert _workers(conn) == {}


def test_a_beat_of_nothing_held_writes_nothing(conn: Conn) -> None:
    pgq.enqueue(conn, "t")
    (job,) = claim(conn, ["t"], limit=1, worker_id="w")
    db.succeed(conn, S, job.lease, [(job.id, None)])

    assert db.heartbeat(conn, S, [job.id], job.lease) == set()
    assert _workers(conn) == {}
