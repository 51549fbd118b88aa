"""Many workers at once on the same few bundles (SPEC §4: the invariants hold "under any
interleaving").

Eight threads, each on its own connection, run seeded random lifecycle operations (claim,
batch success, failure with and without retry, heartbeat, cancel, reset, stale-heartbeat
rescue, worker death, delete) against three shared bundles, so the bundle rows and the job rows
are really contended. Each thread also checks the invariants in single-statement snapshots
while the others write. At the end every job is driven to a terminal state and each bundle's
completion job must exist exactly once per transition to complete, as counted independently by
an audit trigger and by the `pgq_bundle_stopped` notifications.

The run is bounded by an iteration count (the `ci` and `deep` hypothesis profiles scale it);
a thread's choices are reproducible from PGQ_STRESS_SEED, the interleaving is not. An
operation PostgreSQL aborts to break a deadlock is retried and counted in the summary line
the test prints, so deadlocks are visible rather than hidden.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import psycopg
import pytest
from hypothesis import settings
from psycopg import errors as pg_errors

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.jobs import AttemptKind, Job, JobId, LeaseToken
from tests.property.invariants import (
    SCHEMA,
    audited_completions,
    b4_violations,
    install_completion_audit,
    q,
    violations,
)

THREADS = 8
TYPES = ("s1", "s2")
DONE = "s_done"
ALL_TYPES = [*TYPES, DONE]
MAX_RETRY = [1, 2, 1]  # per ALL_TYPES, as the handlers would declare them
BUNDLES = 3  # the first two name a completion job type
JOBS_PER_BUNDLE = 12
STANDALONE = 8
DEAD_AFTER = 60.0
SEED = int(os.environ.get("PGQ_STRESS_SEED", "4711"))
DEADLOCK_RETRIES = 10


def iterations_per_thread() -> int:
    """Operations each thread runs: follows the hypothesis profile (ci: 960, deep: 8000; the
    cap keeps deep within minutes on two cores)."""
    profile = settings.default
    assert profile is not None
    return min(16 * profile.max_examples, 8000)


@dataclass
class Shared:
    """What the threads know about the shared jobs, and what they report."""

    jobs: list[JobId]
    deletable: list[JobId]  # a third of the bundled jobs, so the bundles never run empty
    lock: threading.Lock = field(default_factory=threading.Lock)
    deleted: set[JobId] = field(default_factory=set)
    ops: Counter[str] = field(default_factory=Counter)
    deadlocks: Counter[str] = field(default_factory=Counter)
    fenced: Counter[str] = field(default_factory=Counter)  # writes refused for a lost lease

    def count(self, counter: Counter[str], key: str, n: int = 1) -> None:
        with self.lock:
            counter[key] += n


class Actor:
    """One simulated worker process, also acting as operator and rescuer now and then."""

    def __init__(self, n: int, dsn: str, shared: Shared, start: threading.Barrier) -> None:
        self.n = n
        self.dsn = dsn
        self.shared = shared
        self.start = start
        self.rng = random.Random(SEED * 1000 + n)
        self.generation = 0
        self.held: dict[LeaseToken, list[Job]] = {}
        self.ops: list[tuple[Callable[[], None], int]] = [
            (self.claim, 20),
            (self.flush, 16),
            (self.fail, 8),
            (self.fail_permanently, 2),
            (self.heartbeat, 5),
            (self.cancel, 5),
            (self.reset, 10),
            (self.rescue, 5),
            (self.worker_death, 3),
            (self.delete, 2),
            (self.check_invariants, 4),
        ]

    @property
    def worker_id(self) -> str:
        return f"stress{self.n}.{self.generation}"

    def run(self, iterations: int) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as self.conn:
            self.start.wait()
            funcs, weights = zip(*self.ops, strict=True)
            for _ in range(iterations):
                self._attempt(self.rng.choices(funcs, weights)[0])
            while self.held:
                self._attempt(self.flush)

    def _attempt(self, op: Callable[[], None]) -> None:
        """Run `op`, again if PostgreSQL broke a deadlock by aborting it (counted, and printed:
        a flush used to lock bundle rows before its job rows while the bundle trigger behind
        rescue, delete and reset locks the job row first; a rescue spanning several bundles
        can still take their locks in row order)."""
        name = op.__name__
        for _ in range(DEADLOCK_RETRIES):
            try:
                op()
            except (DatabaseError, pg_errors.DeadlockDetected) as exc:
                cause = exc if isinstance(exc, pg_errors.DeadlockDetected) else exc.__cause__
                if not isinstance(cause, pg_errors.DeadlockDetected):
                    raise
                self.shared.count(self.shared.deadlocks, name)
            else:
                self.shared.count(self.shared.ops, name)
                return
        raise AssertionError(f"{name} deadlocked {DEADLOCK_RETRIES} times in a row")

    def _pick_lease(self) -> LeaseToken | None:
        return self.rng.choice(sorted(self.held)) if self.held else None

    def _drop(self, lease: LeaseToken, ids: set[JobId]) -> None:
        """Forget jobs the worker wrote for (or lost); a lease with none left is done."""
        left = [j for j in self.held[lease] if j.id not in ids]
        if left:
            self.held[lease] = left
        else:
            del self.held[lease]

    def _fenced(self, op: str, asked: int, done: int) -> None:
        if done < asked:
            self.shared.count(self.shared.fenced, op, asked - done)

    def claim(self) -> None:
        jobs = db.claim(
            self.conn,
            SCHEMA,
            worker_id=self.worker_id,
            types=ALL_TYPES,
            max_retry_counts=MAX_RETRY,
            limit=self.rng.randint(1, 3),
        )
        if jobs:
            self.held[jobs[0].lease] = jobs

    def flush(self) -> None:
        """Batch success, as the completer writes it: one statement, whose bundle trigger
        locks the bundles in id order after the job rows (schema/0024)."""
        lease = self._pick_lease()
        if lease is None:
            return
        jobs = self.held[lease]
        done = db.succeed(
            self.conn, SCHEMA, lease, [(j.id, db.dump_json({"by": self.n})) for j in jobs]
        )
        self._fenced("succeed", len(jobs), len(done))
        self._drop(lease, {j.id for j in jobs})

    def _end_attempt(self, allow_retry: bool) -> None:
        lease = self._pick_lease()
        if lease is None:
            return
        job = self.rng.choice(self.held[lease])
        ended = db.end_attempt(
            self.conn,
            SCHEMA,
            [job.id],
            lease=lease,
            error="stress failure",
            kind=AttemptKind.ERROR if allow_retry else AttemptKind.PERMANENT,
            allow_retry=allow_retry,
        )
        self._fenced("end_attempt", 1, len(ended))
        self._drop(lease, {job.id})

    def fail(self) -> None:
        self._end_attempt(allow_retry=True)

    def fail_permanently(self) -> None:
        self._end_attempt(allow_retry=False)

    def heartbeat(self) -> None:
        for lease, jobs in list(self.held.items()):
            alive = db.heartbeat(self.conn, SCHEMA, [j.id for j in jobs], lease)
            lost = {j.id for j in jobs} - alive
            self._fenced("heartbeat", len(jobs), len(alive))
            if lost:
                self._drop(lease, lost)

    def cancel(self) -> None:
        job_id = self.rng.choice(self.shared.jobs)
        with contextlib.suppress(pgq.InvalidTransition, pgq.JobNotFound):
            pgq.cancel_job(self.conn, job_id)

    def reset(self) -> None:
        job_id = self.rng.choice(self.shared.jobs)
        with contextlib.suppress(pgq.InvalidTransition, pgq.JobNotFound):
            pgq.reset_job(self.conn, job_id, force=self.rng.random() < 0.2)

    def rescue(self) -> None:
        """Some heartbeats went stale (moved into the past, one row per statement as a
        paused worker would leave them: the job's claim stamp and its owner's beat), then this
        thread runs the rescuer."""
        for job_id in self.rng.sample(self.shared.jobs, 2):
            self.conn.execute(
                q(
                    "UPDATE {schema}.job SET worker_alive_at = now() - make_interval(secs => %s)"
                    " WHERE id = %s AND state = 'running'"
                ),
                [2 * DEAD_AFTER, job_id],
            )
            self.conn.execute(  # and its owner's own beat (schema/0025)
                q(
                    "UPDATE {schema}.worker w SET alive_at = now() - make_interval(secs => %s)"
                    " FROM {schema}.job j WHERE j.id = %s AND w.id = j.worker_id"
                ),
                [2 * DEAD_AFTER, job_id],
            )
        db.rescue(self.conn, SCHEMA, dead_after=DEAD_AFTER)

    def worker_death(self) -> None:
        """This worker dies: the reaper fails its job in hand and releases the rest."""
        if self.held:
            in_hand = self.held[sorted(self.held)[0]][0]
            db.end_attempt(
                self.conn,
                SCHEMA,
                [in_hand.id],
                worker_id=self.worker_id,
                error="worker died: SIGKILL",
                kind=AttemptKind.WORKER_DEATH,
            )
        db.release(self.conn, SCHEMA, worker_id=self.worker_id)
        self.held.clear()
        self.generation += 1

    def delete(self) -> None:
        job_id = self.rng.choice(self.shared.deletable)
        n = self.conn.execute(q("DELETE FROM {schema}.job WHERE id = %s"), [job_id]).rowcount
        if n:
            with self.shared.lock:
                self.shared.deleted.add(job_id)

    def check_invariants(self) -> None:
        broken = violations(self.conn) + b4_violations(self.conn)
        assert broken == [], f"invariants broken while others write: {broken}"


def _drive_to_the_end(conn: db.Conn) -> None:
    """Run every remaining job to success, one worker, until none is left."""
    while jobs := db.claim(
        conn, SCHEMA, worker_id="final", types=ALL_TYPES, max_retry_counts=MAX_RETRY, limit=100
    ):
        assert db.succeed(conn, SCHEMA, jobs[0].lease, [(j.id, None) for j in jobs]) == {
            j.id for j in jobs
        }


def _bundle_notifications(listener: db.Conn, conn: db.Conn) -> Counter[str]:
    """pgq_bundle_stopped payloads so far, read up to a sentinel sent after all of them."""
    token = uuid.uuid4().hex
    conn.execute("SELECT pg_notify('pgq_test_sentinel', %s)", [token])
    got: Counter[str] = Counter()
    for note in listener.notifies(timeout=30.0):
        if note.channel == "pgq_test_sentinel" and note.payload == token:
            return got
        if note.channel == "pgq_bundle_stopped":
            got[note.payload] += 1
    raise AssertionError("the sentinel notification never arrived")


@pytest.fixture
def listener(dsn: str) -> Iterator[db.Conn]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN pgq_bundle_stopped")
        conn.execute("LISTEN pgq_test_sentinel")
        yield conn


def test_concurrent_lifecycle_keeps_invariants(
    dsn: str, conn: db.Conn, listener: db.Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    install_completion_audit(conn)
    bundles: list[pgq.Bundle] = []
    for b in range(BUNDLES):
        jobs = [pgq.NewJob(TYPES[i % 2], {"b": b, "i": i}) for i in range(JOBS_PER_BUNDLE)]
        on_complete = DONE if b < 2 else None
        bundles.append(pgq.enqueue_bundle(conn, "stress", jobs, on_complete=on_complete))
    bundled = [
        JobId(r[0])
        for r in conn.execute(
            q("SELECT id FROM {schema}.job WHERE bundle_id IS NOT NULL ORDER BY payload")
        ).fetchall()
    ]
    standalone = pgq.enqueue_many(conn, [pgq.NewJob("s1", {"i": i}) for i in range(STANDALONE)])
    shared = Shared(jobs=bundled + standalone, deletable=bundled[::3])

    iterations = iterations_per_thread()
    start = threading.Barrier(THREADS, timeout=60)
    with ThreadPoolExecutor(THREADS) as pool:
        actors = [Actor(n, dsn, shared, start) for n in range(THREADS)]
        for future in [pool.submit(a.run, iterations) for a in actors]:
            future.result()

    # every thread handed back what it held: nothing may be left running by nobody
    running = conn.execute(q("SELECT count(*) FROM {schema}.job WHERE state = 'running'"))
    assert running.fetchone() == (0,)
    _drive_to_the_end(conn)

    assert violations(conn) == []
    assert b4_violations(conn) == []
    # J5: no job lost; the only new jobs are completion jobs
    rows = conn.execute(q("SELECT id, bundle_id, type, state FROM {schema}.job")).fetchall()
    assert {JobId(r[0]) for r in rows if r[2] != DONE} == set(shared.jobs) - shared.deleted
    assert {r[3] for r in rows} <= {"succeeded", "failed", "cancelled"}
    # B4 by three independent counts: audit trigger, notifications, completion jobs
    audited = audited_completions(conn)
    notified = _bundle_notifications(listener, conn)
    assert dict(notified) == audited
    callbacks = Counter(
        r[0] for r in conn.execute(q("SELECT payload->>'bundle_id' FROM {schema}.job")).fetchall()
    )
    for bundle in bundles:
        current = pgq.get_bundle(conn, bundle.id)
        assert current.is_complete or current.num_jobs == 0
        key = str(bundle.id)
        assert audited.get(key, 0) >= (1 if current.num_jobs else 0)
        expected = audited.get(key, 0) if bundle.on_complete else 0
        assert callbacks[key] == expected, f"bundle {key}: completion jobs vs completions"

    with capsys.disabled():
        print(
            f"\nstress: {THREADS} threads x {iterations} ops ({sum(shared.ops.values())} done),"
            f" seed {SEED};"
            f" completions {sorted(audited.values())}; deleted {len(shared.deleted)};"
            f" fenced writes {dict(shared.fenced)}; deadlocks retried {dict(shared.deadlocks)}"
        )
