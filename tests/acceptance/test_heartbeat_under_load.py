"""A worker's heartbeat and its completions never deadlock, at full speed.

The real supervisor drains no-op jobs of mixed priorities (so a batch's claim order, which its
completion follows, is not the id order a beat walks) with a beat every 0.01 s, in both child
loops: one job at a time with batched completions, and many jobs in flight whose completions
are written one by one and in batches. Before the beat skipped locked rows, this found 3 to 5
deadlocks per 20,000 jobs in the first loop and 4 per 6,000 in the second (2 cores, loaded).
"""

from __future__ import annotations

import random

import pytest

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.db import deadlocks
from tests.support.processes import APP, Supervisor, count
from tests.support.waiting import wait_for


def others_connected(db: Conn) -> int:
    """Backends of this database other than `db`'s own (the supervisor's, while they last)."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


@pytest.mark.parametrize(
    ("jobs", "loop"),
    [(20_000, ("--concurrency", "1")), (6_000, ("--concurrency", "8"))],
    ids=["one-at-a-time", "in-flight"],
)
def test_no_deadlock_between_beats_and_completions(
    dsn: str, db: Conn, sups: list[Supervisor], jobs: int, loop: tuple[str, ...]
) -> None:
    before = deadlocks(db)
    rng = random.Random(20)
    pgq.enqueue_many(db, [pgq.NewJob("noop", priority=rng.randrange(10)) for _ in range(jobs)])
    # dead_after long enough that no job is rescued from a loaded machine's slow beat
    sup = Supervisor(
        dsn, APP, "--procs", "2", "--types", "noop", "--heartbeat-interval", "0.01",
        "--dead-after", "30", "--poll-interval", "0.5", *loop,
    )  # fmt: skip
    sups.append(sup)
    wait_for(
        f"{jobs} jobs done",
        lambda: count(dsn, "state = 'succeeded'") == jobs,
        timeout=240,
        interval=0.2,
    )
    assert sup.stop() == 0
    # an exiting backend flushes its statistics before it leaves pg_stat_activity
    wait_for("the supervisor's connections to close", lambda: others_connected(db) == 0)
    told = [
        line
        for line in sup.log().splitlines()
        if "deadlock" in line.lower() or "lease lost" in line or "database error" in line
    ]
    assert (deadlocks(db) - before, told) == (0, [])
