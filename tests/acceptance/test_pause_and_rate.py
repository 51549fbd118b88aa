"""Rate limits and pauses with real supervisors: the database holds jobs back across all of
them, and the supervisors wake a child as soon as a job may start again."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.integration.test_pause_and_rate import most_in_any_window
from tests.support.processes import APP, FAST, Supervisor, count, run_cli
from tests.support.waiting import wait_for

RATED_JOBS = 200


def _starts(db: Conn, type_: str) -> list[datetime]:
    rows = db.execute(
        "SELECT started_at FROM pgq.job WHERE type = %s AND started_at IS NOT NULL", (type_,)
    ).fetchall()
    return [r[0] for r in rows if isinstance(r[0], datetime)]


def _claimed_since(db: Conn, since: datetime) -> bool:
    """Whether a child has run a claim that began after `since` to its end (the claim
    statement is the only one that begins so; the heartbeat has a connection of its own)."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'pgq-worker'"
        " AND state = 'idle' AND query_start > %s AND query LIKE 'WITH claimed AS (%%'",
        (since,),
    ).fetchone()
    return row is not None and row[0] != 0


def test_rate_20_per_second_over_200_jobs_on_two_supervisors(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    """`rated` allows 20 starts per second: no one-second window holds more, and 200 jobs take
    about 10 s (a full window frees a start at most 1/20 s late), not much longer: the
    supervisors wake a child when the window frees, they do not wait for their poll."""
    for _ in range(2):
        # the poll (a wake-up every 5 s) is too slow to keep 20/s going: the rate timer must
        sups.append(
            Supervisor(dsn, APP, "--procs", "2", "--types", "rated,noop", "--poll-interval", "5")
        )
    for sup in sups:
        sup.wait_ready(2)
    started = time.monotonic()
    pgq.enqueue_many(db, [pgq.NewJob("rated", {"n": i}) for i in range(RATED_JOBS)])
    wait_for(
        f"{RATED_JOBS} rated jobs succeeded",
        lambda: count(dsn, "type = 'rated' AND state = 'succeeded'") == RATED_JOBS,
        timeout=40,
    )
    took = time.monotonic() - started
    starts = _starts(db, "rated")
    assert len(starts) == RATED_JOBS  # one start each: held back is no attempt
    assert most_in_any_window(starts, timedelta(seconds=1)) <= 20
    # 10 full windows: the first 20 start at once, the last 20 about 9.45 s later
    assert timedelta(seconds=9) <= max(starts) - min(starts)
    assert took < 16, f"{RATED_JOBS} jobs at 20/s took {took:.1f} s"
    # both supervisors took part
    workers = db.execute(
        "SELECT count(DISTINCT split_part(worker_id, ':', 2)) FROM pgq.job WHERE type = 'rated'"
    ).fetchone()
    assert workers == (2,)
    for sup in sups:
        assert sup.stop() == 0, sup.log()[-2000:]


def test_a_paused_type_waits_while_others_flow_and_starts_within_a_second_of_resume(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sups.append(Supervisor(dsn, APP, "--procs", "2", "--types", "noop,record", *FAST))
    sups[0].wait_ready(2)
    result = run_cli(["pause", "noop", "--reason", "test"], dsn)
    assert result.returncode == 0, result.stderr

    pgq.enqueue_many(db, [pgq.NewJob("noop", {"n": i}) for i in range(50)])
    pgq.enqueue_many(db, [pgq.NewJob("record", {"n": i}) for i in range(300)])
    # sampled all the while the other type flows
    samples = 0
    while count(dsn, "type = 'record' AND state = 'succeeded'") < 300:
        assert count(dsn, "type = 'noop' AND state <> 'pending'") == 0
        samples += 1
        assert samples < 10_000, "record jobs did not finish"
    # and until a child has claimed again with nothing else left (woken by the poll): that
    # claim passed the noop jobs over too
    row = db.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None and isinstance(row[0], datetime)
    all_ran = row[0]
    wait_for("a claim after the last record job", lambda: _claimed_since(db, all_ran))
    assert count(dsn, "type = 'noop' AND state = 'pending' AND attempts = '[]'") == 50

    # resume in a transaction of our own: the database clock just before its commit is a
    # lower bound of the commit time, so the latency measured is an upper bound
    with db.transaction():
        assert pgq.resume(db, "noop") is True
        row = db.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None and isinstance(row[0], datetime)
    resumed_by = row[0]
    wait_for(
        "noop jobs succeeded", lambda: count(dsn, "type = 'noop' AND state = 'succeeded'") == 50
    )
    first = min(_starts(db, "noop"))
    assert first - resumed_by < timedelta(seconds=1), first - resumed_by
    assert sups[0].stop() == 0, sups[0].log()[-2000:]
