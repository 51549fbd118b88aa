"""A claim never waits on job rows another transaction holds: it takes the other rows at once.

The claim's other tests pass just as well with SKIP LOCKED gone from claim_pick (the claims
they race only ever wait a little). Here another connection holds some pending rows, locked FOR
UPDATE or claimed in a transaction it has not committed, and the claim runs under a
lock_timeout, so a claim that waits fails instead of hanging. The last test proves the check
can fail: it strips SKIP LOCKED from a scratch copy of the claim's functions, made in this
test's own database (never in a migration), and sees each scenario time out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest

from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.jobs import JobId, NewJob
from tests.support.db import SCHEMA, claim, make_due

LOCK_TIMEOUT = "1s"  # a claim that skips waits for no lock at all; one that waits fails in 1 s


def _plain(conn: Conn) -> list[JobId]:
    return [db.enqueue(conn, SCHEMA, NewJob("t", {"i": i})) for i in range(4)]


def _due(conn: Conn) -> list[JobId]:
    """Delayed jobs come due: claim_pick_rows reads them from job_delayed_idx."""
    later = db.db_now(conn, SCHEMA) + timedelta(hours=1)
    ids = [db.enqueue(conn, SCHEMA, NewJob("t", {"i": i}, start_at=later)) for i in range(4)]
    for job_id in ids:
        make_due(conn, job_id)
    return ids


def _global_limit(conn: Conn) -> list[JobId]:
    db.sync_limits(conn, SCHEMA, ["t"], {"t": (10, None)})
    return _plain(conn)


def _keyed(conn: Conn) -> list[JobId]:
    """One job per key: claim_pick_keyed takes each row by itself (claim_pick_keyed_take)."""
    db.sync_limits(conn, SCHEMA, ["t"], {"t": (None, 1)})
    return [db.enqueue(conn, SCHEMA, NewJob("t", {}, concurrency_key=f"k{i}")) for i in range(4)]


SCENARIOS: dict[str, Callable[[Conn], list[JobId]]] = {
    "ready": _plain,
    "come-due": _due,
    "global-limit": _global_limit,
    "key-limit": _keyed,
}


@contextmanager
def holding_rows(dsn: str, ids: list[JobId]) -> Iterator[None]:
    """Another transaction holds these rows FOR UPDATE until the block ends (then rolls back)."""
    with psycopg.connect(dsn) as other:
        other.execute("SELECT id FROM pgq.job WHERE id = ANY(%s) FOR UPDATE", (ids,))
        yield
        other.rollback()


@contextmanager
def holding_a_claim(dsn: str, n: int) -> Iterator[list[JobId]]:
    """Another worker's claim of `n` jobs, not committed until the block ends (rolled back)."""
    with psycopg.connect(dsn) as other:
        taken = [j.id for j in claim(other, ["t"], worker_id="other", limit=n)]
        assert len(taken) == n
        yield taken
        other.rollback()


def claim_under_timeout(dsn: str, limit: int) -> list[JobId]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        conn.execute("SET statement_timeout = '30s'")  # a guard, should a claim hang otherwise
        return [j.id for j in claim(conn, ["t"], worker_id="me", limit=limit)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_claim_skips_rows_locked_for_update(conn: Conn, dsn: str, scenario: str) -> None:
    ids = SCENARIOS[scenario](conn)
    with holding_rows(dsn, ids[:2]):
        assert claim_under_timeout(dsn, limit=4) == ids[2:]


@pytest.mark.parametrize("scenario", ["ready", "come-due"])
def test_a_claim_skips_rows_of_a_claim_not_committed_yet(
    conn: Conn, dsn: str, scenario: str
) -> None:
    ids = SCENARIOS[scenario](conn)
    with holding_a_claim(dsn, 2) as taken:
        assert taken == ids[:2]
        assert claim_under_timeout(dsn, limit=4) == ids[2:]


def _strip_skip_locked(conn: Conn) -> list[str]:
    """Recreate, in this test's database only, every function of the schema whose body says
    SKIP LOCKED, without it. Returns their names."""
    rows = conn.execute(
        "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s AND p.prosrc LIKE '%%SKIP LOCKED%%' ORDER BY 1",
        (SCHEMA,),
    ).fetchall()
    for _, definition in rows:
        conn.execute(definition.replace("SKIP LOCKED", ""))
    return [name for name, _ in rows]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_without_skip_locked_the_same_claims_time_out(conn: Conn, dsn: str, scenario: str) -> None:
    ids = SCENARIOS[scenario](conn)
    stripped = _strip_skip_locked(conn)
    assert {"claim_pick_rows", "claim_pick_keyed_take"} <= set(stripped)
    with holding_rows(dsn, ids[:2]), pytest.raises(DatabaseError, match="LockNotAvailable"):
        claim_under_timeout(dsn, limit=4)
    if scenario in ("ready", "come-due"):
        with holding_a_claim(dsn, 2), pytest.raises(DatabaseError, match="LockNotAvailable"):
            claim_under_timeout(dsn, limit=4)
