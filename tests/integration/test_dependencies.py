"""Dependencies (issue 13): a job runs after the jobs it depends on have succeeded; a failed
or cancelled dependency cancels it (or not, under "run"); the edges are checked at enqueue."""

from __future__ import annotations

import asyncio
import random
import threading
import uuid

import psycopg
import pytest
from psycopg_pool import ConnectionPool

import pgq_supervisor as pgq
from pgq_supervisor import db, testing
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobId, JobState
from tests.property.invariants import violations
from tests.support.db import SCHEMA, claim, claim_one, count_rows, get, in_threads, listening


def _registry(fail: set[str] | None = None) -> pgq.Registry:
    """Handlers that return their payload's name (or fail for good for names in `fail`), and
    the results of their dependencies, so a dependent proves what it saw."""
    registry = pgq.Registry()
    failing = fail or set()

    @registry.handler("step", max_retry_count=0)
    def step(payload: dict[str, str], job: pgq.Job) -> dict[str, object]:
        if payload["name"] in failing:
            raise pgq.PermanentError(f"{payload['name']} fails")
        seen = {str(k): v for k, v in job.dependency_results.items()}
        return {"name": payload["name"], "saw": seen}

    return registry


def _succeed(conn: Conn, job_id: JobId, type_: str = "t") -> None:
    job = claim_one(conn, type_)
    assert job.id == job_id
    assert db.succeed(conn, SCHEMA, job.lease, [(job.id, '"done"')]) == {job_id}


def _fail(conn: Conn, job_id: JobId, type_: str = "t") -> None:
    job = claim_one(conn, type_)
    assert job.id == job_id
    db.end_attempt(
        conn, SCHEMA, [job.id], error="boom", kind=AttemptKind.PERMANENT, lease=job.lease,
        allow_retry=False,
    )  # fmt: skip


def test_a_diamond_runs_in_order_and_the_last_sees_both_results(conn: Conn) -> None:
    a = pgq.enqueue(conn, "step", {"name": "a"})
    b = pgq.enqueue(conn, "step", {"name": "b"}, depends_on=[a])
    c = pgq.enqueue(conn, "step", {"name": "c"}, depends_on=[a])
    d = pgq.enqueue(conn, "step", {"name": "d"}, depends_on=[b, c])
    assert [get(conn, i).waiting_on for i in (a, b, c, d)] == [0, 1, 1, 2]
    assert pgq.queue_depth(conn) == 1

    result = testing.drain(conn, _registry(), batch=10)
    assert result.succeeded == 4
    jobs = {i: get(conn, i) for i in (a, b, c, d)}
    for first, then in ((a, b), (a, c), (b, d), (c, d)):
        stopped, started = jobs[first].stopped_at, jobs[then].started_at
        assert stopped is not None and started is not None and stopped <= started
    assert jobs[d].depends_on == [b, c]
    assert jobs[d].result == {
        "name": "d",
        "saw": {str(b): jobs[b].result, str(c): jobs[c].result},
    }
    assert jobs[a].has_dependents and not jobs[d].has_dependents


def test_a_failed_dependency_cancels_the_dependent_and_its_dependents(conn: Conn, dsn: str) -> None:
    a = pgq.enqueue(conn, "t")
    b = pgq.enqueue(conn, "t", depends_on=[a])
    c = pgq.enqueue(conn, "t", depends_on=[b])
    other = pgq.enqueue(conn, "t")
    with listening(dsn, "pgq_job_stopped") as listener:
        _fail(conn, a)
        notified = listener.collect()["pgq_job_stopped"]
    assert get(conn, b).state is JobState.CANCELLED
    assert get(conn, b).error_msg == f"dependency {a} failed"
    assert get(conn, b).error_data == {"dependency": str(a), "dependency_state": "failed"}
    assert get(conn, c).error_msg == f"dependency {b} cancelled"
    assert {str(b), str(c)} <= {i for payload in notified for i in payload.split(",")}
    assert (get(conn, other).state, get(conn, other).waiting_on) == (JobState.PENDING, 0)


def test_under_run_a_failed_dependency_releases_the_dependent(conn: Conn, dsn: str) -> None:
    a = pgq.enqueue(conn, "t")
    b = pgq.enqueue(conn, "t")
    d = pgq.enqueue(conn, "u", depends_on=[a, b], on_dependency_failure="run")
    _fail(conn, a)
    assert (get(conn, d).state, get(conn, d).waiting_on) == (JobState.PENDING, 1)
    with listening(dsn, "pgq_job_available") as listener:
        _succeed(conn, b)
        assert listener.collect()["pgq_job_available"] == ["u"]  # d became claimable
    job = claim_one(conn, "u")
    assert job.id == d and job.dependencies == (a, b)
    assert job.dependency_results == {a: None, b: "done"}


