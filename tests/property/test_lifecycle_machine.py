"""The job lifecycle (SPEC §3, §4) as a hypothesis state machine against a real database.

A plain Python model predicts each job's state, retry count, lease and attempt history, the
dependencies a job still waits for (issue 13), and each bundle's counter and completions.
After every step the database must agree with the model and satisfy B1-B4, J1-J5 and D1, and
the step must have sent exactly the notifications the model expects (read up to a sentinel,
so nothing is waited for by time).
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Literal

import psycopg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import params as db_params
from pgq_supervisor.jobs import AttemptKind, BundleId, JobId, JobState, LeaseToken
from tests.property.invariants import SCHEMA, TERMINAL, q, violations

PENDING, RUNNING = JobState.PENDING, JobState.RUNNING
SUCCEEDED, FAILED, CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED

TYPES = ("a", "b")
DONE = "bundle_done"
ALL_TYPES = (*TYPES, DONE)
# the handlers' max_retry_count, as a supervisor passes it to the claim
DEFAULT_MAX = {"a": 0, "b": 2, DONE: 1}
WORKERS = 3
DEAD_AFTER = 60.0
# far enough ahead that a delayed job never comes due by itself during a test
LATER = timedelta(hours=1)
SENTINEL = "pgq_test_sentinel"
CHANNELS = (
    "pgq_job_available",
    "pgq_job_stopped",
    "pgq_bundle_stopped",
    "pgq_job_cancel",
    SENTINEL,
)
_SENTINELS = itertools.count()

JobSpec = tuple[str, int, int | None, bool]  # type, priority, max_retry_count, delayed
JOB_SPECS = st.tuples(
    st.sampled_from(TYPES), st.integers(-1, 1), st.none() | st.integers(0, 2), st.booleans()
)
BUNDLE_SPECS = st.lists(JOB_SPECS, min_size=1, max_size=4)
ON_COMPLETE = st.sampled_from([None, DONE])
WORKER_NUMBERS = st.integers(0, WORKERS - 1)
# mostly every type, as a supervisor serves them, sometimes a subset
SERVED_TYPES = st.sampled_from([ALL_TYPES, TYPES, ("a",), ("b", DONE), (DONE,)])
Outcome = Literal["succeed", "retry", "retry_later", "fail_permanently"]
OUTCOMES: tuple[Outcome, ...] = ("succeed", "retry", "retry_later", "fail_permanently")


@dataclass
class ModelJob:
    id: JobId
    type: str
    priority: int
    bundle_id: BundleId | None
    max_retry: int | None  # None until the first claim fills in the handler's default
    completes: BundleId | None = None  # set on a bundle's completion job
    state: JobState = PENDING
    retries: int = 0
    lease: LeaseToken | None = None
    worker: str | None = None
    delayed: bool = False
    stale: bool = False
    attempts: int = 0  # entries in the attempt history
    deleted: bool = False
    deps: list[JobId] = field(default_factory=list)
    rule: str = "cancel"  # on_dependency_failure
    waiting: int = 0  # waiting_on


@dataclass
class ModelBundle:
    id: BundleId
    on_complete: str | None
    members: list[JobId]
    complete: bool = False
    completions: int = 0


@dataclass
class Expected:
    """What one step must notify."""

    available: set[str] = field(default_factory=set)
    stopped: set[JobId] = field(default_factory=set)
    bundles: Counter[BundleId] = field(default_factory=Counter)
    cancels: set[tuple[JobId, str]] = field(default_factory=set)  # running job, its worker


def _sequential_uuids() -> Iterator[uuid.UUID]:
    """Ids and leases in creation order: the claim breaks priority/created_at ties by id, so
    this makes a replayed example claim the same jobs (shrinking needs that)."""
    for n in itertools.count(1):
        yield uuid.UUID(int=(0x5EED << 96) | n)


def machine_settings() -> settings:
    """The loaded profile (ci or deep), with a floor: a bundle needs a few dozen steps to
    complete, be reset and complete again, and the ci profile's 60 x 30 reaches that rarely."""
    profile = settings.default
    assert profile is not None
    return settings(
        profile,
        max_examples=max(profile.max_examples, 100),
        stateful_step_count=max(profile.stateful_step_count, 50),
    )


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self, conn: db.Conn, listener: db.Conn) -> None:
        super().__init__()
        self.conn = conn
        self.listener = listener
        conn.execute(
            q(
                "TRUNCATE {schema}.job, {schema}.job_bundle, {schema}.job_dependency,"
                " {schema}.workflow_step, {schema}.workflow_signal"
            )
        )
        self._read_notifications()  # whatever an earlier example left behind
        self.jobs: dict[JobId, ModelJob] = {}
        self.batches: dict[BundleId, ModelBundle] = {}
        self.leases: dict[LeaseToken, tuple[str, list[JobId]]] = {}  # every lease ever issued
        self.generation = [0] * WORKERS  # a dead worker comes back under a new id
        self.payloads = itertools.count()
        self.expected = Expected()

    def _live(self) -> list[ModelJob]:
        return [j for j in self.jobs.values() if not j.deleted]

    def _running(self) -> list[ModelJob]:
        return [j for j in self._live() if j.state is RUNNING]

    def _worker_id(self, n: int) -> str:
        return f"w{n}.{self.generation[n]}"

    def _live_leases(self) -> list[LeaseToken]:
        held = {j.lease for j in self._running()}
        return [lease for lease in self.leases if lease in held]

    def _lost_leases(self) -> list[tuple[LeaseToken, JobId]]:
        return [
            (lease, job_id)
            for lease, (_, ids) in self.leases.items()
            for job_id in ids
            if self.jobs[job_id].lease != lease
        ]

    def _eligible(self, types: Sequence[str]) -> list[ModelJob]:
        return [
            j
            for j in self._live()
            if j.state is PENDING and not j.delayed and not j.waiting and j.type in types
        ]

    def _waiting_on(self, job_id: JobId) -> list[ModelJob]:
        return [j for j in self._live() if job_id in j.deps and j.state is PENDING and j.waiting]

    def _unmet(self, job: ModelJob) -> int:
        """What a dependent counts as unmet when it is enqueued or reset."""
        deps = [self.jobs[i] for i in job.deps if not self.jobs[i].deleted]
        return sum(
            1
            for d in deps
            if d.state in (PENDING, RUNNING)
            or (job.rule == "cancel" and d.state in (FAILED, CANCELLED))
        )

    def _dependency_ended(self, root: ModelJob, how: str, *, release: bool = True) -> None:
        """schema/0005: a failure (or deletion) cancels the waiting dependents under 'cancel',
        transitively; then what still waits on each ended job counts it as met."""
        ended = [root]
        if how != "succeeded":
            frontier = [root]
            while frontier:
                doomed = [d for x in frontier for d in self._waiting_on(x.id) if d.rule == "cancel"]
                frontier = list({d.id: d for d in doomed}.values())
                for d in frontier:
                    d.state, d.waiting = CANCELLED, 0
                    self.expected.stopped.add(d.id)
                ended += frontier
        for x in ended if release else ended[1:]:
            for d in self._waiting_on(x.id):
                d.waiting -= 1
                if not d.waiting and not d.delayed:
                    self.expected.available.add(d.type)

    def _held(self, lease: LeaseToken) -> list[ModelJob]:
        return [j for j in self._running() if j.lease == lease]

    def _add_job(self, job: ModelJob) -> None:
        assert job.id not in self.jobs
        self.jobs[job.id] = job
        if not job.delayed:
            self.expected.available.add(job.type)

    def _release(self, job: ModelJob, *, delayed: bool = False) -> None:
        job.state, job.lease, job.worker, job.stale = PENDING, None, None, False
        job.delayed = delayed
        if not delayed:
            self.expected.available.add(job.type)

    def _stop(self, job: ModelJob, state: JobState) -> None:
        job.state, job.lease, job.stale, job.waiting = state, None, False, 0
        self.expected.stopped.add(job.id)
        self._dependency_ended(job, state.value)

    def _fail_attempt(self, job: ModelJob, *, allow_retry: bool, delayed: bool) -> JobState:
        """end_attempt on a running job: retry while attempts are left, else failed."""
        assert job.state is RUNNING and job.max_retry is not None
        job.attempts += 1
        if allow_retry and job.retries < job.max_retry:
            job.retries += 1
            self._release(job, delayed=delayed)
            return PENDING
        self._stop(job, FAILED)
        return FAILED

    def _counter(self, bundle: ModelBundle) -> tuple[int, int]:
        members = [self.jobs[i] for i in bundle.members if not self.jobs[i].deleted]
        return len(members), sum(1 for j in members if j.state.is_terminal)

    def _snapshot(self, job_ids: Sequence[JobId]) -> list[object]:
        """Every job and bundle row named, in full, to prove a refused write changed nothing."""
        jobs = self.conn.execute(
            q("SELECT to_jsonb(j) FROM {schema}.job j WHERE id = ANY(%s) ORDER BY id"),
            [list(job_ids)],
        ).fetchall()
        bundles = self.conn.execute(
            q("SELECT to_jsonb(b) FROM {schema}.job_bundle b ORDER BY id")
        ).fetchall()
        count = self.conn.execute(q("SELECT count(*) FROM {schema}.job")).fetchall()
        return [*jobs, *bundles, *count]

    def _committed(self) -> None:
        """Account for bundle completions the step caused, then check its notifications."""
        completed: list[ModelBundle] = []
        for bundle in self.batches.values():
            num, stopped = self._counter(bundle)
            now_complete = num > 0 and stopped == num
            if now_complete and not bundle.complete:
                bundle.completions += 1
                self.expected.bundles[bundle.id] += 1
                if bundle.on_complete is not None:
                    completed.append(bundle)
            bundle.complete = now_complete
        self._adopt_completion_jobs(completed)
        self._check_notifications()
        self.expected = Expected()

    def _adopt_completion_jobs(self, completed: list[ModelBundle]) -> None:
        """The only jobs the model did not enqueue itself: one per completion (B4)."""
        rows = self.conn.execute(
            q(
                "SELECT id, type, payload, bundle_id, state, origin, max_retry_count"
                " FROM {schema}.job WHERE NOT (id = ANY(%s))"
            ),
            [[j.id for j in self._live()]],
        ).fetchall()
        assert all(isinstance(r[2], dict) and "bundle_id" in r[2] for r in rows), rows
        by_bundle = {BundleId(uuid.UUID(r[2]["bundle_id"])): r for r in rows}
        assert len(by_bundle) == len(rows), f"several completion jobs for one bundle: {rows}"
        assert set(by_bundle) == {b.id for b in completed}, (
            f"completion jobs {rows} for bundles that completed: {[b.id for b in completed]}"
        )
        for bundle in completed:
            job_id, type_, payload, bundle_id, state, origin, max_retry = by_bundle[bundle.id]
            assert type_ == bundle.on_complete
            assert payload == {"bundle_id": str(bundle.id)}
            assert (bundle_id, state, max_retry) == (None, PENDING.value, None)
            assert origin is not None and origin.startswith("bundle:")
            self._add_job(
                ModelJob(JobId(job_id), type_, 0, None, None, completes=bundle.id),
            )

    def _read_notifications(self) -> list[psycopg.Notify]:
        """Everything notified since the last call: sent up to a sentinel, which arrives after
        all of them because notifications are delivered in commit order."""
        token = str(next(_SENTINELS))
        self.conn.execute("SELECT pg_notify(%s, %s)", [SENTINEL, token])
        got: list[psycopg.Notify] = []
        for note in self.listener.notifies(timeout=10.0):
            if note.channel == SENTINEL:
                if note.payload == token:
                    return got
                continue
            got.append(note)
        raise AssertionError(f"sentinel {token} never arrived; got {got}")

    def _check_notifications(self) -> None:
        notes = self._read_notifications()
        available = {n.payload for n in notes if n.channel == "pgq_job_available"}
        stopped = [
            JobId(uuid.UUID(i))
            for n in notes
            if n.channel == "pgq_job_stopped"
            for i in n.payload.split(",")
        ]
        bundles = Counter(
            BundleId(uuid.UUID(n.payload)) for n in notes if n.channel == "pgq_bundle_stopped"
        )
        assert available == self.expected.available, "pgq_job_available"
        assert len(stopped) == len(set(stopped)), f"a job stopped twice: {stopped}"
        assert set(stopped) == self.expected.stopped, "pgq_job_stopped"
        assert bundles == self.expected.bundles, "pgq_bundle_stopped (B4: once per completion)"
        cancels = [json.loads(n.payload) for n in notes if n.channel == "pgq_job_cancel"]
        assert sorted((JobId(uuid.UUID(c["job_id"])), c["worker_id"]) for c in cancels) == sorted(
            self.expected.cancels
        ), "pgq_job_cancel"

    def _enqueue(self, spec: JobSpec) -> None:
        type_, priority, max_retry, delayed = spec
        job_id = pgq.enqueue(
            self.conn,
            type_,
            {"n": next(self.payloads)},
            priority=priority,
            max_retry_count=max_retry,
            start_at=datetime.now(UTC) + LATER if delayed else None,
        )
        self._add_job(ModelJob(job_id, type_, priority, None, max_retry, delayed=delayed))
        self._committed()

    def _enqueue_bundle(self, specs: list[JobSpec], on_complete: str | None) -> None:
        payloads = [next(self.payloads) for _ in specs]
        jobs = [
            pgq.NewJob(t, {"n": n}, p, datetime.now(UTC) + LATER if delayed else None, m)
            for n, (t, p, m, delayed) in zip(payloads, specs, strict=True)
        ]
        bundle = pgq.enqueue_bundle(self.conn, "batch", jobs, on_complete=on_complete)
        assert (bundle.num_jobs, bundle.num_jobs_stopped) == (len(specs), 0)
        assert bundle.on_complete == on_complete
        rows = self.conn.execute(
            q(
                "SELECT id, (payload->>'n')::int, type, priority, max_retry_count,"
                "       start_at > now(), state"
                " FROM {schema}.job WHERE bundle_id = %s ORDER BY 2"
            ),
            [bundle.id],
        ).fetchall()
        assert [r[1:] for r in rows] == [
            (n, *spec, PENDING.value) for n, spec in zip(payloads, specs, strict=True)
        ]
        for r in rows:
            self._add_job(ModelJob(JobId(r[0]), r[2], r[3], bundle.id, r[4], delayed=r[5]))
        self.batches[bundle.id] = ModelBundle(bundle.id, on_complete, [JobId(r[0]) for r in rows])
        self._committed()

    @initialize(
        jobs=st.lists(JOB_SPECS, max_size=3),
        bundles=st.lists(st.tuples(BUNDLE_SPECS, ON_COMPLETE), min_size=1, max_size=2),
        claims=st.lists(st.tuples(WORKER_NUMBERS, SERVED_TYPES, st.integers(1, 3)), max_size=3),
    )
    def start(
        self,
        jobs: list[JobSpec],
        bundles: list[tuple[list[JobSpec], str | None]],
        claims: list[tuple[int, Sequence[str], int]],
    ) -> None:
        """Every example starts with jobs in hand, so the rules that need some are reached."""
        for spec in jobs:
            self._enqueue(spec)
        for specs, on_complete in bundles:
            self._enqueue_bundle(specs, on_complete)
        for worker, types, limit in claims:
            self._claim(worker, types, limit)

    @rule(spec=JOB_SPECS)
    def enqueue(self, spec: JobSpec) -> None:
        self._enqueue(spec)

    @rule(specs=BUNDLE_SPECS, on_complete=ON_COMPLETE)
    def enqueue_bundle(self, specs: list[JobSpec], on_complete: str | None) -> None:
        self._enqueue_bundle(specs, on_complete)

    @precondition(lambda self: self._live())
    @rule(data=st.data(), type_=st.sampled_from(TYPES), rule=st.sampled_from(["cancel", "run"]))
    def enqueue_dependent(self, data: st.DataObject, type_: str, rule: str) -> None:
        """A job that runs after one or two others; an unknown id is refused, nothing written."""
        pool = [j.id for j in self._live()]
        deps = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique=True))
        if data.draw(st.booleans(), "with an unknown id"):
            before = self._snapshot(pool)
            with pytest.raises(pgq.InvalidInput, match="unknown dependency"):
                pgq.enqueue(self.conn, type_, depends_on=[*deps, JobId(uuid.uuid4())])
            assert self._snapshot(pool) == before
            self._committed()
            return
        job_id = pgq.enqueue(
            self.conn,
            type_,
            {"n": next(self.payloads)},
            depends_on=deps,
            on_dependency_failure=rule,  # type: ignore[arg-type]
        )
        job = ModelJob(job_id, type_, 0, None, None, deps=deps, rule=rule)
        self.jobs[job_id] = job
        failed = [self.jobs[i] for i in deps if self.jobs[i].state in (FAILED, CANCELLED)]
        if rule == "cancel" and failed:
            job.state = CANCELLED
            self.expected.stopped.add(job_id)
        else:
            job.waiting = sum(1 for i in deps if self.jobs[i].state in (PENDING, RUNNING))
            if not job.waiting:
                self.expected.available.add(type_)
        self._committed()

    @rule(worker=WORKER_NUMBERS, types=SERVED_TYPES, limit=st.integers(1, 3))
    def claim(self, worker: int, types: Sequence[str], limit: int) -> None:
        self._claim(worker, types, limit)

    def _claim(self, worker: int, types: Sequence[str], limit: int) -> LeaseToken | None:
        worker_id = self._worker_id(worker)
        eligible = self._eligible(types)
        claimed = db.claim(
            self.conn,
            SCHEMA,
            worker_id=worker_id,
            types=list(types),
            max_retry_counts=[DEFAULT_MAX[t] for t in types],
            limit=limit,
        )
        ids = [c.id for c in claimed]
        assert len(claimed) == min(limit, len(eligible)), "claim took too few or too many"
        assert set(ids) <= {e.id for e in eligible}, "claimed a job that was not eligible"
        if claimed:
            passed_over = [e.priority for e in eligible if e.id not in ids]
            assert min(c.priority for c in claimed) >= max(passed_over, default=-99)
            (lease,) = {c.lease for c in claimed}
            assert lease not in self.leases, "a claim reused a lease"
            self.leases[lease] = (worker_id, ids)
        for c in claimed:
            job = self.jobs[c.id]
            if job.max_retry is None:
                job.max_retry = DEFAULT_MAX[job.type]
            assert (c.type, c.bundle_id, c.priority) == (job.type, job.bundle_id, job.priority)
            assert (c.attempt, c.max_retry_count) == (job.retries + 1, job.max_retry)
            assert c.dependencies == tuple(job.deps)
            assert set(c.dependency_results) == {i for i in job.deps if not self.jobs[i].deleted}
            job.state, job.lease, job.worker, job.stale = RUNNING, c.lease, worker_id, False
        self._committed()
        return claimed[0].lease if claimed else None

    @rule()
    def advance(self) -> None:
        """The happy path, one step at a time: the job held longest succeeds, else the next
        job is claimed. Hypothesis draws the rules with fewest arguments most often, so this
        argument-less rule keeps bundles moving towards completion."""
        leases = self._live_leases()
        if not leases:
            self._claim(0, ALL_TYPES, 1)
            return
        job = self._held(leases[0])[0]
        assert db.succeed(self.conn, SCHEMA, leases[0], [(job.id, None)]) == {job.id}
        self._stop(job, SUCCEEDED)
        self._committed()

    @precondition(lambda self: self._live_leases())
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self._live_leases()), "lease")
        # other workers' jobs too: the lease alone decides what is touched
        ids = data.draw(st.lists(st.sampled_from([j.id for j in self._running()]), min_size=1))
        held = db.heartbeat(self.conn, SCHEMA, ids, lease)
        assert held == {i for i in ids if self.jobs[i].lease == lease}
        # a beat is its owner's (schema/0025): every job that worker runs is alive again
        owners = {self.jobs[i].worker for i in held}
        for job in self._running():
            if job.worker in owners:
                job.stale = False
        self._committed()

    @precondition(lambda self: self._live_leases())
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def finish(self, data: st.DataObject, outcome: Outcome) -> None:
        """A worker writes the outcome of jobs it holds: a success (of a batch, as a flush
        does), a handler error (retried at once or later while attempts are left) or a
        PermanentError."""
        lease = data.draw(st.sampled_from(self._live_leases()), "lease")
        held = self._held(lease)
        if outcome == "succeed":
            jobs = data.draw(st.lists(st.sampled_from(held), min_size=1, unique_by=lambda j: j.id))
            results = [(j.id, db.dump_json({"n": k})) for k, j in enumerate(jobs)]
            done = db.succeed(self.conn, SCHEMA, lease, results)
            assert done == {j.id for j in jobs}
            for job in jobs:
                self._stop(job, SUCCEEDED)
        else:
            job = data.draw(st.sampled_from(held), "job")
            allow_retry, delayed = outcome != "fail_permanently", outcome == "retry_later"
            ended = db.end_attempt(
                self.conn,
                SCHEMA,
                [job.id],
                lease=lease,
                error="ValueError: boom" if allow_retry else "PermanentError: no",
                kind=AttemptKind.ERROR if allow_retry else AttemptKind.PERMANENT,
                allow_retry=allow_retry,
                delay=LATER.total_seconds() if delayed else 0.0,
            )
            state = self._fail_attempt(job, allow_retry=allow_retry, delayed=delayed)
            assert [(e.job_id, e.new_state, e.retry_count) for e in ended] == [
                (job.id, state, job.retries)
            ]
        self._committed()

    @precondition(lambda self: self._running())
    @rule(data=st.data(), worker=WORKER_NUMBERS)
    def worker_death(self, data: st.DataObject, worker: int) -> None:
        """The supervisor reaps a dead child: its job in hand fails as an attempt (fenced by
        worker id), the jobs it had claimed but not started go back without using one."""
        worker_id = self._worker_id(worker)
        mine = [j for j in self._running() if j.worker == worker_id]
        in_hand = data.draw(st.sampled_from([None, *mine]), "in hand")
        others = [j.id for j in self._running() if j.worker != worker_id]
        ids = ([] if in_hand is None else [in_hand.id]) + others
        ended = db.end_attempt(
            self.conn,
            SCHEMA,
            ids,
            worker_id=worker_id,
            error="worker died: SIGKILL",
            kind=AttemptKind.WORKER_DEATH,
        )
        expected = []
        if in_hand is not None:
            state = self._fail_attempt(in_hand, allow_retry=True, delayed=False)
            expected.append((in_hand.id, state, in_hand.retries))
        assert [(e.job_id, e.new_state, e.retry_count) for e in ended] == expected
        released = db.release(self.conn, SCHEMA, worker_id=worker_id)
        not_started = [j for j in mine if j is not in_hand]
        assert sorted(released) == sorted(j.id for j in not_started)
        for job in not_started:
            self._release(job)
        self.generation[worker] += 1
        self._committed()

    @precondition(lambda self: self._live_leases())
    @rule(data=st.data())
    def graceful_release(self, data: st.DataObject) -> None:
        """Shutdown hands back what a worker holds under one lease, without using an attempt."""
        lease = data.draw(st.sampled_from(self._live_leases()), "lease")
        released = db.release(self.conn, SCHEMA, lease=lease)
        held = self._held(lease)
        assert sorted(released) == sorted(j.id for j in held)
        for job in held:
            self._release(job)
        self._committed()

    @precondition(lambda self: self._running())
    @rule(data=st.data())
    def heartbeat_goes_stale(self, data: st.DataObject) -> None:
        """A worker stops beating (paused, partitioned): move its last beat (schema/0025: its
        own row) and its jobs' claim stamps into the past; every job it runs goes quiet."""
        worker = data.draw(st.sampled_from(sorted({j.worker or "" for j in self._running()})), "w")
        quiet = [j for j in self._running() if j.worker == worker]
        n = self.conn.execute(
            q(
                "UPDATE {schema}.job SET worker_alive_at = now() - make_interval(secs => %s)"
                " WHERE worker_id = %s AND state = 'running'"
            ),
            [2 * DEAD_AFTER, worker],
        ).rowcount
        assert n == len(quiet)
        self.conn.execute(
            q(
                "UPDATE {schema}.worker SET alive_at = now() - make_interval(secs => %s)"
                " WHERE id = %s"
            ),
            [2 * DEAD_AFTER, worker],
        )
        for job in quiet:
            job.stale = True
        self._committed()

    @precondition(lambda self: self._running())
    @rule()
    def rescue(self) -> None:
        stale = [j for j in self._running() if j.stale]
        ended = db.rescue(self.conn, SCHEMA, dead_after=DEAD_AFTER)
        expected: dict[JobId, tuple[JobState, int]] = {}
        for job in stale:
            state = self._fail_attempt(job, allow_retry=True, delayed=False)
            expected[job.id] = (state, job.retries)
        assert {e.job_id: (e.new_state, e.retry_count) for e in ended} == expected
        self._committed()

    @precondition(lambda self: any(j.delayed for j in self._live()))
    @rule()
    def time_passes(self) -> None:
        """Delayed jobs come due (start_at moved instead of waiting)."""
        delayed = [j for j in self._live() if j.delayed]
        n = self.conn.execute(
            q(
                "UPDATE {schema}.job SET start_at = now()"
                " WHERE state = 'pending' AND start_at > now()"
            )
        ).rowcount
        assert n == len(delayed)
        for job in delayed:
            job.delayed = False
        self._committed()  # a plain UPDATE notifies nothing: the poll finds these jobs

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(list(self.jobs.values())), "job")
        before = self._snapshot([job.id])
        if job.deleted:
            with pytest.raises(pgq.JobNotFound):
                pgq.cancel_job(self.conn, job.id)
        elif job.state is PENDING:
            assert pgq.cancel_job(self.conn, job.id) is PENDING
            job.delayed = False
            self._stop(job, CANCELLED)
        elif job.state is RUNNING:
            # ends now: its worker is fenced out (stale_worker_writes tries its lease), the
            # attempt is recorded, never retried, and its supervisor is told
            assert pgq.cancel_job(self.conn, job.id) is RUNNING
            assert job.worker is not None
            job.attempts += 1
            self.expected.cancels.add((job.id, job.worker))
            self._stop(job, CANCELLED)
        else:
            with pytest.raises(pgq.InvalidTransition):
                pgq.cancel_job(self.conn, job.id)
            assert self._snapshot([job.id]) == before
        self._committed()

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), force=st.booleans())
    def reset(self, data: st.DataObject, force: bool) -> None:
        job = data.draw(st.sampled_from(list(self.jobs.values())), "job")
        before = self._snapshot([job.id])
        if job.deleted:
            with pytest.raises(pgq.JobNotFound):
                pgq.reset_job(self.conn, job.id, force=force)
        elif job.state.is_terminal or (force and job.state is RUNNING):
            # a forced reset fences the running worker out: its lease is gone
            pgq.reset_job(self.conn, job.id, force=force)
            job.retries = 0
            if job.state.is_terminal:
                # the jobs still waiting that counted its end as met wait for it again
                for d in self._waiting_on(job.id):
                    if job.state is SUCCEEDED or d.rule == "run":
                        d.waiting += 1
                self._release(job)
                job.waiting = self._unmet(job)
            else:
                self._release(job)
        else:
            with pytest.raises(pgq.InvalidTransition):
                pgq.reset_job(self.conn, job.id, force=force)
            assert self._snapshot([job.id]) == before
        self._committed()

    @precondition(lambda self: self._live())
    @rule(data=st.data(), bundled=st.booleans())
    def delete(self, data: st.DataObject, bundled: bool) -> None:
        """An operator deletes a row by hand; a bundle's counters must stay true."""
        pool = [j for j in self._live() if (j.bundle_id is not None) == bundled] or self._live()
        job = data.draw(st.sampled_from(pool), "job")
        n = self.conn.execute(q("DELETE FROM {schema}.job WHERE id = %s"), [job.id]).rowcount
        assert n == 1
        if job.state is not SUCCEEDED:
            # counts as its failure for the jobs waiting on it (schema/0005)
            self._dependency_ended(job, "deleted", release=job.state in (PENDING, RUNNING))
        job.deleted, job.lease = True, None
        self._committed()

    @precondition(lambda self: self._lost_leases())
    @rule(
        data=st.data(),
        write=st.sampled_from(["heartbeat", "succeed", "fail", "fail_permanently", "release"]),
    )
    def stale_worker_writes(self, data: st.DataObject, write: str) -> None:
        """A worker that lost its lease (rescued, reset, reaped, deleted) writes nothing."""
        lease, job_id = data.draw(st.sampled_from(self._lost_leases()), "lost lease")
        worker_id = self.leases[lease][0]
        before = self._snapshot([job_id])
        if write == "heartbeat":
            assert db.heartbeat(self.conn, SCHEMA, [job_id], lease) == set()
        elif write == "succeed":
            assert db.succeed(self.conn, SCHEMA, lease, [(job_id, '{"late": true}')]) == set()
        elif write == "release":
            assert db.release(self.conn, SCHEMA, ids=[job_id], lease=lease) == []
        else:
            ended = db.end_attempt(
                self.conn,
                SCHEMA,
                [job_id],
                lease=lease,
                worker_id=worker_id,
                error="late error",
                kind=AttemptKind.ERROR,
                allow_retry=write == "fail",
            )
            assert ended == []
        assert self._snapshot([job_id]) == before
        self._committed()

    @invariant()
    def sql_invariants_hold(self) -> None:
        assert violations(self.conn) == []

    @invariant()
    def bundles_match_model(self) -> None:
        rows = self.conn.execute(
            q(
                "SELECT b.id, b.num_jobs, b.num_jobs_stopped, count(j.id),"
                "       count(j.id) FILTER (WHERE j.state::text = ANY(%s)), b.on_complete"
                " FROM {schema}.job_bundle b LEFT JOIN {schema}.job j ON j.bundle_id = b.id"
                " GROUP BY b.id"
            ),
            [TERMINAL],
        ).fetchall()
        assert {r[0] for r in rows} == set(self.batches)
        for bundle_id, num, stopped, count, terminal, on_complete in rows:
            bundle = self.batches[bundle_id]
            assert 0 <= stopped <= num, "B1"
            assert num == count, "B2"
            assert stopped == terminal, "B3"
            assert (num, stopped) == self._counter(bundle)
            assert on_complete == bundle.on_complete
        rows = self.conn.execute(
            q(
                "SELECT b.id, count(c.id) FROM {schema}.job_bundle b"
                " LEFT JOIN {schema}.job c ON c.bundle_id IS NULL AND c.type = b.on_complete"
                "  AND c.payload = jsonb_build_object('bundle_id', b.id::text)"
                " GROUP BY b.id"
            )
        ).fetchall()
        callbacks = Counter(j.completes for j in self._live() if j.completes is not None)
        made = Counter(j.completes for j in self.jobs.values() if j.completes is not None)
        for bundle_id, count in rows:
            bundle = self.batches[bundle_id]
            assert count == callbacks[bundle_id], "B4: completion jobs in the database"
            expected = bundle.completions if bundle.on_complete is not None else 0
            assert made[bundle_id] == expected, "B4: one completion job per completion"

    @invariant()
    def jobs_match_model(self) -> None:
        rows = self.conn.execute(
            q(
                "SELECT id, state, current_retry_count, max_retry_count, lease, worker_id,"
                "       started_at IS NOT NULL, stopped_at IS NOT NULL,"
                "       worker_alive_at IS NOT NULL, start_at > now(),"
                "       {schema}.job_alive_at(state, worker_alive_at, worker_id)"
                "         < now() - make_interval(secs => %s),"
                "       jsonb_array_length(attempts), bundle_id, type, waiting_on"
                " FROM {schema}.job"
            ),
            [DEAD_AFTER],
        ).fetchall()
        live = {j.id: j for j in self._live()}
        assert {r[0] for r in rows} == set(live), "J5: a job was lost or appeared"
        for r in rows:
            job_id, state, retries, max_retry, lease, worker = r[:6]
            started, stopped, alive, delayed, stale, attempts, bundle_id, type_, waiting = r[6:]
            state = JobState(state)
            if alive:
                assert state is RUNNING, "J1"
            if state is PENDING:
                assert not (started or stopped or alive or worker or lease), "J2"
            assert 0 <= retries <= (0 if max_retry is None else max_retry), "J3"
            job = live[job_id]
            assert lease == job.lease, "J4: the database and the model disagree on the lease"
            assert (state, retries, max_retry) == (job.state, job.retries, job.max_retry)
            assert (bundle_id, type_, attempts) == (job.bundle_id, job.type, job.attempts)
            assert waiting == job.waiting, "the jobs it waits for"
            if state is PENDING:
                assert delayed == job.delayed
            if state is RUNNING:
                assert (worker, bool(stale)) == (job.worker, job.stale)

    def teardown(self) -> None:
        self._read_notifications()


@pytest.fixture
def listener(dsn: str) -> Iterator[db.Conn]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for channel in CHANNELS:
            conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        yield conn


def test_job_lifecycle_state_machine(
    conn: db.Conn, listener: db.Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _sequential_uuids()
    monkeypatch.setattr(db_params, "uuid", SimpleNamespace(uuid4=lambda: next(ids), UUID=uuid.UUID))

    class Machine(LifecycleMachine):
        def __init__(self) -> None:
            # the sequence restarts with every example, so a replay makes the same ids
            nonlocal ids
            ids = _sequential_uuids()
            super().__init__(conn, listener)

    run_state_machine_as_test(Machine, settings=machine_settings())
