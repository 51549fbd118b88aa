"""Retention: the Pruner deletes finished jobs past their window, in bounded rounds, keeps
bundle counters true, and finds its rows on job_finished_idx."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor import sql as queries
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobId, JobState
from pgq_supervisor.settings import load_settings
from pgq_supervisor.supervisor.maintenance.retention import Pruner, PruneResult
from tests.support.db import claim, count_rows

DAY = 86400.0


def finish(conn: Conn, type_: str, n: int, state: JobState, age_days: float) -> list[JobId]:
    """n jobs of `type_` taken to `state`, finished `age_days` ago by the database clock."""
    ids = pgq.enqueue_many(conn, [pgq.NewJob(type_, max_retry_count=0) for _ in range(n)])
    if state is JobState.CANCELLED:
        for job_id in ids:
            pgq.cancel_job(conn, job_id)
    else:
        jobs = claim(conn, [type_], limit=n)
        assert {j.id for j in jobs} == set(ids)
        lease = jobs[0].lease
        if state is JobState.SUCCEEDED:
            db.succeed(conn, "pgq", lease, [(j.id, None) for j in jobs])
        else:
            db.end_attempt(conn, "pgq", ids, error="boom", kind=AttemptKind.ERROR, lease=lease)
    conn.execute(
        "UPDATE pgq.job SET stopped_at = now() - make_interval(days => %s) WHERE id = ANY(%s)",
        (age_days, ids),
    )
    return ids


def states(conn: Conn) -> dict[str, int]:
    rows = conn.execute("SELECT type, count(*) FROM pgq.job GROUP BY type").fetchall()
    return {r[0]: r[1] for r in rows}


def test_prunes_each_kind_by_its_own_window(conn: Conn) -> None:
    finish(conn, "ok_old", 3, JobState.SUCCEEDED, age_days=8)
    finish(conn, "ok_new", 2, JobState.SUCCEEDED, age_days=1)
    finish(conn, "failed_old", 2, JobState.FAILED, age_days=40)
    finish(conn, "failed_mid", 2, JobState.FAILED, age_days=8)
    finish(conn, "cancelled_old", 1, JobState.CANCELLED, age_days=40)
    pgq.enqueue(conn, "pending", {})
    pgq.enqueue(conn, "running", {})
    claim(conn, ["running"])

    result = Pruner("pgq", retain_succeeded=7 * DAY, retain_failed=30 * DAY).run_once(conn)

    assert result == PruneResult(succeeded=3, failed=3, more=False)
    assert result.total == 6
    assert states(conn) == {"ok_new": 2, "failed_mid": 2, "pending": 1, "running": 1}


def test_an_unset_window_keeps_that_kind(conn: Conn) -> None:
    finish(conn, "ok", 2, JobState.SUCCEEDED, age_days=100)
    finish(conn, "bad", 2, JobState.FAILED, age_days=100)
    assert Pruner("pgq", retain_succeeded=None, retain_failed=DAY).run_once(conn).failed == 2
    assert states(conn) == {"ok": 2}
    assert Pruner("pgq", retain_succeeded=DAY, retain_failed=None).run_once(conn).succeeded == 2
    assert count_rows(conn) == 0


def test_a_round_is_bounded_and_says_there_is_more(conn: Conn) -> None:
    finish(conn, "ok", 25, JobState.SUCCEEDED, age_days=2)
    pruner = Pruner("pgq", retain_succeeded=DAY, retain_failed=None, batch=4, max_rows=10)
    first = pruner.run_once(conn)
    assert (first.succeeded, first.more) == (12, True)  # whole batches up to the bound
    second = pruner.run_once(conn)
    assert (second.succeeded, second.more) == (12, True)
    third = pruner.run_once(conn)
    assert (third.succeeded, third.more) == (1, False)
    assert count_rows(conn) == 0
    assert pruner.run_once(conn) == PruneResult()


def test_pruning_bundled_jobs_keeps_the_bundle_counters_true(conn: Conn) -> None:
    bundle = pgq.enqueue_bundle(conn, "batch", [pgq.NewJob("part") for _ in range(4)])
    jobs = claim(conn, ["part"], limit=2)
    db.succeed(conn, "pgq", jobs[0].lease, [(j.id, None) for j in jobs])
    conn.execute(
        "UPDATE pgq.job SET stopped_at = now() - interval '2 days' WHERE state = 'succeeded'"
    )

    assert Pruner("pgq", retain_succeeded=DAY, retain_failed=None).run_once(conn).succeeded == 2

    after = pgq.get_bundle(conn, bundle.id)
    assert (after.num_jobs, after.num_jobs_stopped) == (2, 0)  # the two pending parts remain


def test_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGQ_RETAIN_SUCCEEDED", "PGQ_RETAIN_FAILED"):
        monkeypatch.delenv(name, raising=False)
    # by default a day of succeeded jobs and a week of failed and cancelled ones
    pruner = Pruner.from_settings(load_settings())
    assert pruner is not None
    assert (pruner.retain_succeeded, pruner.retain_failed) == (DAY, 7 * DAY)
    keep_all = load_settings(retain_succeeded="forever", retain_failed="forever")
    assert Pruner.from_settings(keep_all) is None
    pruner = Pruner.from_settings(
        load_settings(retain_succeeded="7d", retain_failed="forever", schema="other")
    )
    assert pruner is not None
    assert (pruner.schema, pruner.retain_succeeded, pruner.retain_failed) == (
        "other",
        7 * DAY,
        None,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"retain_succeeded": 0.0, "retain_failed": None},
        {"retain_succeeded": None, "retain_failed": -1.0},
        {"retain_succeeded": 1.0, "retain_failed": None, "batch": 0},
        {"retain_succeeded": 1.0, "retain_failed": None, "max_rows": 0},
    ],
)
def test_constructor_rejects_bad_values(kwargs: dict[str, float | None]) -> None:
    with pytest.raises(ValueError, match="must be"):
        Pruner("pgq", **kwargs)  # type: ignore[arg-type]


def _plan_nodes(plan: dict[str, object]) -> Iterator[dict[str, object]]:
    yield plan
    children = plan.get("Plans", [])
    assert isinstance(children, list)
    for child in children:
        yield from _plan_nodes(child)


def test_delete_finished_finds_its_batch_on_the_index_and_deletes_by_primary_key(
    conn: Conn,
) -> None:
    """With a big table of recent finished jobs and nothing to prune, a round must not read
    the table: it runs every minute in the supervisor's loop."""
    conn.execute(
        "INSERT INTO pgq.job (type, payload, state, max_retry_count, started_at, stopped_at,"
        " worker_id) SELECT 'a', '{}', 'succeeded', 3, now() - interval '2 minutes',"
        " now() - interval '1 minute', 'w' FROM generate_series(1, 50000)"
    )
    conn.execute("ANALYZE pgq.job")
    # The statement as psycopg's automatic prepare sends it after a few executions: prepared,
    # planned once for any parameters (a generic plan).
    text = queries.query("delete_finished", "pgq").as_string(conn)
    for n, name in enumerate(("states", "older_than", "limit"), start=1):
        text = text.replace(f"%({name})s", f"${n}")
    conn.execute(b"PREPARE prune(text[], float8, int) AS " + text.encode())
    conn.execute("SET plan_cache_mode = force_generic_plan")
    row = conn.execute(
        "EXPLAIN (FORMAT JSON) EXECUTE prune('{succeeded,failed}', 86400, 5000)"
    ).fetchone()
    assert row is not None
    nodes = list(_plan_nodes(row[0][0]["Plan"]))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes
    # the batch is picked on job_finished_idx; the delete looks its ids up in job_pkey (an
    # index scan or a bitmap scan over it, whichever the row estimate favours)
    assert {n.get("Index Name") for n in nodes} >= {"job_finished_idx", "job_pkey"}, nodes
    picked = [n for n in nodes if n.get("Index Name") == "job_finished_idx"]
    assert [n["Node Type"] for n in picked] == ["Index Scan"]
