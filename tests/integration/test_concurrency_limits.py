"""Concurrency limits in the claim (schema/0008): global_concurrency and key_concurrency hold
jobs back atomically, whoever claims; held-back jobs stay pending with no attempt spent, behind
the same gate as pauses, rates and dependencies."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.errors import ConfigError, InvalidInput
from pgq_supervisor.jobs import Job
from tests.support.db import SCHEMA, claim, count_rows, in_threads
from tests.support.waiting import until


def _enqueue(conn: Conn, type_: str, n: int, key: str | None = None) -> list[pgq.JobId]:
    return pgq.enqueue_many(
        conn,
        [pgq.NewJob(type_, {"n": i}, concurrency_key=key) for i in range(n)],
        schema=SCHEMA,
    )


def _running(conn: Conn, type_: str) -> int:
    return count_rows(conn, where=f"type = '{type_}' AND state = 'running'")


def _finish(conn: Conn, jobs: list[Job]) -> None:
    for j in jobs:
        assert db.succeed(conn, SCHEMA, j.lease, [(j.id, None)]) == {j.id}


def test_global_concurrency_caps_running_jobs_and_held_back_costs_nothing(conn: Conn) -> None:
    _enqueue(conn, "g", 10)
    _enqueue(conn, "u", 3)
    db.sync_limits(conn, SCHEMA, ["g", "u"], {"g": (3, None)})
    first = claim(conn, ["g", "u"], limit=10)
    assert sorted(j.type for j in first) == ["g"] * 3 + ["u"] * 3
    assert claim(conn, ["g"], limit=10) == []
    # held back, not failed: pending, no attempt, nothing written on them
    assert count_rows(conn, where="type = 'g' AND state = 'pending' AND attempts = '[]'") == 7
    # one finishes: one more starts
    _finish(conn, [j for j in first if j.type == "g"][:1])
    assert len(claim(conn, ["g"], limit=10)) == 1
    assert _running(conn, "g") == 3
    (lim,) = db.type_limits(conn, SCHEMA)
    assert (lim.type, lim.global_concurrency, lim.running, lim.ready, lim.held_by_global) == (
        "g", 3, 3, 6, 6
    )  # fmt: skip


def test_many_connections_claiming_at_once_never_exceed_the_limit(dsn: str, conn: Conn) -> None:
    """Four workers claim and finish jobs of a limited type as fast as they can; a fifth
    connection samples the running count: it never exceeds the limit, and every job runs."""
    limit, total = 3, 200
    _enqueue(conn, "g", total)
    db.sync_limits(conn, SCHEMA, ["g"], {"g": (limit, None)})
    done = threading.Event()
    seen: list[int] = []

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not done.is_set():
                seen.append(_running(c, "g"))

    sampler = threading.Thread(target=sample)
    sampler.start()

    def worker(i: int) -> int:
        ran = 0
        with psycopg.connect(dsn, autocommit=True) as c:
            while True:
                jobs = claim(c, ["g"], worker_id=f"w{i}", limit=2)
                if not jobs:
                    if count_rows(c, where="state = 'pending'") == 0:
                        return ran
                    continue  # held back: another worker holds the slots
                assert _running(c, "g") <= limit
                _finish(c, jobs)
                ran += len(jobs)

    try:
        ran = in_threads(4, worker)
    finally:
        done.set()
        sampler.join()
    assert sum(ran) == total
    assert max(seen) <= limit and len(seen) > 10
    assert count_rows(conn, where="state = 'succeeded' AND attempts = '[]'") == total


def test_key_concurrency_one_is_serial_per_key_and_fifo(conn: Conn) -> None:
    ids = {k: _enqueue(conn, "k", 4, key=k) for k in ("a", "b")}
    free = _enqueue(conn, "k", 2)  # no key: only a global limit would hold these
    db.sync_limits(conn, SCHEMA, ["k"], {"k": (None, 1)})
    first = claim(conn, ["k"], limit=10)
    assert [j.id for j in first] == [ids["a"][0], ids["b"][0], *free]
    assert claim(conn, ["k"], limit=10) == []
    (lim,) = db.type_limits(conn, SCHEMA)
    assert lim.key_held == 6
    # finishing a's job frees a's next one, in order, and nothing of b
    _finish(conn, [first[0]])
    assert [j.id for j in claim(conn, ["k"], limit=10)] == [ids["a"][1]]


def test_key_concurrency_two_runs_two_per_key_under_a_global_limit(conn: Conn) -> None:
    ids = {k: _enqueue(conn, "k", 5, key=k) for k in ("a", "b", "c")}
    db.sync_limits(conn, SCHEMA, ["k"], {"k": (5, 2)})
    got = [j.id for j in claim(conn, ["k"], limit=10)]
    # the global limit (5) cuts the third key's second job; per key, first in first out
    assert got == [*ids["a"][:2], *ids["b"][:2], ids["c"][0]]


def test_key_limited_claims_from_many_connections_keep_keys_serial(dsn: str, conn: Conn) -> None:
    keys = [f"customer:{i}" for i in range(5)]
    order = {k: _enqueue(conn, "k", 8, key=k) for k in keys}
    db.sync_limits(conn, SCHEMA, ["k"], {"k": (None, 1)})
    started: list[tuple[str, pgq.JobId]] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while count_rows(c, where="state <> 'succeeded'"):
                jobs = claim(c, ["k"], worker_id=f"w{i}", limit=3)
                for j in jobs:
                    key = db.get_job(c, SCHEMA, j.id).concurrency_key
                    assert key is not None
                    dup = count_rows(c, where=f"state = 'running' AND concurrency_key = '{key}'")
                    assert dup == 1, key
                    with lock:
                        started.append((key, j.id))
                _finish(c, jobs)

    in_threads(4, worker)
    for k in keys:
        assert [j for key, j in started if key == k] == order[k]


def test_limits_sit_behind_the_pause(conn: Conn) -> None:
    _enqueue(conn, "g", 3)
    db.sync_limits(conn, SCHEMA, ["g"], {"g": (2, None)})
    pgq.pause(conn, "g")
    assert claim(conn, ["g"], limit=10) == []
    pgq.resume(conn, "g")
    assert len(claim(conn, ["g"], limit=10)) == 2


def test_a_limited_type_with_a_rate_respects_both(conn: Conn) -> None:
    _enqueue(conn, "g", 10)
    db.sync_limits(conn, SCHEMA, ["g"], {"g": (5, None)})
    db.sync_rates(conn, SCHEMA, ["g"], {"g": (2, 60.0)})
    first = claim(conn, ["g"], limit=10)
    assert len(first) == 2  # the rate is the tighter
    _finish(conn, first)
    assert claim(conn, ["g"], limit=10) == []  # the window is full, though slots are free
    (control,) = db.type_controls(conn, SCHEMA)
    assert control.free_starts == 0
    db.sync_rates(conn, SCHEMA, ["g"], {"g": (100, 60.0)})
    assert len(claim(conn, ["g"], limit=10)) == 5  # now the limit is


def test_waiting_jobs_are_never_picked_by_a_limited_claim(conn: Conn) -> None:
    dep = pgq.enqueue(conn, "d", schema=SCHEMA)
    waiting = pgq.enqueue(conn, "k", depends_on=[dep], concurrency_key="a", schema=SCHEMA)
    after = pgq.enqueue(conn, "k", concurrency_key="b", schema=SCHEMA)
    db.sync_limits(conn, SCHEMA, ["k"], {"k": (3, 1)})
    assert [j.id for j in claim(conn, ["k"], limit=10)] == [after]
    (d,) = claim(conn, ["d"])
    _finish(conn, [d])
    assert [j.id for j in claim(conn, ["k"], limit=10)] == [waiting]


@pytest.mark.parametrize(
    ("limits", "key"),
    [((1, None), None), ((None, 1), "a"), ((200, None), None)],
    ids=["global", "key", "striped"],
)
def test_a_completion_that_rides_on_a_claim_frees_its_slots_for_that_claim(
    conn: Conn, limits: tuple[int | None, int | None], key: str | None
) -> None:
    """succeed_and_claim completes its batch before it counts: the slots it frees (of the
    type, of the key, of the stripe) go to its own claim, and the limit still holds."""
    cap = limits[0] or limits[1] or 0
    _enqueue(conn, "g", 3 * cap, key=key)
    db.sync_limits(conn, SCHEMA, ["g"], {"g": limits})
    batches = []  # until every slot is taken (200 is striped: two stripes of 100)
    while batch := claim(conn, ["g"], limit=cap):
        batches.append(batch)
    assert _running(conn, "g") == cap
    first = batches[0]
    done, jobs = db.succeed_and_claim(
        conn, SCHEMA, first[0].lease, [(j.id, None) for j in first],
        worker_id="w", types=["g"], max_retry_counts=[3], limit=cap,
    )  # fmt: skip
    assert done == {j.id for j in first}
    assert len(jobs) == len(first)  # counted as running, they would have left it nothing
    assert _running(conn, "g") == cap


def _limits(conn: Conn) -> list[tuple[str, int | None, int | None]]:
    return [(r.type, r.global_concurrency, r.key_concurrency) for r in db.type_limits(conn, SCHEMA)]


def test_sync_limits_writes_served_types_and_drops_limits_removed_from_code(conn: Conn) -> None:
    db.sync_limits(conn, SCHEMA, ["a", "b"], {"a": (5, None), "b": (None, 2)})
    assert _limits(conn) == [("a", 5, None), ("b", None, 2)]
    db.sync_limits(conn, SCHEMA, ["a", "b"], {"a": (3, 1)})
    assert _limits(conn) == [("a", 3, 1)]
    db.sync_limits(conn, SCHEMA, ["b"], {})  # a type not served here keeps its row
    assert [r.type for r in db.type_limits(conn, SCHEMA)] == ["a"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"global_concurrency": 0},
            "handler 'x': global_concurrency must be an integer > 0, got 0",
        ),
        ({"global_concurrency": -2}, "global_concurrency must be an integer > 0, got -2"),
        ({"key_concurrency": 0}, "handler 'x': key_concurrency must be an integer > 0, got 0"),
        ({"key_concurrency": 1.5}, "key_concurrency must be an integer > 0, got 1.5"),
        ({"global_concurrency": True}, "global_concurrency must be an integer > 0, got True"),
    ],
)
def test_bad_limits_are_one_config_error_at_registration(
    options: dict[str, object], message: str
) -> None:
    registry = pgq.Registry()
    with pytest.raises(ConfigError) as exc:
        registry.handler("x", **options)  # type: ignore[arg-type]
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert registry.handlers == {}


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("", "must be a string of 1 to 200"),
        ("x" * 201, "must be a string of 1 to 200"),
        ("a\x00b", "contains a NUL"),
    ],
)
def test_a_bad_concurrency_key_is_refused_and_nothing_is_written(
    conn: Conn, key: str, says: str
) -> None:
    with pytest.raises(InvalidInput, match=f"concurrency_key {says}"):
        pgq.enqueue(conn, "k", concurrency_key=key, schema=SCHEMA)
    with pytest.raises(InvalidInput, match="concurrency_key"):
        _enqueue(conn, "k", 2, key=key)
    assert count_rows(conn) == 0


def test_the_key_travels_through_every_enqueue_path(conn: Conn) -> None:
    one = pgq.enqueue(conn, "k", concurrency_key="c1", schema=SCHEMA)
    unique = pgq.enqueue(conn, "k", unique_key="u", concurrency_key="c2", schema=SCHEMA)
    (many,) = _enqueue(conn, "k", 1, key="c3")
    bundle = pgq.enqueue_bundle(conn, "b", [pgq.NewJob("k", concurrency_key="c4")], schema=SCHEMA)
    keys: dict[object, object] = dict(
        conn.execute("SELECT id, concurrency_key FROM pgq.job").fetchall()
    )
    bundled = conn.execute("SELECT id FROM pgq.job WHERE bundle_id = %s", (bundle.id,)).fetchone()
    assert bundled is not None
    assert [keys[one], keys[unique], keys[many], keys[bundled[0]]] == ["c1", "c2", "c3", "c4"]


def test_a_held_back_claim_waits_on_the_lock_not_on_a_sleep(dsn: str, conn: Conn) -> None:
    """A claim of a limited type waits for a concurrent claim of it to commit, then counts
    what that one took: two claims in two open transactions never both take the last slot."""
    _enqueue(conn, "g", 5)
    db.sync_limits(conn, SCHEMA, ["g"], {"g": (1, None)})
    with psycopg.connect(dsn) as first:  # a transaction left open after its claim
        assert len(claim(first, ["g"], limit=5)) == 1
        result: list[int] = []
        t = threading.Thread(
            target=lambda: result.append(len(claim(conn, ["g"], worker_id="w2", limit=5)))
        )
        with psycopg.connect(dsn, autocommit=True) as watcher:
            t.start()
            until(
                lambda: (
                    watcher.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    ).fetchone()
                    == (1,)
                ),
                "the second claim to wait on the first's advisory lock",
            )
        assert result == []
        first.commit()
        t.join(10)
    assert result == [0]
    assert _running(conn, "g") == 1


def _stripes(conn: Conn, type_: str) -> list[int]:
    rows = conn.execute(
        "SELECT slots FROM pgq.type_limit_stripe WHERE type = %s ORDER BY stripe", (type_,)
    ).fetchall()
    return [r[0] for r in rows]


def test_a_large_limit_is_striped_and_small_or_keyed_ones_are_not(conn: Conn) -> None:
    db.sync_limits(conn, SCHEMA, ["a", "b", "c", "d"], {
        "a": (1000, None), "b": (250, None), "c": (199, None), "d": (1000, 1),
    })  # fmt: skip
    assert _stripes(conn, "a") == [125] * 8
    assert _stripes(conn, "b") == [125, 125]
    assert _stripes(conn, "c") == [] and _stripes(conn, "d") == []


def test_striped_claims_from_many_connections_never_exceed_the_limit(dsn: str, conn: Conn) -> None:
    """Six workers claim batches of a striped type (200: two stripes of 100) and keep them:
    the running count never passes 200; one claimer alone then fills what is left."""
    limit = 200
    _enqueue(conn, "s", 600)
    db.sync_limits(conn, SCHEMA, ["s"], {"s": (limit, None)})
    assert _stripes(conn, "s") == [100, 100]

    def worker(i: int) -> int:
        took = 0
        with psycopg.connect(dsn, autocommit=True) as c:
            for _ in range(20):
                took += len(claim(c, ["s"], worker_id=f"w{i}", limit=17))
                assert _running(c, "s") <= limit
        return took

    took = sum(in_threads(6, worker))
    assert took == _running(conn, "s") <= limit
    while claim(conn, ["s"], limit=17):
        pass
    assert _running(conn, "s") == limit
    assert count_rows(conn, where="type = 's' AND state = 'pending' AND attempts = '[]'") == 400


def test_a_striped_claim_takes_a_stripe_with_room_for_its_batch(conn: Conn) -> None:
    """A claim starts at its connection's stripe and passes over one with too few free slots
    for the batch it wants; when no stripe has enough, it takes the better of two."""
    _enqueue(conn, "s", 400)
    db.sync_limits(conn, SCHEMA, ["s"], {"s": (200, None)})  # two stripes of 100
    assert [len(claim(conn, ["s"], limit=n)) for n in (90, 50)] == [90, 50]
    # its own stripe has 10 left, the other 50: the batch comes from the other, whole
    assert len(claim(conn, ["s"], limit=30)) == 30
    assert len(claim(conn, ["s"], limit=30)) == 20  # 10 and 20 left: the larger
    assert len(claim(conn, ["s"], limit=30)) == 10
    assert claim(conn, ["s"], limit=30) == []
    assert _running(conn, "s") == 200


def _pick_and_locks(conn: Conn, limit: int) -> tuple[int, int]:
    """How many jobs of `s` a claim of `limit` picks, and how many advisory locks (stripes) it
    holds until it ends (rolled back)."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            "SELECT cardinality(pgq.claim_pick(ARRAY['s'], %s, gen_random_uuid()))", (limit,)
        ).fetchone()
        locks = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ).fetchone()
    assert row is not None and locks is not None
    return int(row[0]), int(locks[0])


