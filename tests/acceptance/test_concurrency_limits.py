"""Concurrency limits with real supervisors: the database holds jobs back across all of them,
and a held-back job starts as soon as a slot frees, not at the next poll."""

from __future__ import annotations

import itertools
import time
from datetime import datetime

import psycopg

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.processes import Supervisor, count, run_cli
from tests.support.waiting import wait_for

APP = "pgq_limits_app:registry"
# The 300 jobs and 10 keys x 20, with short jobs to keep the suite fast: the limit is
# reached all the same (3 slots for 12 children; 10 keys for 8 children).
LIMITED_JOBS = 300
KEYS, PER_KEY = 10, 20
# The poll would wake a child every 5 s: a run this short must start held-back jobs without it.
SLOW_POLL = ("--poll-interval", "5")


def _sample(dsn: str, query: str, done: str) -> list[int]:
    """Run `query` (one integer) over and over until `done` (a count) is 0; the values seen."""
    seen: list[int] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        deadline = time.monotonic() + 60
        while True:
            row = c.execute(query).fetchone()
            assert row is not None
            seen.append(int(row[0] or 0))
            left = c.execute(done).fetchone()
            if left == (0,):
                return seen
            assert time.monotonic() < deadline, f"still not done: {left}"


def test_global_concurrency_3_on_three_supervisors_with_4_procs_each(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    for _ in range(3):
        sups.append(Supervisor(dsn, APP, "--procs", "4", "--types", "limited", *SLOW_POLL))
    for sup in sups:
        sup.wait_ready(4)
    started = time.monotonic()
    pgq.enqueue_many(db, [pgq.NewJob("limited", {"seconds": 0.01}) for _ in range(LIMITED_JOBS)])
    seen = _sample(
        dsn,
        "SELECT count(*) FROM pgq.job WHERE type = 'limited' AND state = 'running'",
        "SELECT count(*) FROM pgq.job WHERE type = 'limited' AND state <> 'succeeded'",
    )
    took = time.monotonic() - started
    assert max(seen) <= 3, max(seen)
    assert max(seen) == 3  # the limit is used, not only respected
    assert len(seen) > 50
    # one start each (held back is no attempt), all succeeded
    assert count(dsn, "type = 'limited' AND state = 'succeeded' AND attempts = '[]'") == (
        LIMITED_JOBS
    )
    # 300 x 10 ms over 3 slots is a second of work; waiting for the 5 s poll would take far
    # longer
    assert took < 15, f"{LIMITED_JOBS} jobs took {took:.1f} s"
    workers = db.execute(
        "SELECT count(DISTINCT split_part(worker_id, ':', 2)) FROM pgq.job WHERE type = 'limited'"
    ).fetchone()
    assert workers in ((2,), (3,))  # more than one supervisor took part
    for sup in sups:
        assert sup.stop() == 0, sup.log()[-2000:]


def test_key_concurrency_1_runs_each_key_serially_and_in_order(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    for _ in range(2):
        sups.append(Supervisor(dsn, APP, "--procs", "4", "--types", "keyed", *SLOW_POLL))
    for sup in sups:
        sup.wait_ready(4)
    jobs = [
        pgq.NewJob("keyed", {"seconds": 0.01}, concurrency_key=f"customer:{k}")
        for _ in range(PER_KEY)
        for k in range(KEYS)
    ]
    pgq.enqueue_many(db, jobs)
    seen = _sample(
        dsn,
        "SELECT max(n) FROM (SELECT count(*) AS n FROM pgq.job"
        " WHERE type = 'keyed' AND state = 'running' GROUP BY concurrency_key) k",
        "SELECT count(*) FROM pgq.job WHERE type = 'keyed' AND state <> 'succeeded'",
    )
    assert max(seen) == 1, max(seen)
    assert count(dsn, "type = 'keyed' AND state = 'succeeded' AND attempts = '[]'") == len(jobs)
    # FIFO within a key: the handlers ran in enqueue order, and no two of a key at once (by
    # the times the handlers took on this host: see pgq_limits_app)
    rows = db.execute(
        "SELECT concurrency_key, (result->>'start')::float8, (result->>'end')::float8"
        " FROM pgq.job WHERE type = 'keyed' ORDER BY concurrency_key, created_at"
    ).fetchall()
    by_key: dict[str, list[tuple[float, float]]] = {}
    for key, start, end in rows:
        assert isinstance(start, float) and isinstance(end, float)
        by_key.setdefault(str(key), []).append((start, end))
    assert len(by_key) == KEYS
    for key, runs in by_key.items():
        for (start_a, end_a), (start_b, _) in itertools.pairwise(runs):
            assert start_a < start_b, key
            assert end_a <= start_b, key
    for sup in sups:
        assert sup.stop() == 0, sup.log()[-2000:]


def test_a_held_back_job_starts_when_the_slot_frees_not_at_the_poll(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    """global_concurrency=1, two supervisors, polls 5 s apart: each next job starts right
    after the one before it ends."""
    for _ in range(2):
        sups.append(Supervisor(dsn, APP, "--procs", "2", "--types", "serial", *SLOW_POLL))
    for sup in sups:
        sup.wait_ready(2)
    pgq.enqueue_many(db, [pgq.NewJob("serial", {"seconds": 0.2}) for _ in range(5)])
    wait_for(
        "5 serial jobs succeeded",
        lambda: count(dsn, "type = 'serial' AND state = 'succeeded'") == 5,
        timeout=30,
    )
    rows = db.execute(
        "SELECT started_at, stopped_at FROM pgq.job WHERE type = 'serial' ORDER BY started_at"
    ).fetchall()
    spans = [(a, b) for a, b in rows if isinstance(a, datetime) and isinstance(b, datetime)]
    assert len(spans) == 5
    gaps = [(b[0] - a[1]).total_seconds() for a, b in itertools.pairwise(spans)]
    assert all(g >= 0 for g in gaps), gaps  # one at a time
    assert max(gaps) < 1.0, gaps  # not the 5 s poll
    for sup in sups:
        assert sup.stop() == 0, sup.log()[-2000:]


def test_a_zero_limit_is_one_clear_error_and_exit_2(dsn: str) -> None:
    result = run_cli(["run", "--app", "pgq_limits_bad_app:registry"], dsn)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: handler 'limited': global_concurrency must be an integer > 0, got 0"
    ]


def test_status_shows_the_limits(dsn: str, db: Conn, sups: list[Supervisor]) -> None:
    sups.append(Supervisor(dsn, APP, "--procs", "1"))
    sups[0].wait_ready(1)
    wait_for(
        "the supervisor's limits in type_limit",
        lambda: db.execute("SELECT count(*) FROM pgq.type_limit").fetchone() == (3,),
    )
    result = run_cli(["status"], dsn)
    assert result.returncode == 0, result.stderr
    assert "limited: keyed key_concurrency=1, 0 running" in result.stdout
    assert "limited: limited global_concurrency=3, 0 running" in result.stdout
    assert "limited: serial global_concurrency=1, 0 running" in result.stdout
    assert sups[0].stop() == 0
