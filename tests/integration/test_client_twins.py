"""Every public call and its `_async` twin (issue 39), from the same test bodies: each test
runs once against the sync call on a psycopg Connection and once against the async one on a
psycopg.AsyncConnection, both on the test's real database. The twins are one plan each
(db/plans.py), so these tests are about behaviour; the last test holds the surface together."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Iterator
from typing import cast

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor.db import AsyncConn, Conn
from pgq_supervisor.jobs import JobId, JobState
from tests.support.db import claim_one, count_rows, finished, get

# The public calls that take a connection and have an async twin named `<call>_async`.
TWINNED = [
    "enqueue", "enqueue_many", "enqueue_bundle", "get_job", "get_bundle", "cancel_job",
    "reset_job", "pause", "resume", "set_tenant_weight", "retry_failed", "delete_finished",
    "queue_stats", "queue_depth", "migrate", "wait", "wait_many", "signal",
]  # fmt: skip


class Api:
    """The public API on one side, called as `api("get_job", job_id)`: the sync call on the
    test's connection, or the `_async` twin awaited on an AsyncConnection to the same database
    (autocommit both: each call's effect is committed when it returns)."""

    def __init__(self, kind: str, conn: Conn, aconn: AsyncConn | None, runner: asyncio.Runner):
        self.kind, self.conn, self.aconn, self.runner = kind, conn, aconn, runner

    def __call__(self, name: str, *args: object, **kwargs: object) -> object:
        if self.aconn is None:
            sync: Callable[..., object] = getattr(pgq, name)
            return sync(self.conn, *args, **kwargs)
        twin: Callable[..., Coroutine[object, object, object]] = getattr(pgq, f"{name}_async")
        return self.runner.run(twin(self.aconn, *args, **kwargs))


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest, dsn: str, conn: Conn) -> Iterator[Api]:
    with asyncio.Runner() as runner:
        if request.param == "sync":
            yield Api("sync", conn, None, runner)
            return
        aconn = runner.run(psycopg.AsyncConnection.connect(dsn, autocommit=True))
        try:
            yield Api("async", conn, aconn, runner)
        finally:
            runner.run(aconn.close())


def test_enqueue_many_returns_ids_in_order_and_a_held_keys_holder(api: Api, conn: Conn) -> None:
    plain = cast(list[JobId], api("enqueue_many", [pgq.NewJob("a", {"i": i}) for i in range(3)]))
    assert [get(conn, i).payload for i in plain] == [{"i": 0}, {"i": 1}, {"i": 2}]  # COPY
    holder = pgq.enqueue(conn, "a", unique_key="k")
    keyed = api("enqueue_many", [pgq.NewJob("a", unique_key="k"), pgq.NewJob("a")])
    assert isinstance(keyed, list) and keyed[0] == holder and keyed[1] != holder  # INSERT
    assert count_rows(conn) == 5
    with pytest.raises(pgq.InvalidInput, match="priority"):
        api("enqueue_many", [pgq.NewJob("a"), pgq.NewJob("a", priority=2**40)])
    assert count_rows(conn) == 5


def test_enqueue_bundle_writes_the_bundle_and_its_jobs_or_nothing(api: Api, conn: Conn) -> None:
    bundle = api("enqueue_bundle", "batch", [pgq.NewJob("b"), pgq.NewJob("b")], on_complete="c")
    assert isinstance(bundle, pgq.Bundle) and bundle.num_jobs == 2
    again = api("get_bundle", str(bundle.id))
    assert isinstance(again, pgq.Bundle) and again.id == bundle.id
    assert again.num_jobs == 2 and again.num_jobs_stopped == 0
    assert count_rows(conn) == 2
    with pytest.raises(pgq.InvalidInput, match="at least one job"):
        api("enqueue_bundle", "batch", [])
    with pytest.raises(pgq.InvalidInput, match="priority"):  # refused after the bundle's row
        api("enqueue_bundle", "batch", [pgq.NewJob("b"), pgq.NewJob("b", priority=2**40)])
    assert conn.execute("SELECT count(*) FROM pgq.job_bundle").fetchone() == (1,)
    with pytest.raises(pgq.JobNotFound):
        api("get_bundle", JobId(pgq.enqueue(conn, "x")))