def test_a_diamond_with_a_failed_branch_under_a_supervisor_free_drain(conn: Conn) -> None:
    a = pgq.enqueue(conn, "step", {"name": "a"})
    b = pgq.enqueue(conn, "step", {"name": "b"}, depends_on=[a])
    c = pgq.enqueue(conn, "step", {"name": "c"}, depends_on=[a])
    d = pgq.enqueue(conn, "step", {"name": "d"}, depends_on=[b, c])
    result = testing.drain(conn, _registry(fail={"b"}))
    assert (result.succeeded, result.failed) == (2, 1)
    assert get(conn, d).state is JobState.CANCELLED
    assert get(conn, d).error_msg == f"dependency {b} failed"
    assert get(conn, d).started_at is None


def test_a_completion_riding_on_a_claim_releases_its_dependents_for_the_next_claim(
    conn: Conn,
) -> None:
    """succeed_and_claim writes the batch before claim_pick picks (so a concurrency limit
    counts the slots it frees); the dependents it releases are released by an AFTER trigger at
    the end of that statement, so its own claim does not see them, nothing fails, and the next
    claim takes them."""
    first = pgq.enqueue(conn, "t", {}, schema=SCHEMA)
    dependent = pgq.enqueue(conn, "t", {}, depends_on=[first], schema=SCHEMA)
    job = claim_one(conn, "t")
    done, jobs = db.succeed_and_claim(
        conn, SCHEMA, job.lease, [(job.id, None)],
        worker_id="w", types=["t"], max_retry_counts=[3], limit=10,
    )  # fmt: skip
    assert (done, jobs) == ({first}, [])
    assert [j.id for j in claim(conn, ["t"], limit=10)] == [dependent]


def test_an_unknown_dependency_is_named_and_nothing_is_written(conn: Conn) -> None:
    a = pgq.enqueue(conn, "t")
    ghost = JobId(uuid.uuid4())
    with pytest.raises(pgq.InvalidInput, match=f"unknown dependency {ghost}"):
        pgq.enqueue(conn, "t", depends_on=[a, ghost])
    batch = [pgq.NewJob("t", depends_on=[a]), pgq.NewJob("t", depends_on=[ghost])]
    with pytest.raises(pgq.InvalidInput, match=f"unknown dependency {ghost}"):
        pgq.enqueue_many(conn, batch)
    with pytest.raises(pgq.InvalidInput, match=f"unknown dependency {ghost}"):
        pgq.enqueue_bundle(conn, "b", batch)
    assert count_rows(conn) == 1
    assert count_rows(conn, "job_dependency") == 0
    assert count_rows(conn, "job_bundle") == 0
    assert not get(conn, a).has_dependents
    with pytest.raises(pgq.InvalidInput, match="not a job id"):
        pgq.enqueue(conn, "t", depends_on=["nope"])
    with pytest.raises(pgq.InvalidInput, match="on_dependency_failure"):
        pgq.enqueue(conn, "t", depends_on=[a], on_dependency_failure="skip")  # type: ignore[arg-type]


def test_dependencies_finished_before_the_enqueue_apply_at_once(conn: Conn) -> None:
    ok, bad = pgq.enqueue(conn, "t"), pgq.enqueue(conn, "t")
    _succeed(conn, ok)
    _fail(conn, bad)
    ready = pgq.enqueue(conn, "u", depends_on=[ok])
    doomed = pgq.enqueue(conn, "u", depends_on=[ok, bad])
    runs = pgq.enqueue(conn, "u", depends_on=[bad], on_dependency_failure="run")
    assert (get(conn, ready).state, get(conn, ready).waiting_on) == (JobState.PENDING, 0)
    assert get(conn, doomed).state is JobState.CANCELLED
    assert get(conn, doomed).error_msg == f"dependency {bad} failed"
    assert get(conn, runs).waiting_on == 0
    assert {j.id for j in claim(conn, ["u"], limit=5)} == {ready, runs}


