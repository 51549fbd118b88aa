"""Workflows (issue 26) in-process, through pgq.testing.drain (the worker's run_sync and the
one completer): steps checkpointed and replayed, `conn` steps exactly once, per-step retries,
sleeps and waits as suspensions (no attempt counted), signals before and after the wait, wait
timeouts, child jobs, a replay that reaches another step refused, ctx.patched."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db, testing
from pgq_supervisor.db import Conn
from pgq_supervisor.db import workflows as wdb
from pgq_supervisor.jobs import LeaseToken
from tests.support.db import claim_one, get, make_due

S = "pgq"


def _steps(conn: Conn, job_id: pgq.JobId) -> list[tuple[str, str, str]]:
    return [(s.kind, s.name, s.state) for s in wdb.steps(conn, S, job_id)]


def _wake(conn: Conn, job_id: pgq.JobId) -> None:
    """As if the time had come: its sleep or wait deadline passed, the job due."""
    conn.execute(
        "UPDATE pgq.workflow_step SET wake_at = now() - interval '1 s'"
        " WHERE job_id = %s AND wake_at IS NOT NULL",
        (job_id,),
    )
    make_due(conn, job_id)


def _effects(conn: Conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT what FROM effects ORDER BY what").fetchall()]


@pytest.fixture
def effects(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE effects (what text NOT NULL)")
    return conn


def _write(what: str, conn: Conn) -> str:
    conn.execute("INSERT INTO effects VALUES (%s)", (what,))
    return what


def test_steps_run_once_and_a_replay_returns_their_stored_results(effects: Conn) -> None:
    registry = pgq.Registry()
    calls: list[str] = []

    def plain(x: int) -> dict[str, object]:
        calls.append("plain")
        return {"x": x, "t": (1, 2)}

    @registry.workflow("flow")
    def flow(ctx: pgq.WorkflowContext, payload: dict[str, int]) -> object:
        a = ctx.step("plain", plain, payload["n"])
        b = ctx.step("write", _write, "w1")
        ctx.sleep("nap", 60)
        c = ctx.step("after", _write, "w2")
        return {"a": a, "b": b, "c": c}

    job_id = pgq.enqueue(effects, "flow", {"n": 5})
    assert testing.drain(effects, registry).suspended == 1
    rec = get(effects, job_id)
    assert rec.state is pgq.JobState.PENDING and rec.current_retry_count == 0
    assert rec.start_at > db.db_now(effects, S) + timedelta(seconds=50)
    assert _steps(effects, job_id) == [
        ("step", "plain", "succeeded"),
        ("step", "write", "succeeded"),
        ("sleep", "nap", "sleeping"),
    ]
    _wake(effects, job_id)
    assert testing.drain(effects, registry).succeeded == 1
    rec = get(effects, job_id)
    assert rec.result == {"a": {"x": 5, "t": [1, 2]}, "b": "w1", "c": "w2"}
    assert rec.current_retry_count == 0 and rec.attempts == []
    assert calls == ["plain"]  # replayed, not run again
    assert _effects(effects) == ["w1", "w2"]
    assert [s for s in _steps(effects, job_id)][2] == ("sleep", "nap", "succeeded")


def test_a_conn_step_whose_lease_is_lost_writes_nothing(effects: Conn) -> None:
    registry = pgq.Registry()

    def steal(conn: Conn) -> None:
        # another worker took the job meanwhile (a rescue and a new claim): new lease
        conn.execute("INSERT INTO effects VALUES ('stale')")
        with db.connect(effects.info.dsn) as other:
            other.execute("UPDATE pgq.job SET lease = gen_random_uuid()")

    @registry.workflow("flow")
    def flow(ctx: pgq.WorkflowContext, payload: object) -> None:
        ctx.step("steal", steal)

    job_id = pgq.enqueue(effects, "flow", {})
    testing.drain(effects, registry)
    assert _effects(effects) == []
    assert _steps(effects, job_id) == []


def test_a_failing_step_is_retried_with_the_backoff_without_counting_an_attempt(
    conn: Conn,
) -> None:
    registry = pgq.Registry()
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError(f"flake {len(tries)}")
        return "ok"

    @registry.workflow("flow", max_retry_count=2, retry=pgq.RetryPolicy(base=30, cap=30))
    def flow(ctx: pgq.WorkflowContext, payload: object) -> object:
        ctx.step("first", lambda: "one")
        return ctx.step("flaky", flaky)

    job_id = pgq.enqueue(conn, "flow", {})
    for _ in range(2):
        assert testing.drain(conn, registry).suspended == 1
        (_, flaky_step) = wdb.steps(conn, S, job_id)
        assert (flaky_step.state, flaky_step.error) == (
            "retrying",
            f"RuntimeError: flake {len(tries)}",
        )
        _wake(conn, job_id)
    assert testing.drain(conn, registry).succeeded == 1
    assert get(conn, job_id).result == "ok" and get(conn, job_id).current_retry_count == 0
    assert wdb.steps(conn, S, job_id)[1].tries == 3


def test_a_step_out_of_tries_raises_step_failed_which_the_workflow_may_catch(
    conn: Conn,
) -> None:
    registry = pgq.Registry()

    def broken() -> None:
        raise RuntimeError("no")

    @registry.workflow("caught", max_retry_count=0)
    def caught(ctx: pgq.WorkflowContext, payload: object) -> object:
        try:
            ctx.step("broken", broken)
        except pgq.StepFailed as exc:
            ctx.sleep("then", 60)
            return {"compensated": exc.step}
        return None

    @registry.workflow("uncaught", max_retry_count=0)
    def uncaught(ctx: pgq.WorkflowContext, payload: object) -> None:
        ctx.step("broken", broken)

    a = pgq.enqueue(conn, "caught", {})
    b = pgq.enqueue(conn, "uncaught", {})
    testing.drain(conn, registry)
    _wake(conn, a)
    testing.drain(conn, registry)  # replays the failure: no second try
    assert get(conn, a).result == {"compensated": "broken"}
    assert wdb.steps(conn, S, a)[0].tries == 1
    rec = get(conn, b)
    assert rec.state is pgq.JobState.FAILED
    assert rec.error_msg == "StepFailed: step 'broken' failed: RuntimeError: no"


def _waiting() -> pgq.Registry:
    registry = pgq.Registry()

    @registry.workflow("approve")
    def approve(ctx: pgq.WorkflowContext, payload: dict[str, float]) -> object:
        try:
            answer = ctx.wait_for("approved", timeout=payload.get("timeout"))
        except pgq.WaitTimeout:
            return "timed out"
        return {"answer": answer}

    return registry


def test_a_signal_sent_after_the_wait_wakes_the_workflow_at_once(conn: Conn) -> None:
    registry = _waiting()
    job_id = pgq.enqueue(conn, "approve", {})
    assert testing.drain(conn, registry).suspended == 1
    assert get(conn, job_id).start_at > db.db_now(conn, S) + timedelta(days=365)
    assert _steps(conn, job_id) == [("wait", "approved", "waiting")]
    assert testing.drain(conn, registry).outcomes == []  # not due
    assert pgq.signal(conn, job_id, "approved", {"by": "ann"}) is True
    assert pgq.signal(conn, job_id, "approved", {"by": "bob"}) is False  # the first wins
    assert get(conn, job_id).start_at <= db.db_now(conn, S)
    assert testing.drain(conn, registry).succeeded == 1
    assert get(conn, job_id).result == {"answer": {"by": "ann"}}


def test_a_signal_sent_before_the_wait_is_kept(conn: Conn) -> None:
    registry = _waiting()
    job_id = pgq.enqueue(conn, "approve", {})
    pgq.signal(conn, job_id, "approved", 42)
    assert testing.drain(conn, registry).succeeded == 1
    assert get(conn, job_id).result == {"answer": 42}


def test_a_signal_is_part_of_the_callers_transaction(conn: Conn) -> None:
    registry = _waiting()
    job_id = pgq.enqueue(conn, "approve", {})
    testing.drain(conn, registry)
    with pytest.raises(RuntimeError), conn.transaction():
        pgq.signal(conn, job_id, "approved", 1)
        raise RuntimeError("rolled back")
    assert get(conn, job_id).start_at > db.db_now(conn, S) + timedelta(days=365)
    assert testing.drain(conn, registry).outcomes == []


def test_a_wait_past_its_timeout_raises_wait_timeout(conn: Conn) -> None:
    registry = _waiting()
    job_id = pgq.enqueue(conn, "approve", {"timeout": 30})
    testing.drain(conn, registry)
    rec = get(conn, job_id)
    assert timedelta(seconds=25) < rec.start_at - db.db_now(conn, S) <= timedelta(seconds=30)
    _wake(conn, job_id)
    assert testing.drain(conn, registry).succeeded == 1
    assert get(conn, job_id).result == "timed out"
    assert _steps(conn, job_id) == [("wait", "approved", "timed_out")]


def test_signal_to_an_unknown_job_or_with_a_bad_name_is_refused(conn: Conn) -> None:
    with pytest.raises(pgq.JobNotFound):
        pgq.signal(conn, pgq.JobId(uuid.uuid4()), "x")
    job_id = pgq.enqueue(conn, "t", {})
    with pytest.raises(pgq.InvalidInput, match="signal name"):
        pgq.signal(conn, job_id, "")
    with pytest.raises(pgq.InvalidInput, match="signal payload"):
        pgq.signal(conn, job_id, "x", {"bad": object()})  # type: ignore[dict-item]


def test_a_child_job_is_enqueued_once_and_its_end_wakes_the_workflow(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("child")
    def child(payload: dict[str, int]) -> int:
        return payload["n"] * 2

    @registry.workflow("parent")
    def parent(ctx: pgq.WorkflowContext, payload: object) -> object:
        kid = ctx.enqueue("spawn", "child", {"n": 21})
        return ctx.wait(kid)

    job_id = pgq.enqueue(conn, "parent", {})
    result = testing.drain(conn, registry, ignore=["child"])
    assert result.suspended == 1
    (kid,) = [pgq.JobId(r[0]) for r in conn.execute("SELECT id FROM pgq.job WHERE type = 'child'")]
    assert get(conn, kid).workflow_parent == job_id
    assert get(conn, job_id).start_at > db.db_now(conn, S) + timedelta(days=365)
    testing.drain(conn, registry)  # the child runs, its end makes the parent due, it ends
    assert get(conn, job_id).result == 42
    assert conn.execute("SELECT count(*) FROM pgq.job WHERE type = 'child'").fetchone() == (1,)


def test_a_child_that_fails_raises_child_failed(conn: Conn) -> None:
    registry = pgq.Registry()

    @registry.handler("child", max_retry_count=0)
    def child(payload: object) -> None:
        raise RuntimeError("kid broke")

    @registry.workflow("parent")
    def parent(ctx: pgq.WorkflowContext, payload: object) -> object:
        try:
            return ctx.wait(ctx.enqueue("spawn", "child"))
        except pgq.ChildFailed as exc:
            return {"state": exc.state, "error": exc.error}

    job_id = pgq.enqueue(conn, "parent", {})
    testing.drain(conn, registry)
    assert get(conn, job_id).result == {"state": "failed", "error": "RuntimeError: kid broke"}


def test_a_replay_that_reaches_another_step_fails_the_job_naming_it(conn: Conn) -> None:
    old = pgq.Registry()

    @old.workflow("flow")
    def v1(ctx: pgq.WorkflowContext, payload: object) -> None:
        ctx.step("charge", lambda: 1)
        ctx.sleep("nap", 60)

    new = pgq.Registry()

    @new.workflow("flow")
    def v2(ctx: pgq.WorkflowContext, payload: object) -> None:
        ctx.step("email", lambda: 1)
        ctx.sleep("nap", 60)

    job_id = pgq.enqueue(conn, "flow", {})
    testing.drain(conn, old)
    _wake(conn, job_id)
    testing.drain(conn, new)
    rec = get(conn, job_id)
    assert rec.state is pgq.JobState.FAILED
    assert rec.error_msg is not None
    assert "step 1 is step 'charge' in its history but the code now reaches step 'email'" in (
        rec.error_msg
    )


def test_patched_keeps_old_runs_on_the_old_path_and_new_runs_on_the_new(conn: Conn) -> None:
    old = pgq.Registry()

    @old.workflow("flow")
    def v1(ctx: pgq.WorkflowContext, payload: object) -> None:
        ctx.step("charge", lambda: 1)
        ctx.sleep("nap", 60)

    new = pgq.Registry()

    @new.workflow("flow")
    def v2(ctx: pgq.WorkflowContext, payload: object) -> str:
        if ctx.patched("email-first"):
            ctx.step("email", lambda: 1)
        else:
            ctx.step("charge", lambda: 1)
        ctx.sleep("nap", 60)
        return "new" if ctx.patched("email-first-done") else "?"

    before = pgq.enqueue(conn, "flow", {})
    testing.drain(conn, old)
    after = pgq.enqueue(conn, "flow", {})
    testing.drain(conn, new)
    for job_id in (before, after):
        _wake(conn, job_id)
    testing.drain(conn, new)
    assert get(conn, before).state is pgq.JobState.SUCCEEDED
    assert [n for _, n, _ in _steps(conn, before)] == ["charge", "nap", "email-first-done"]
    assert [n for _, n, _ in _steps(conn, after)] == ["email-first", "email", "nap",
                                                      "email-first-done"]  # fmt: skip


def test_a_sleeping_or_waiting_workflow_can_be_cancelled(conn: Conn) -> None:
    registry = _waiting()
    job_id = pgq.enqueue(conn, "approve", {})
    testing.drain(conn, registry)
    assert pgq.cancel_job(conn, job_id) is pgq.JobState.PENDING
    pgq.signal(conn, job_id, "approved", 1)  # kept, wakes nothing
    assert get(conn, job_id).state is pgq.JobState.CANCELLED
    assert testing.drain(conn, registry).outcomes == []


def test_a_signal_that_commits_while_the_workflow_is_still_running_is_not_lost(
    conn: Conn,
) -> None:
    """The run saw no signal and recorded its wait; the signal commits while the job is still
    running (nothing to wake yet); then the run's suspension is written: it must find the
    signal and leave the job due now, not asleep until its deadline."""
    pgq.enqueue(conn, "approve", {})
    job = claim_one(conn, "approve", worker_id="w")
    params = wdb.record_params(job.id, job.lease, 0, "approved", "wait", "waiting")
    assert wdb.record(conn, S, params) is not None
    assert pgq.signal(conn, job.id, "approved", "yes") is True
    assert get(conn, job.id).state is pgq.JobState.RUNNING
    (ended,) = wdb.suspend(conn, S, job.id, lease=job.lease, delay=3600, wait="approved")
    assert ended.new_state is pgq.JobState.PENDING
    assert get(conn, job.id).start_at <= db.db_now(conn, S)
    assert testing.drain(conn, _waiting()).succeeded == 1
    assert get(conn, job.id).result == {"answer": "yes"}


def test_a_suspension_by_a_worker_that_lost_the_job_writes_nothing(conn: Conn) -> None:
    pgq.enqueue(conn, "approve", {})
    job = claim_one(conn, "approve", worker_id="w")
    stale = LeaseToken(uuid.uuid4())
    assert wdb.suspend(conn, S, job.id, lease=stale, delay=60, wait=None) == []
    assert get(conn, job.id).state is pgq.JobState.RUNNING
    params = wdb.record_params(job.id, stale, 0, "approved", "wait", "waiting")
    assert wdb.record(conn, S, params) is None
