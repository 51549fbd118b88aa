"""Pauses and rate limits in the claim (schema/0007): the database holds jobs back, atomically,
whoever claims; held-back jobs stay pending with no attempt spent."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.errors import InvalidInput
from tests.support.db import SCHEMA, claim, count_rows, in_threads, listening


def _enqueue(conn: Conn, type_: str, n: int) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob(type_, {"n": i}) for i in range(n)], schema=SCHEMA)


def _starts(conn: Conn, type_: str) -> list[datetime]:
    rows = conn.execute(
        "SELECT started_at FROM pgq.job WHERE type = %s AND started_at IS NOT NULL"
        " ORDER BY started_at",
        (type_,),
    ).fetchall()
    return [r[0] for r in rows]


def most_in_any_window(starts: list[datetime], period: timedelta) -> int:
    """The most starts any closed window [t, t + period] holds (sliding over every start)."""
    starts = sorted(starts)
    most, lo = 0, 0
    for hi, t in enumerate(starts):
        while starts[lo] < t - period:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


def test_a_paused_type_is_not_claimed_and_others_are(conn: Conn) -> None:
    _enqueue(conn, "a", 3)
    _enqueue(conn, "b", 3)
    assert pgq.pause(conn, "a", reason="maintenance", by="test") is True
    assert {j.type for j in claim(conn, ["a", "b"], limit=10)} == {"b"}
    assert claim(conn, ["a"], limit=10) == []
    # held back, not failed: pending, no attempt
    assert count_rows(conn, where="type = 'a' AND state = 'pending' AND attempts = '[]'") == 3

    (control,) = db.type_controls(conn, SCHEMA)
    assert (control.type, control.paused, control.paused_by, control.reason) == (
        "a", True, "test", "maintenance"
    )  # fmt: skip

    assert pgq.resume(conn, "a") is True
    assert len(claim(conn, ["a"], limit=10)) == 3


def test_pause_and_resume_are_idempotent_and_resume_notifies(dsn: str, conn: Conn) -> None:
    assert pgq.pause(conn, "a") is True
    first = db.type_controls(conn, SCHEMA)
    assert pgq.pause(conn, "a", reason="again") is False
    assert db.type_controls(conn, SCHEMA) == first  # the first pause's time and reason stay
    with listening(dsn, "pgq_job_available") as listener:
        assert pgq.resume(conn, "a") is True
        assert pgq.resume(conn, "a") is False
        assert listener.collect()["pgq_job_available"] == ["a"]
    assert db.type_controls(conn, SCHEMA) == []


@pytest.mark.parametrize("bad", ["", "has space", "x" * 101])
def test_pausing_an_invalid_type_name_is_invalid_input(conn: Conn, bad: str) -> None:
    with pytest.raises(InvalidInput, match="invalid job type"):
        pgq.pause(conn, bad)
    with pytest.raises(InvalidInput, match="invalid job type"):
        pgq.resume(conn, bad)


def test_pause_takes_effect_at_commit(dsn: str, conn: Conn) -> None:
    _enqueue(conn, "a", 2)
    with psycopg.connect(dsn) as other:
        pgq.pause(other, "a")
        assert len(claim(conn, ["a"])) == 1  # not committed yet
        other.commit()
    assert claim(conn, ["a"]) == []


def test_a_rate_caps_each_claim_at_the_free_starts_and_says_when_one_frees(conn: Conn) -> None:
    _enqueue(conn, "r", 10)
    _enqueue(conn, "u", 10)
    db.sync_rates(conn, SCHEMA, ["r", "u"], {"r": (3, 2.0)})
    got = claim(conn, ["r", "u"], limit=5)
    # the unrated type fills the rest of the batch; the rated one took its 3 starts at most
    assert len(got) == 5 and sum(j.type == "r" for j in got) <= 3
    taken = sum(j.type == "r" for j in got)
    more = claim(conn, ["r"], limit=10)
    assert len(more) == 3 - taken
    assert claim(conn, ["r"], limit=10) == []
    assert count_rows(conn, where="type = 'r' AND state = 'pending' AND attempts = '[]'") == 7

    due = db.rate_next_due(conn, SCHEMA, ["r", "u"])
    assert due is not None and 0.0 < due <= 2.0 * 21 / 20
    (control,) = db.type_controls(conn, SCHEMA)
    assert (control.type, control.max_starts, control.period, control.free_starts) == (
        "r", 3, 2.0, 0
    )  # fmt: skip
    # a paused type's full window is nothing to wake up for
    pgq.pause(conn, "r")
    assert db.rate_next_due(conn, SCHEMA, ["r", "u"]) is None


def test_a_type_without_rate_has_no_next_due(conn: Conn) -> None:
    db.sync_rates(conn, SCHEMA, ["r"], {"r": (3, 1.0)})
    assert db.rate_next_due(conn, SCHEMA, ["r", "u"]) is None  # window not full


def test_sync_rates_writes_served_types_and_drops_rates_removed_from_code(conn: Conn) -> None:
    db.sync_rates(conn, SCHEMA, ["a", "b"], {"a": (5, 1.0), "b": (2, 60.0)})
    _enqueue(conn, "a", 3)
    claim(conn, ["a"], limit=3)
    # same period: the counted starts stay; a new limit applies to them at once
    db.sync_rates(conn, SCHEMA, ["a", "b"], {"a": (3, 1.0)})
    controls = {c.type: c for c in db.type_controls(conn, SCHEMA)}
    assert set(controls) == {"a"}  # b was served without a rate: its rate is gone
    assert (controls["a"].max_starts, controls["a"].free_starts) == (3, 0)
    # a type this supervisor does not serve keeps its row
    db.sync_rates(conn, SCHEMA, ["b"], {})
    assert [c.type for c in db.type_controls(conn, SCHEMA)] == ["a"]
    # a new period starts the count over
    db.sync_rates(conn, SCHEMA, ["a"], {"a": (3, 2.0)})
    assert [c.free_starts for c in db.type_controls(conn, SCHEMA)] == [3]


def test_two_connections_claiming_at_once_never_exceed_the_rate(dsn: str, conn: Conn) -> None:
    """Two workers claim the same rated type as fast as they can, in step: the database
    serialises them on the rate row, and no window of the period holds more than N starts."""
    n, period = 5, 0.4
    _enqueue(conn, "r", 200)
    _enqueue(conn, "u", 200)
    db.sync_rates(conn, SCHEMA, ["r", "u"], {"r": (n, period)})
    stop_at = time.monotonic() + 1.5
    go = [True]

    def decide() -> None:  # once per round, so both threads stop at the same round
        go[0] = time.monotonic() < stop_at

    barrier = threading.Barrier(2, action=decide)

    def worker(i: int) -> int:
        claimed = 0
        with psycopg.connect(dsn, autocommit=True) as c:
            while True:
                barrier.wait(timeout=10)
                if not go[0]:
                    return claimed
                claimed += len(claim(c, ["r", "u"], worker_id=f"w{i}", limit=4))

    in_threads(2, worker)
    starts = _starts(conn, "r")
    assert most_in_any_window(starts, timedelta(seconds=period)) <= n
    # and the limit is not starving the type: about n per period got through
    assert len(starts) >= n * int(1.5 / (period * 21 / 20))
    assert count_rows(conn, where="type = 'u' AND started_at IS NOT NULL") > 0


def test_most_in_any_window_counts_closed_windows() -> None:
    t0 = datetime(2026, 1, 1)
    s = [t0, t0 + timedelta(seconds=1), t0 + timedelta(seconds=1.5), t0 + timedelta(seconds=2.1)]
    assert most_in_any_window(s, timedelta(seconds=1)) == 2
    assert most_in_any_window(s, timedelta(seconds=1.1)) == 3