def test_a_batch_and_a_bundle_depend_on_jobs_enqueued_earlier_in_the_transaction(
    conn: Conn,
) -> None:
    with conn.transaction():
        (first,) = pgq.enqueue_many(conn, [pgq.NewJob("t")])
        ids = pgq.enqueue_many(
            conn, [pgq.NewJob("u", depends_on=[first]), pgq.NewJob("u", {"n": 2})]
        )
        bundle = pgq.enqueue_bundle(conn, "b", [pgq.NewJob("u", depends_on=[first, ids[0]])])
    assert [get(conn, i).waiting_on for i in ids] == [1, 0]
    _succeed(conn, first)
    assert get(conn, ids[0]).waiting_on == 0
    (bundled,) = [j for j in db.list_jobs(conn, SCHEMA, JobState.PENDING, "u", 10) if j.bundle_id]
    assert bundled.waiting_on == 1
    (job,) = [j for j in claim(conn, ["u"], limit=5) if j.id == ids[0]]
    db.end_attempt(
        conn, SCHEMA, [job.id], error="no", kind=AttemptKind.PERMANENT, lease=job.lease,
        allow_retry=False,
    )  # fmt: skip
    assert get(conn, bundled.id).state is JobState.CANCELLED
    assert pgq.get_bundle(conn, bundle.id).is_complete  # a cancelled dependent counts as stopped


def test_a_reset_dependency_counts_again_for_the_dependents_still_waiting(conn: Conn) -> None:
    a, b = pgq.enqueue(conn, "t"), pgq.enqueue(conn, "t")
    d = pgq.enqueue(conn, "u", depends_on=[a, b])
    released = pgq.enqueue(conn, "u", depends_on=[a])
    _succeed(conn, a)
    assert (get(conn, d).waiting_on, get(conn, released).waiting_on) == (1, 0)
    pgq.reset_job(conn, a)
    # d waits for a again; the released job stays released
    assert (get(conn, d).waiting_on, get(conn, released).waiting_on) == (2, 0)
    assert violations(conn) == []
    _succeed(conn, a)
    _succeed(conn, b)
    assert get(conn, d).waiting_on == 0


def test_a_reset_dependent_recounts_its_dependencies(conn: Conn) -> None:
    a, b = pgq.enqueue(conn, "t"), pgq.enqueue(conn, "t")
    d = pgq.enqueue(conn, "u", depends_on=[a, b])
    _succeed(conn, a)
    _fail(conn, b)
    assert get(conn, d).state is JobState.CANCELLED
    pgq.reset_job(conn, d)  # waits for b, which failed, until b is reset and succeeds
    assert (get(conn, d).state, get(conn, d).waiting_on) == (JobState.PENDING, 1)
    assert claim(conn, ["u"]) == []
    pgq.reset_job(conn, b)
    assert violations(conn) == []
    _succeed(conn, b)
    assert claim_one(conn, "u").id == d


def test_cancelling_a_waiting_job_cascades(conn: Conn) -> None:
    a = pgq.enqueue(conn, "t")
    b = pgq.enqueue(conn, "t", depends_on=[a])
    c = pgq.enqueue(conn, "t", depends_on=[b])
    pgq.cancel_job(conn, b)
    assert (get(conn, b).state, get(conn, b).waiting_on) == (JobState.CANCELLED, 0)
    assert get(conn, c).error_msg == f"dependency {b} cancelled"
    _succeed(conn, a)


def test_waiting_jobs_are_counted_apart_from_ready_and_delayed(conn: Conn) -> None:
    a = pgq.enqueue(conn, "t")
    pgq.enqueue_many(conn, [pgq.NewJob("t", depends_on=[a]) for _ in range(3)])
    (stats,) = pgq.queue_stats(conn)
    assert (stats.count, stats.ready, stats.waiting) == (4, 1, 3)
    assert pgq.queue_depth(conn) == 1
    assert db.next_due(conn, SCHEMA, ["t"]) is None


