"""Fair claims across tenants (the `fairness` group, issue 24 item 4).

Tenant A has `FAIR_BACKLOG` pending jobs of one type; tenants B..K each enqueue one job of that
type a second (staggered, ten a second in all) while `--procs 2` drain it. The figures:
- the small tenants' wake-to-start p99 (the handler's start minus the enqueue's commit, both
  by this machine's clock), beside the same stream into an empty queue (target: <= 2x);
- the type's drain, A's backlog by the database clock from the start gate's opening, beside
  the same backlog enqueued without a tenant (the plain claim; target: >= 0.8x);
- beside it, what fairness itself promises, free of the machine's load: how many claims of
  A's jobs began after a small tenant's job was enqueued and did not take it (each claim's
  start, `started_at`, against the enqueue's commit, both by this machine's clock), p99. 0:
  the next claim took it, whatever A's backlog; without tenants it would wait for all of A's
  jobs, about FAIR_BACKLOG / CLAIM_LIMIT claims. What is left of the wake-to-start beside the
  backlog is then the children's cycle (a claim of up to 200 that also writes the last batch's
  successes, then the batch): with both cores busy draining, no child is free when the job
  comes, which the empty queue's figure does not pay;
- the claim's cost: the mean time of a claim of 200 with `FAIR_BACKLOG` jobs spread over 10
  and over 1,000 tenants (constant in the number of tenants: the ratio should be near 1).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

import pgq_supervisor as pgq
from benchmarks.apps import WAKE
from benchmarks.drain import GATE_TIMEOUT, run_drain
from benchmarks.enqueue import BULK_CHUNK
from benchmarks.probes import percentile
from benchmarks.procs import BenchError, Supervisor, running, wait_for
from benchmarks.report import Json
from benchmarks.server import SCHEMA, StartGate, settle
from pgq_supervisor import db

FAIR_BACKLOG = 200_000
FAIR_PROCS = 2
SMALL_TENANTS = tuple("BCDEFGHIJK")
EMPTY_SECONDS = 10.0  # the empty queue's stream: 100 samples
CLAIM_LIMIT = 200
CLAIMS = 40
CLAIM_TENANTS = (10, 1000)


@dataclass(frozen=True, slots=True)
class Stream:
    latencies_ms: list[float]

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 99)

    def details(self) -> dict[str, Json]:
        return {
            "samples": len(self.latencies_ms),
            "p50_ms": round(percentile(self.latencies_ms, 50), 3),
            "p99_ms": round(self.p99, 3),
        }


@dataclass(frozen=True, slots=True)
class FairDrain:
    rate: float  # the big tenant's jobs/s
    stream: Stream
    passed_by: list[int]  # per small-tenant job: claims of A's jobs begun after it, before it

    @property
    def passed_by_p99(self) -> float:
        return percentile([float(n) for n in self.passed_by], 99)

    def details(self) -> dict[str, Json]:
        return {
            "backlog": FAIR_BACKLOG,
            "jobs_per_s": round(self.rate, 1),
            **self.stream.details(),
            "claims_passing_p99": self.passed_by_p99,
            "claims_passing_max": max(self.passed_by, default=0),
        }


def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE pgq.job, pgq.job_bundle, pgq.job_dependency, pgq.workflow_step,"
            " pgq.workflow_signal, pgq.fair_cursor, pgq.tenant_weight"
        )


def fill(dsn: str, tenant: str | None) -> None:
    reset(dsn)
    with psycopg.connect(dsn) as conn:
        for i in range(0, FAIR_BACKLOG, BULK_CHUNK):
            size = min(BULK_CHUNK, FAIR_BACKLOG - i)
            pgq.enqueue_many(conn, [pgq.NewJob(WAKE, {}, tenant=tenant)] * size, schema=SCHEMA)
            conn.commit()
    settle(dsn, ["pgq.job"])


def _produce(dsn: str, stop: threading.Event, committed: dict[str, float]) -> None:
    """One job a second per small tenant, one every 0.1 s in turn, until `stop`."""
    with psycopg.connect(dsn) as conn:
        i = 0
        next_at = time.monotonic()
        while not stop.is_set():
            tenant = SMALL_TENANTS[i % len(SMALL_TENANTS)]
            job_id = pgq.enqueue(conn, WAKE, {}, tenant=tenant, schema=SCHEMA)
            conn.commit()
            committed[str(job_id)] = time.time()
            i += 1
            next_at += 1.0 / len(SMALL_TENANTS)
            stop.wait(max(0.0, next_at - time.monotonic()))


def _stream(dsn: str, committed: dict[str, float]) -> Stream:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id::text, (result->>'t')::float8 FROM pgq.job"
            " WHERE id = ANY(%s::uuid[]) AND state = 'succeeded'",
            (list(committed),),
        ).fetchall()
    if len(rows) != len(committed):
        raise BenchError(f"{len(committed)} small-tenant jobs enqueued, {len(rows)} succeeded")
    return Stream([(float(t) - committed[i]) * 1000 for i, t in rows])


def _left(conn: psycopg.Connection[tuple[object, ...]], tenant: str | None) -> bool:
    where = "tenant = 'A'" if tenant else "tenant IS NULL"
    row = conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM pgq.job WHERE state IN ('pending', 'running') AND {where})"
    ).fetchone()
    return row is None or bool(row[0])


def run_empty(dsn: str, supervisor_args: Sequence[str] = ()) -> Stream:
    """The small tenants' stream into an empty queue."""
    reset(dsn)
    committed: dict[str, float] = {}
    stop = threading.Event()
    with running(Supervisor(dsn, FAIR_PROCS, supervisor_args)) as sup:
        sup.wait_idle()
        producer = threading.Thread(target=_produce, args=(dsn, stop, committed))
        producer.start()
        time.sleep(EMPTY_SECONDS)  # the stream's length: a rate, not a wait for a condition
        stop.set()
        producer.join()
        with psycopg.connect(dsn, autocommit=True) as watch:
            wait_for("the stream's jobs to finish", lambda: not _any_unfinished(watch), 60.0)
        code = sup.stop()
        if code != 0:
            raise BenchError(f"supervisor exited {code} on SIGTERM: {sup.log_tail(3)}")
    return _stream(dsn, committed)