def test_a_batch_bigger_than_a_stripe_takes_a_free_stripe_and_locks_only_it(conn: Conn) -> None:
    _enqueue(conn, "s", 300)
    db.sync_limits(conn, SCHEMA, ["s"], {"s": (200, None)})  # two stripes of 100
    assert _pick_and_locks(conn, 150) == (100, 1)


def test_near_a_striped_limit_a_claim_looks_at_two_stripes_not_all(conn: Conn) -> None:
    """Every stripe has 90 of its 100 slots taken: a claim of 50 takes 10 from the better of
    the first two stripes it can lock, and holds only those two stripes' locks meanwhile."""
    _enqueue(conn, "s", 400)
    db.sync_limits(conn, SCHEMA, ["s"], {"s": (400, None)})  # four stripes of 100
    for stripe in range(4):  # 90 running jobs in each stripe, under a lease of its own
        lease = uuid.uuid4()
        conn.execute(
            "UPDATE pgq.job SET state = 'running', started_at = now(), worker_alive_at = now(),"
            " worker_id = 'w', lease = %s, max_retry_count = 3 WHERE id IN"
            " (SELECT id FROM pgq.job WHERE state = 'pending' ORDER BY id LIMIT 90)",
            (lease,),
        )
        conn.execute(
            "UPDATE pgq.type_limit_stripe SET leases = ARRAY[%s] WHERE type = 's' AND stripe = %s",
            (lease, stripe),
        )
    assert _pick_and_locks(conn, 50) == (10, 2)


