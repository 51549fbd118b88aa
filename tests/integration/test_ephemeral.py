"""`Registry.handler(..., ephemeral=True)`: a job of the type is deleted by the statement that
completes it, fenced by its lease like any completion; one in a bundle or with dependents is
kept (succeeded), so bundle counters and dependency results stay true; failures are kept."""

from __future__ import annotations

import pgq_supervisor as pgq
from pgq_supervisor import db, testing
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobState
from tests.support.db import claim, count_rows, get, listening

S = "pgq"


def registry() -> pgq.Registry:
    r = pgq.Registry()

    @r.handler("ping", ephemeral=True)
    def ping(payload: dict[str, int]) -> dict[str, int]:
        return {"n": payload.get("n", 0)}

    @r.handler("kept")
    def kept(payload: dict[str, int]) -> None:
        return None

    @r.handler("bad", ephemeral=True, max_retry_count=0)
    def bad(payload: dict[str, int]) -> None:
        raise pgq.PermanentError("no")

    @r.handler("in_tx", ephemeral=True)
    def in_tx(payload: dict[str, int], conn: Conn) -> None:
        conn.execute("SELECT 1")

    return r


def states(conn: Conn) -> dict[str, list[str]]:
    rows = conn.execute("SELECT type, state::text FROM pgq.job ORDER BY type, state").fetchall()
    out: dict[str, list[str]] = {}
    for type_, state in rows:
        out.setdefault(type_, []).append(state)
    return out


def test_a_drain_leaves_no_row_of_an_ephemeral_type_and_keeps_the_rest(conn: Conn) -> None:
    assert registry().ephemeral_types() == {"ping", "bad", "in_tx"}
    jobs = [pgq.NewJob("ping", {"n": i}) for i in range(25)]
    jobs += [pgq.NewJob("kept"), pgq.NewJob("bad"), pgq.NewJob("in_tx")]
    pgq.enqueue_many(conn, jobs)
    with listening(conn.info.dsn, "pgq_job_stopped") as heard:
        # batches of 10: successes ride on the next claim (succeed_and_claim), the last
        # ones on a flush (succeed), the `conn` handler's in its own transaction
        result = testing.drain(conn, registry(), batch=10)
        stopped = heard.collect()["pgq_job_stopped"]
    assert (result.succeeded, result.failed) == (27, 1)
    assert states(conn) == {"bad": ["failed"], "kept": ["succeeded"]}
    # the deleted ones were announced as stopped, as any finished job
    assert sum(len(p.split(",")) for p in stopped) == 28


def test_the_delete_is_fenced_by_the_lease(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "ping")
    old = claim(conn, ["ping"])[0]
    # rescued and claimed again meanwhile: the old worker's success writes nothing
    db.end_attempt(conn, S, [job_id], error="lost", kind=AttemptKind.ERROR, lease=old.lease)
    new = claim(conn, ["ping"])[0]
    assert db.succeed(conn, S, old.lease, [(job_id, None)], [job_id]) == set()
    assert get(conn, job_id).state is JobState.RUNNING
    assert db.succeed(conn, S, new.lease, [(job_id, None)], [job_id]) == {job_id}
    assert count_rows(conn) == 0


def test_a_bundled_ephemeral_job_is_kept_and_the_bundle_completes_once(conn: Conn) -> None:
    bundle = pgq.enqueue_bundle(
        conn, "batch", [pgq.NewJob("ping"), pgq.NewJob("ping")], on_complete="kept"
    )
    jobs = claim(conn, ["ping"], limit=2)
    ids = [j.id for j in jobs]
    assert db.succeed(conn, S, jobs[0].lease, [(i, None) for i in ids], ids) == set(ids)
    after = pgq.get_bundle(conn, bundle.id)
    assert (after.num_jobs, after.num_jobs_stopped) == (2, 2)  # B1-B3
    assert states(conn) == {"kept": ["pending"], "ping": ["succeeded", "succeeded"]}  # B4


def test_an_ephemeral_dependency_is_kept_for_its_dependents_result(conn: Conn) -> None:
    first = pgq.enqueue(conn, "ping", {"n": 7})
    then = pgq.enqueue(conn, "kept", depends_on=[first])
    job = claim(conn, ["ping"])[0]
    assert db.succeed(conn, S, job.lease, [(first, '{"n": 7}')], [first]) == {first}
    assert get(conn, first).state is JobState.SUCCEEDED
    dependent = claim(conn, ["kept"])[0]
    assert dependent.id == then and dependent.dependency_results == {first: {"n": 7}}