def test_random_graphs_complete_in_any_order_and_keep_the_rules(conn: Conn) -> None:
    """Random DAGs (edges only to earlier jobs), completed in random claim orders with random
    outcomes, random cancels and resets: a job runs only after every dependency succeeded (or
    ended, under "run"), a job cancelled by the rule names a dependency that failed or was
    cancelled, and D1 (waiting_on counts exactly the unmet dependencies) holds at every step.
    Jobs that depend on a job that was reset are exempt from the first two: a reset does not
    recall dependents already released (README)."""
    rng = random.Random(13)
    for _round in range(6):
        ids: list[JobId] = []
        rules: dict[JobId, str] = {}
        was_reset: set[JobId] = set()
        for _n in range(25):
            deps = rng.sample(ids, k=min(len(ids), rng.randint(0, 3)))
            rule = rng.choice(["cancel", "run"])
            job_id = pgq.enqueue(
                conn,
                "g",
                depends_on=deps,
                on_dependency_failure=rule,  # type: ignore[arg-type]
            )
            ids.append(job_id)
            rules[job_id] = rule
        while True:
            batch = claim(conn, ["g"], limit=rng.randint(1, 4))
            if not batch:
                break
            for job in batch:
                for dep in set(job.dependencies) - was_reset:
                    state = get(conn, dep).state
                    assert state is JobState.SUCCEEDED or (
                        rules[job.id] == "run" and state.is_terminal
                    ), (job.id, dep, state)
            rng.shuffle(batch)
            for job in batch:
                if rng.random() < 0.2:
                    db.end_attempt(
                        conn, SCHEMA, [job.id], error="x", kind=AttemptKind.PERMANENT,
                        lease=job.lease, allow_retry=False,
                    )  # fmt: skip
                else:
                    db.succeed(conn, SCHEMA, job.lease, [(job.id, None)])
            target = rng.choice(ids)
            state = get(conn, target).state
            if state.is_terminal and len(was_reset) < 6 and rng.random() < 0.3:
                pgq.reset_job(conn, target)
                was_reset.add(target)
            elif state is JobState.PENDING and rng.random() < 0.1:
                pgq.cancel_job(conn, target)
            assert violations(conn) == []
        for job_id in ids:
            record = get(conn, job_id)
            if not record.state.is_terminal:
                # only a reset job waits on a failed dependency (or on a job that does)
                assert record.state is JobState.PENDING and record.waiting_on > 0, record
                assert was_reset, record
                continue
            if record.state is JobState.CANCELLED and record.error_data is not None:
                assert isinstance(record.error_data, dict)
                named = record.error_data["dependency"]
                assert isinstance(named, str) and record.depends_on is not None
                assert JobId(uuid.UUID(named)) in record.depends_on
                if JobId(uuid.UUID(named)) in was_reset:
                    continue
                assert get(conn, JobId(uuid.UUID(named))).state in (
                    JobState.FAILED,
                    JobState.CANCELLED,
                )


def _end_at_once(dsn: str, batches: list[list[pgq.Job]], failing: int) -> set[JobId]:
    """Each batch ended on its own connection, all released together by a barrier: the
    first `failing` batches fail for good, the others succeed. Returns the ids written."""
    start = threading.Barrier(len(batches))

    def end(i: int) -> set[JobId]:
        batch = batches[i]
        with psycopg.connect(dsn, autocommit=True) as own:
            start.wait(timeout=30)
            if i < failing:
                ended = db.end_attempt(
                    own, SCHEMA, [job.id for job in batch], error="x",
                    kind=AttemptKind.PERMANENT, lease=batch[0].lease, allow_retry=False,
                )  # fmt: skip
                return {e.job_id for e in ended}
            return db.succeed(own, SCHEMA, batch[0].lease, [(job.id, None) for job in batch])

    return set().union(*in_threads(len(batches), end))


def test_dependencies_of_shared_dependents_end_concurrently_without_deadlock(
    conn: Conn, dsn: str
) -> None:
    """Batches that end dependencies of the same dependents (some succeed, some fail), at the
    same moment, from several connections: every write lands, and every dependent is released
    or cancelled exactly as its dependencies ended (without the ordered pre-lock of `succeed`
    and `end_attempt` this deadlocks)."""
    rng = random.Random(7)
    workers = 4
    for _round in range(8):
        deps = pgq.enqueue_many(conn, [pgq.NewJob("t") for _ in range(workers * 4)])
        dependents = {
            pgq.enqueue(conn, "u", depends_on=(its := rng.sample(deps, k=rng.randint(2, 6)))): its
            for _ in range(30)
        }
        batches = [claim(conn, ["t"], worker_id=f"w{i}", limit=4) for i in range(workers)]
        for batch in batches:
            rng.shuffle(batch)  # each batch ends its jobs in a different order
        failing = {job.id for job in batches[0] + batches[1]}
        assert _end_at_once(dsn, batches, failing=2) == set(deps)
        assert violations(conn) == []
        for job_id, its in dependents.items():
            record = get(conn, job_id)
            if failing & set(its):
                assert record.state is JobState.CANCELLED, record
            else:
                assert (record.state, record.waiting_on) == (JobState.PENDING, 0), record
        for job in claim(conn, ["u"], limit=100):
            db.succeed(conn, SCHEMA, job.lease, [(job.id, None)])


def test_a_failure_cancels_a_long_chain_of_dependents_in_one_go(conn: Conn) -> None:
    """One recursive statement, not a trigger call per level: 1,000 levels once exhausted
    PostgreSQL's stack and the failure could not be written at all."""
    first = previous = pgq.enqueue(conn, "t")
    chain = []
    for _ in range(1000):
        previous = pgq.enqueue(conn, "u", depends_on=[previous])
        chain.append(previous)
    _fail(conn, first)
    assert count_rows(conn, where="state = 'cancelled'") == 1000
    assert get(conn, chain[0]).error_msg == f"dependency {first} failed"
    assert get(conn, chain[-1]).error_msg == f"dependency {chain[-2]} cancelled"
    assert violations(conn) == []