def test_a_striped_claim_without_a_lease_counts_every_running_job(conn: Conn) -> None:
    _enqueue(conn, "s", 300)
    db.sync_limits(conn, SCHEMA, ["s"], {"s": (200, None)})
    while claim(conn, ["s"], limit=30):
        pass
    assert _running(conn, "s") == 200
    row = conn.execute("SELECT cardinality(pgq.claim_pick(ARRAY['s'], 10))").fetchone()
    assert row == (0,)


def test_a_lowered_limit_holds_the_jobs_running_under_the_old_one(conn: Conn) -> None:
    _enqueue(conn, "s", 800)
    db.sync_limits(conn, SCHEMA, ["s"], {"s": (400, None)})
    held: list[Job] = []
    while jobs := claim(conn, ["s"], limit=50):
        held += jobs
    assert len(held) == 400
    db.sync_limits(conn, SCHEMA, ["s"], {"s": (200, None)})
    assert claim(conn, ["s"], limit=50) == []  # 400 running: every stripe is full
    _finish(conn, held[:300])
    while claim(conn, ["s"], limit=50):
        pass
    assert _running(conn, "s") <= 200


def test_a_key_limited_claim_merges_delayed_jobs_come_due_in_claim_order(conn: Conn) -> None:
    """Delayed jobs come due live in job_delayed_idx (schema/0009), apart from the jobs due when
    inserted: a key-limited claim takes both, in claim order, and keeps FIFO within a key."""
    db.sync_limits(conn, SCHEMA, ["k"], {"k": (None, 1)})
    (older,) = _enqueue(conn, "k", 1, key="a")
    # made delayed (as a retry or a release leaves it), and due: it lives in job_delayed_idx
    conn.execute(
        "UPDATE pgq.job SET start_at = created_at + interval '1 microsecond' WHERE id = %s",
        (older,),
    )
    until(
        lambda: count_rows(conn, where=f"id = '{older}' AND start_at <= now()") == 1,
        "the delayed job to come due",
    )
    _enqueue(conn, "k", 2, key="a")
    (other,) = _enqueue(conn, "k", 1, key="b")
    taken = claim(conn, ["k"], limit=10)
    # key a: the older (delayed) job first and only it; key b: its one job
    assert [j.id for j in taken] == [older, other]