def test_get_job_reads_the_record_and_refuses_bad_or_unknown_ids(api: Api, conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "g", {"deep": {"list": [1, 2]}})
    for given in (job_id, str(job_id)):
        record = api("get_job", given)
        assert isinstance(record, pgq.JobRecord)
        assert record.id == job_id and record.payload == {"deep": {"list": [1, 2]}}
        assert record.state is JobState.PENDING
    with pytest.raises(pgq.InvalidInput, match="is not a job id"):
        api("get_job", "nope")
    pgq.cancel_job(conn, job_id)
    pgq.delete_finished(conn, 0)
    with pytest.raises(pgq.JobNotFound):
        api("get_job", job_id)


def test_cancel_and_reset_follow_the_state_machine(api: Api, conn: Conn) -> None:
    pending = pgq.enqueue(conn, "c")
    assert api("cancel_job", pending) is JobState.PENDING
    assert get(conn, pending).state is JobState.CANCELLED
    with pytest.raises(pgq.InvalidTransition, match="only pending or running"):
        api("cancel_job", pending)
    assert api("reset_job", pending) is None
    assert get(conn, pending).state is JobState.PENDING
    running = claim_one(conn, "c")
    with pytest.raises(pgq.InvalidTransition, match="use force=True"):
        api("reset_job", running.id)
    assert get(conn, running.id).state is JobState.RUNNING
    api("reset_job", running.id, force=True)
    assert get(conn, running.id).state is JobState.PENDING


def test_pause_resume_and_tenant_weights(api: Api, conn: Conn) -> None:
    assert api("pause", "p", reason="deploy", by="ops") is True
    assert api("pause", "p") is False
    assert conn.execute("SELECT reason FROM pgq.type_pause").fetchone() == ("deploy",)
    assert api("resume", "p") is True
    assert api("resume", "p") is False
    with pytest.raises(pgq.InvalidInput, match="invalid job type"):
        api("pause", "bad\x07type")
    api("set_tenant_weight", "p", "acme", 5)
    with pytest.raises(pgq.InvalidInput, match="weight must be an integer"):
        api("set_tenant_weight", "p", "acme", 0)
    with pytest.raises(pgq.InvalidInput, match="tenant contains a NUL"):
        api("set_tenant_weight", "p", "a\x00", 1)


def test_counts_retries_and_purges(api: Api, conn: Conn) -> None:
    failed = [finished(conn, f"f{i}", JobState.FAILED) for i in range(2)]
    pgq.enqueue_many(conn, [pgq.NewJob("q")] * 3)
    stats = cast(list[pgq.TypeStats], api("queue_stats"))
    assert {(s.type, s.state, s.count) for s in stats} >= {("q", JobState.PENDING, 3)}
    assert api("queue_depth") == 3 and api("queue_depth", "q") == 3
    assert api("retry_failed", type="f0") == 1
    assert api("retry_failed") == 1
    assert {get(conn, i).state for i in failed} == {JobState.PENDING}
    assert api("queue_depth") == 5
    pgq.cancel_job(conn, failed[0])
    with pytest.raises(pgq.InvalidInput, match="only finished jobs"):
        api("delete_finished", 0, states=[JobState.PENDING])
    assert api("delete_finished", 0) == 1
    assert count_rows(conn) == 4


def test_migrate_brings_a_new_schema_up_and_then_only_reads(api: Api, conn: Conn) -> None:
    applied = cast(list[int], api("migrate", schema="other"))
    assert applied == list(range(1, len(applied) + 1)) and len(applied) > 20
    assert api("migrate", schema="other") == []
    assert api("enqueue_many", [pgq.NewJob("o")], schema="other") != []
    assert api("queue_depth", schema="other") == 1


def test_every_twinned_call_has_an_async_twin_that_takes_the_same_arguments() -> None:
    for name in TWINNED:
        sync, twin = getattr(pgq, name), getattr(pgq, f"{name}_async")
        assert name in pgq.__all__ and f"{name}_async" in pgq.__all__
        assert inspect.iscoroutinefunction(twin), f"{name}_async is not async"
        ours = list(inspect.signature(sync).parameters.values())[1:]
        theirs = list(inspect.signature(twin).parameters.values())[1:]
        assert [(p.name, p.kind, p.default) for p in ours] == [
            (p.name, p.kind, p.default) for p in theirs
        ], f"{name} and {name}_async take different arguments"