def _any_unfinished(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pgq.job WHERE state IN ('pending', 'running'))"
    ).fetchone()
    return row is None or bool(row[0])


def run_fair(dsn: str, supervisor_args: Sequence[str] = ()) -> FairDrain:
    """A's backlog drained while the small tenants stream in."""
    fill(dsn, "A")
    gate = StartGate(dsn, "pgq.job", "pgq-worker")
    committed: dict[str, float] = {}
    stop = threading.Event()
    try:
        with (
            running(Supervisor(dsn, FAIR_PROCS, supervisor_args)) as sup,
            psycopg.connect(dsn, autocommit=True) as watch,
        ):

            def all_waiting() -> bool:
                sup.check_alive()
                return gate.waiting() >= FAIR_PROCS

            wait_for(f"{FAIR_PROCS} children at the start gate", all_waiting, GATE_TIMEOUT, 0.02)
            opened_at = gate.open()
            producer = threading.Thread(target=_produce, args=(dsn, stop, committed))
            producer.start()
            try:

                def drained() -> bool:
                    sup.check_alive()
                    return not _left(watch, "A")

                wait_for("A's backlog to drain", drained, max(120.0, FAIR_BACKLOG / 200), 0.05)
            finally:
                stop.set()
                producer.join()
            wait_for("the stream's jobs to finish", lambda: not _any_unfinished(watch), 60.0)
            code = sup.stop()
            if code != 0:
                raise BenchError(f"supervisor exited {code} on SIGTERM: {sup.log_tail(3)}")
    finally:
        gate.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'succeeded'),"
            " extract(epoch FROM max(stopped_at))::float8 FROM pgq.job WHERE tenant = 'A'"
        ).fetchone()
    if row is None or row[0] != FAIR_BACKLOG or row[1] is None:
        raise BenchError(f"{FAIR_BACKLOG} of A's jobs enqueued, {row} succeeded")
    return FairDrain(
        FAIR_BACKLOG / (float(row[1]) - opened_at),
        _stream(dsn, committed),
        _passed_by(dsn, committed),
    )


def _passed_by(dsn: str, committed: dict[str, float]) -> list[int]:
    """Per small-tenant job: the claims of A's jobs (one `started_at` per claim: its
    transaction's start) that began after its enqueue had committed (this machine's clock, as
    the stream's) and before its own claim."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "WITH claims AS (SELECT DISTINCT started_at FROM pgq.job WHERE tenant = 'A')"
            " SELECT (SELECT count(*) FROM claims c"
            "         WHERE c.started_at > to_timestamp(k.at) AND c.started_at < s.started_at)"
            " FROM unnest(%s::uuid[], %s::float8[]) AS k(id, at)"
            " JOIN pgq.job s ON s.id = k.id",
            (list(committed), list(committed.values())),
        ).fetchall()
    return [int(r[0]) for r in rows]


def run_unfair(dsn: str, supervisor_args: Sequence[str] = ()) -> float:
    """The same backlog without a tenant: the plain claim's drain, jobs/s."""
    drained = run_drain(
        dsn,
        FAIR_PROCS,
        FAIR_BACKLOG,
        prefill=lambda: fill(dsn, None),
        supervisor_args=supervisor_args,
    )
    return drained.rate


def claim_cost(dsn: str, tenants: int) -> float:
    """Mean ms of a claim of CLAIM_LIMIT jobs (the claim statement, committed) with the
    backlog spread over `tenants` tenants."""
    reset(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgq.job (type, payload, tenant)"
            " SELECT %s, '{}', 'tenant-' || (g %% %s) FROM generate_series(1, %s) g",
            (WAKE, tenants, FAIR_BACKLOG),
        )
    settle(dsn, ["pgq.job"])
    took = []
    with psycopg.connect(dsn) as conn:
        for _ in range(CLAIMS):
            began = time.perf_counter()
            jobs = db.claim(
                conn, SCHEMA, worker_id="bench", types=[WAKE], max_retry_counts=[0],
                limit=CLAIM_LIMIT,
            )  # fmt: skip
            conn.commit()
            took.append((time.perf_counter() - began) * 1000)
            if len(jobs) != CLAIM_LIMIT:
                raise BenchError(f"a claim of {CLAIM_LIMIT} took {len(jobs)} jobs")
    took.sort()
    return sum(took[: len(took) * 9 // 10]) / (len(took) * 9 // 10)  # less the slowest tenth
