"""What each step of a job's life writes (issue 35, docs/storage.md): WAL bytes and row versions.

    python -m benchmarks.lifecycle_wal                 # 1,000 jobs a step
    python -m benchmarks.lifecycle_wal --jobs 5000 --dsn postgresql://...

The server is found as the harness finds it (--dsn, else 127.0.0.1:5432, else an embedded
one); the steps run in a scratch database, dropped at the end.

Each step runs the statements a worker or a caller runs (db.claim, db.succeed, db.end_attempt,
pgq.cancel_job, ...) on `--jobs` jobs, in batches of 100 where a worker batches (claims and
successes), one job per call where callers act on one job (cancel, reset, snooze). Before each
step: a CHECKPOINT, so the figure includes the full-page images a step's first touch of a page
writes after one (as it does in production once per checkpoint interval), then the WAL insert
position; after it, the position again. Row versions are read from pg_stat_xact_user_tables
inside the step's transaction, per relation: inserts, updates (HOT among them) and deletes.
Autovacuum is off for the queue's tables during the run: what vacuum writes later to reclaim
the dead versions is not in the figures (docs/storage.md counts the versions instead).
WAL bytes do not move with the machine's load, but the full-page images do move with
checkpoints: one that another session asks for (or the server's own timer) in the middle of a
step makes its next touch of every page write an image again. The bytes without images are
the same from run to run; the images are shown apart.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
from psycopg.rows import TupleRow

import pgq_supervisor as pgq
from benchmarks.server import Scratch, find_server
from benchmarks.walcount import flush_lsn, insert_lsn, keep_wal, wal_bytes
from pgq_supervisor import db
from pgq_supervisor.jobs import AttemptKind, Job, JobId

Conn = psycopg.Connection[TupleRow]
TYPE = "bench_noop"
BATCH = 100
S = "pgq"


@dataclass
class Step:
    name: str
    jobs: int
    wal: int
    fpi: int  # of `wal`, the full-page images (-1: not known)
    versions: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)

    def row(self) -> str:
        per = ", ".join(
            f"{rel} +{i / self.jobs:.2f} ~{u / self.jobs:.2f}"
            + (f" (HOT {h / self.jobs:.2f})" if h else "")
            + (f" -{d / self.jobs:.2f}" if d else "")
            for rel, (i, u, h, d) in sorted(self.versions.items())
        )
        fpi = "?" if self.fpi < 0 else f"{self.fpi / self.jobs:,.0f}"
        rest = "?" if self.fpi < 0 else f"{(self.wal - self.fpi) / self.jobs:,.0f}"
        return f"| {self.name} | {self.wal / self.jobs:,.0f} | {rest} | {fpi} | {per} |"


def _xact_versions(conn: Conn) -> dict[str, tuple[int, int, int, int]]:
    # the job table's partitions (schema/0029) count as the job table
    rows = conn.execute(
        "SELECT CASE WHEN c.relispartition THEN 'job' ELSE s.relname END,"
        " sum(s.n_tup_ins), sum(s.n_tup_upd), sum(s.n_tup_hot_upd), sum(s.n_tup_del)"
        " FROM pg_stat_xact_user_tables s JOIN pg_class c ON c.oid = s.relid"
        " WHERE s.schemaname = %s AND s.n_tup_ins + s.n_tup_upd + s.n_tup_del > 0 GROUP BY 1",
        (S,),
    ).fetchall()
    return {str(r[0]): (int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows}


def measure(conn: Conn, name: str, jobs: int, act: Callable[[], object]) -> Step:
    """Run `act` in one transaction of `conn` (autocommit off) between two WAL positions."""
    conn.execute("CHECKPOINT")
    conn.commit()
    start = insert_lsn(conn)
    # the counters hold what no flush has taken yet, of earlier transactions too; none is taken
    # inside a transaction, so the difference across `act` is its own
    before = _xact_versions(conn)
    act()
    after = _xact_versions(conn)
    conn.commit()
    zero = (0, 0, 0, 0)
    versions = {
        rel: diff
        for rel, counts in after.items()
        if any(diff := tuple(a - b for a, b in zip(counts, before.get(rel, zero), strict=True)))
    }
    end = flush_lsn(conn)  # past the step's commit, which waited for its flush
    wal, fpi = wal_bytes(conn, start, end)
    step = Step(name, jobs, wal, fpi, versions)  # type: ignore[arg-type]
    conn.commit()
    print(step.row(), file=sys.stderr)
    return step


def _enqueue(conn: Conn, n: int) -> list[JobId]:
    ids: list[JobId] = []
    for k in range(0, n, BATCH):
        ids += pgq.enqueue_many(
            conn, [pgq.NewJob(TYPE, {"n": k + i}) for i in range(min(BATCH, n - k))]
        )
    return ids


def _each(call: Callable[[Conn, JobId], object], conn: Conn, ids: list[JobId]) -> None:
    for i in ids:
        call(conn, i)


def _claim_all(conn: Conn, n: int) -> list[list[Job]]:
    batches: list[list[Job]] = []
    while sum(len(b) for b in batches) < n:
        got = db.claim(
            conn, S, worker_id="walprobe", types=[TYPE], max_retry_counts=[3], limit=BATCH
        )
        if not got:
            break
        batches.append(got)
    return batches


def _succeed_all(conn: Conn, batches: list[list[Job]]) -> None:
    for b in batches:
        db.succeed(conn, S, b[0].lease, [(j.id, None) for j in b])


def run(dsn: str, n: int) -> list[Step]:
    steps: list[Step] = []
    with psycopg.connect(dsn) as conn:
        # the migration's catalog changes, vacuumed now rather than by autovacuum mid-step
        conn.autocommit = True
        conn.execute("VACUUM")
        # and no autovacuum during the steps: the job table's aggressive settings start one
        # after every thousand changes, whose WAL would land in whichever step it ran beside
        for (table,) in conn.execute(  # the tables that hold rows: a partitioned one has none
            "SELECT format('%%I.%%I', s.schemaname, s.relname) FROM pg_stat_user_tables s"
            " JOIN pg_class c ON c.oid = s.relid WHERE s.schemaname = %s AND c.relkind = 'r'",
            (S,),
        ).fetchall():
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
        # keeps the WAL of the run on disk until it has been read: a checkpoint another
        # session asks for would otherwise recycle a segment before pg_walinspect reads it
        keep_wal(conn, "lifecycle_wal")
        conn.autocommit = False
        # the plain life: enqueue, claim, heartbeat, success
        steps.append(
            measure(conn, "enqueue (enqueue_many, 100 a call)", n, lambda: _enqueue(conn, n))
        )
        held: list[list[Job]] = []
        steps.append(
            measure(conn, "claim (100 a claim)", n, lambda: held.extend(_claim_all(conn, n)))
        )
        steps.append(
            measure(
                conn,
                "heartbeat (one beat of each claim)",
                n,
                lambda: [db.heartbeat(conn, S, [j.id for j in b], b[0].lease) for b in held],
            )
        )
        steps.append(
            measure(conn, "success (100 a statement)", n, lambda: _succeed_all(conn, held))
        )

        # a failed attempt with retries left, then one without
        _enqueue(conn, n)
        conn.commit()

        def end(allow_retry: bool) -> None:
            for b in _claim_all(conn, n):
                db.end_attempt(
                    conn,
                    S,
                    [j.id for j in b],
                    error="boom",
                    kind=AttemptKind.ERROR,
                    lease=b[0].lease,
                    allow_retry=allow_retry,
                )

        steps.append(
            measure(conn, "claim + retry (end_attempt, back to pending)", n, lambda: end(True))
        )
        steps.append(measure(conn, "claim + failure (end_attempt, failed)", n, lambda: end(False)))
        failed = [r[0] for r in conn.execute("SELECT id FROM pgq.job WHERE state = 'failed'")]
        conn.commit()
        steps.append(
            measure(
                conn,
                "reset (reset_job, one a call)",
                len(failed),
                lambda: _each(pgq.reset_job, conn, failed),
            )
        )
        steps.append(
            measure(
                conn,
                "cancel pending (cancel_job, one a call)",
                len(failed),
                lambda: _each(pgq.cancel_job, conn, failed),
            )
        )

        # snooze: claimed, then snoozed one by one
        _enqueue(conn, n)
        conn.commit()

        def snooze() -> None:
            for b in _claim_all(conn, n):
                for j in b:
                    db.snooze(conn, S, j.id, lease=j.lease, delay=60, max_snoozes=10, error="later")

        steps.append(measure(conn, "claim + snooze (one a call)", n, snooze))
        conn.execute("DELETE FROM pgq.job")
        conn.commit()

        # a dependency released: parents succeed, each releasing one waiting child
        parents = _enqueue(conn, n)
        for k in range(0, n, BATCH):
            pgq.enqueue_many(
                conn,
                [pgq.NewJob("bench_child", {}, depends_on=[p]) for p in parents[k : k + BATCH]],
            )
        conn.commit()
        claimed = _claim_all(conn, n)
        conn.commit()
        steps.append(
            measure(conn, "success releasing a dependent", n, lambda: _succeed_all(conn, claimed))
        )
        conn.execute("DELETE FROM pgq.job")
        conn.commit()

        # a bundle of n jobs completed: counted once per statement (schema/0024)
        pgq.enqueue_bundle(
            conn, "bench_bundle", [pgq.NewJob(TYPE, {}) for _ in range(n)], on_complete="bench_done"
        )
        conn.commit()
        claimed = _claim_all(conn, n)
        conn.commit()
        steps.append(
            measure(conn, "success of bundled jobs", n, lambda: _succeed_all(conn, claimed))
        )

        # unique keys: held from the enqueue to the end (job_unique since schema/0027)
        def enqueue_unique() -> None:
            for k in range(0, n, BATCH):
                batch = range(k, min(k + BATCH, n))
                pgq.enqueue_many(conn, [pgq.NewJob(TYPE, {}, unique_key=f"u{i}") for i in batch])

        steps.append(measure(conn, "enqueue with a unique_key (100 a call)", n, enqueue_unique))
        held = []
        steps.append(
            measure(conn, "claim of unique jobs", n, lambda: held.extend(_claim_all(conn, n)))
        )
        steps.append(measure(conn, "success of unique jobs", n, lambda: _succeed_all(conn, held)))

        # retention: every finished job, by the public call
        finished = conn.execute(
            "SELECT count(*) FROM pgq.job WHERE stopped_at IS NOT NULL"
        ).fetchone()
        assert finished is not None
        steps.append(
            measure(
                conn,
                "retention (delete_finished)",
                int(finished[0]),
                lambda: pgq.delete_finished(conn, older_than=0),
            )
        )
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lifecycle_wal", description=__doc__)
    parser.add_argument("--dsn", help="a database to CREATE DATABASE from (default: found)")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs a step (default 1000)")
    args = parser.parse_args(argv)
    server = find_server(args.dsn)
    scratch = Scratch(server)
    try:
        dsn = scratch.create("lifecycle", migrate=True)
        version = server.info()["server_version"]
        steps = run(dsn, args.jobs)
    finally:
        scratch.close()
    print(f"WAL per job of each lifecycle step, {args.jobs} jobs, PostgreSQL {version}")
    print(
        "| step | WAL B/job | without full-page images | full-page images"
        " | row versions per job: +insert ~update (HOT) -delete |"
    )
    print("|---|---:|---:|---:|---|")
    for step in steps:
        print(step.row())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
