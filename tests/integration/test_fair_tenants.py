"""Fair claims across tenants (schema/0021, 0023): the claims of a type with tenant jobs go
round-robin across its tenants, optionally weighted, so a big tenant's backlog does not delay a
small tenant's job; jobs without a tenant are claimed as before."""

from __future__ import annotations

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor.db import Conn
from tests.support.db import claim, count_rows, get


def _backlog(conn: Conn, tenant: str, n: int, type_: str = "t") -> None:
    pgq.enqueue_many(conn, [pgq.NewJob(type_, {"i": i}, tenant=tenant) for i in range(n)])


def _tenants(conn: Conn, limit: int, types: tuple[str, ...] = ("t",)) -> list[str | None]:
    jobs = claim(conn, list(types), limit=limit)
    return [get(conn, j.id).tenant for j in jobs]


def test_a_small_tenant_job_is_claimed_before_the_big_tenant_backlog(conn: Conn) -> None:
    _backlog(conn, "big", 2000)
    small = pgq.enqueue(conn, "t", {"i": 0}, tenant="small")
    got = claim(conn, ["t"], limit=10)
    assert small in [j.id for j in got]
    assert len(got) == 10  # the rest of the batch is the big tenant's: the drain is not cut


def test_claims_of_one_job_go_round_robin(conn: Conn) -> None:
    for tenant in ("a", "b", "c"):
        _backlog(conn, tenant, 5)
    order = [t for _ in range(9) for t in _tenants(conn, 1)]
    assert order[:3] == order[3:6] == order[6:9]
    assert sorted(order[:3], key=str) == ["a", "b", "c"]


def test_the_turns_wrap_to_a_tenant_that_sorts_before_the_cursor(conn: Conn) -> None:
    # schema/0023: whether a tenant sorts before the cursor's is one backward descent
    _backlog(conn, "m", 20)
    assert _tenants(conn, 1) == ["m"]  # the cursor at m, the first and only tenant
    assert _tenants(conn, 2) == ["m", "m"]  # nothing before it, nothing after: all m's
    _backlog(conn, "b", 2)  # before the cursor
    assert sorted(_tenants(conn, 2), key=str) == ["b", "m"]
    _backlog(conn, "x", 1)  # after it: its turn comes first, then the wrap to b, then m
    assert sorted(_tenants(conn, 3), key=str) == ["b", "m", "x"]


def test_weights_share_a_claim(conn: Conn) -> None:
    _backlog(conn, "a", 50)
    _backlog(conn, "b", 50)
    pgq.set_tenant_weight(conn, "t", "a", 3)
    got = _tenants(conn, 4)  # one turn each per round at this batch size: a takes 3
    assert sorted(got, key=str) == ["a", "a", "a", "b"]
    with pytest.raises(pgq.InvalidInput, match="weight"):
        pgq.set_tenant_weight(conn, "t", "a", 0)


def test_jobs_without_tenant_and_other_types_are_claimed_alongside(conn: Conn) -> None:
    _backlog(conn, "a", 30)
    plain = [pgq.enqueue(conn, "t", {"plain": i}) for i in range(3)]
    other = pgq.enqueue(conn, "u", {})
    got = {j.id for j in claim(conn, ["t", "u"], limit=10)}
    assert set(plain) | {other} <= got
    assert len(got) == 10


def test_every_tenant_job_is_claimed_once_in_the_end(conn: Conn) -> None:
    for n, tenant in enumerate(("a", "b", "c", "d")):
        _backlog(conn, tenant, 7 * n + 1)
    pgq.enqueue(conn, "t", {}, tenant="late", start_at=None)
    seen = []
    for _ in range(100):
        got = claim(conn, ["t"], limit=7)
        if not got:
            break
        seen += [j.id for j in got]
    assert len(seen) == len(set(seen)) == 1 + 1 + 8 + 15 + 22
    assert count_rows(conn, where="state = 'pending'") == 0


def test_a_key_limited_type_still_claims_its_tenant_jobs(conn: Conn) -> None:
    conn.execute("INSERT INTO pgq.type_limit (type, key_concurrency) VALUES ('t', 1)")
    pgq.enqueue(conn, "t", {}, tenant="a", concurrency_key="k")
    pgq.enqueue(conn, "t", {}, tenant="b", concurrency_key="k")
    pgq.enqueue(conn, "t", {}, tenant="b", concurrency_key="j")
    assert len(claim(conn, ["t"], limit=10)) == 2  # one per key


def test_depth_and_show_count_tenant_jobs(conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t", {}, tenant="a")
    _backlog(conn, "b", 4)
    assert pgq.queue_depth(conn, "t") == 5
    assert get(conn, job_id).tenant == "a"


@pytest.mark.parametrize("bad", ["", "x" * 201, "a\x00b"])
def test_a_bad_tenant_is_refused_and_nothing_is_written(conn: Conn, bad: str) -> None:
    with pytest.raises(pgq.InvalidInput, match="tenant"):
        pgq.enqueue(conn, "t", {}, tenant=bad)
    with pytest.raises(pgq.InvalidInput, match="tenant"):
        pgq.enqueue_many(conn, [pgq.NewJob("t", {}), pgq.NewJob("t", {}, tenant=bad)])
    assert count_rows(conn) == 0


def test_the_database_refuses_an_empty_tenant(conn: Conn) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO pgq.job (type, payload, tenant) VALUES ('t', '{}', '')")


def test_a_claimed_batch_runs_the_tenants_in_turns(conn: Conn) -> None:
    _backlog(conn, "big", 50)
    small = pgq.enqueue(conn, "t", {}, tenant="small")
    got = claim(conn, ["t"], limit=200)  # a turn is 10 jobs at this batch size
    assert got[1].id == small  # second, after the big tenant's oldest, not last
    # 10 + 1: the small tenant ran out, so no share-out: the next claim comes sooner
    assert len(got) == 11