def test_enqueue_async_and_the_producer_take_dependencies(dsn: str, conn: Conn) -> None:
    first = pgq.enqueue(conn, "t")
    ghost = JobId(uuid.uuid4())

    async def scenario() -> pgq.JobId:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            with pytest.raises(pgq.InvalidInput, match=f"unknown dependency {ghost}"):
                await pgq.enqueue_async(aconn, "u", depends_on=[ghost])
            return await pgq.enqueue_async(
                aconn, "u", depends_on=[first], on_dependency_failure="run"
            )

    dependent = asyncio.run(scenario())
    with ConnectionPool(dsn, min_size=1, max_size=1, open=True) as pool:
        via_pool = pgq.Producer(pool).enqueue("u", depends_on=[first])
    assert count_rows(conn) == 3
    assert [get(conn, i).waiting_on for i in (dependent, via_pool)] == [1, 1]
    assert get(conn, dependent).on_dependency_failure == "run"
    _fail(conn, first)
    assert get(conn, dependent).waiting_on == 0
    assert get(conn, via_pool).state is JobState.CANCELLED


def _enqueue_while_ending(
    dsn: str, after: list[pgq.NewJob], batch: list[pgq.Job], fail: bool
) -> list[JobId]:
    """Enqueue `after` on one connection while another ends `batch` (in reverse order), both
    released together by a barrier; returns the enqueued ids."""
    start = threading.Barrier(2)

    def race(i: int) -> list[JobId]:
        with psycopg.connect(dsn, autocommit=True) as own:
            start.wait(timeout=30)
            if i == 0:
                return pgq.enqueue_many(own, after)
            if fail:
                db.end_attempt(
                    own, SCHEMA, [job.id for job in batch], error="x",
                    kind=AttemptKind.PERMANENT, lease=batch[0].lease, allow_retry=False,
                )  # fmt: skip
            else:
                results = [(job.id, None) for job in reversed(batch)]
                db.succeed(own, SCHEMA, batch[0].lease, results)
            return []

    return in_threads(2, race)[0]


def test_enqueue_racing_the_end_of_its_dependencies_never_strands_a_job(
    conn: Conn, dsn: str
) -> None:
    """Dependents enqueued at the moment their dependencies end (succeed, or fail) are
    released (or cancelled) all the same: the enqueue locks the dependencies, so either their
    end committed first and is read, or it waits and then finds the new edges."""
    rng = random.Random(3)
    for _round in range(15):
        deps = pgq.enqueue_many(conn, [pgq.NewJob("t") for _ in range(4)])
        (batch,) = [claim(conn, ["t"], limit=4)]
        fail = rng.random() < 0.3
        after = [pgq.NewJob("u", depends_on=rng.sample(deps, 4)) for _ in range(5)]
        dependents = _enqueue_while_ending(dsn, after, batch, fail)
        assert violations(conn) == []
        for job_id in dependents:
            record = get(conn, job_id)
            if fail:
                assert record.state is JobState.CANCELLED, record
            else:
                assert (record.state, record.waiting_on) == (JobState.PENDING, 0), record
        for job in claim(conn, ["u"], limit=10):
            db.succeed(conn, SCHEMA, job.lease, [(job.id, None)])


def test_deleting_a_dependency_by_hand_cancels_or_releases_its_waiting_dependents(
    conn: Conn,
) -> None:
    a, b = pgq.enqueue(conn, "t"), pgq.enqueue(conn, "v")
    doomed = pgq.enqueue(conn, "u", depends_on=[a])
    runs = pgq.enqueue(conn, "u", depends_on=[a, b], on_dependency_failure="run")
    later = pgq.enqueue(conn, "u", depends_on=[doomed])
    _succeed(conn, b, "v")
    released = pgq.enqueue(conn, "u", depends_on=[b])
    conn.execute("DELETE FROM pgq.job WHERE id = ANY(%s)", ([a, b],))
    assert get(conn, doomed).error_msg == f"dependency {a} deleted"
    assert get(conn, later).error_msg == f"dependency {doomed} cancelled"
    assert (get(conn, runs).state, get(conn, runs).waiting_on) == (JobState.PENDING, 0)
    assert get(conn, released).waiting_on == 0
    assert violations(conn) == []
    assert count_rows(conn, "job_dependency") == 1  # later -> doomed
