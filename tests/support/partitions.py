"""Jobs in the job table's oldest partition (schema/0029), for the partition tests.

`partition` turns a test's database into the partitioned one; its `job_legacy` partition then
holds every id made before that. The jobs made here get ids of three days ago (the id's time
is faked, as a client with a slow clock would make them), so they land in it, and a partition
that old is the one retention looks at.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.db import params as db_params
from pgq_supervisor.db import partitions as db_partitions
from pgq_supervisor.jobs import AttemptKind, BundleId, JobId
from tests.support.db import claim_one

# kinds of jobs that are still to run, each held in a partition by a probe of its own
STILL_TO_RUN = ("ready", "delayed", "tenant", "running", "waiting", "ordered", "retrying")


class PastClock:
    """`time` for db/params.py: ids made three days ago, as by a client whose clock is slow."""

    def __init__(self) -> None:
        self._at = int((datetime.now(UTC) - timedelta(days=3)).timestamp() * 1e9)

    def time_ns(self) -> int:
        self._at += 1_000_000
        return self._at


@contextmanager
def made_days_ago() -> Iterator[None]:
    """Within: the jobs (and bundles) enqueued get ids of three days ago."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(db_params, "time", PastClock())
        yield


def partition(conn: Conn) -> bool:
    """The database's job table partitioned (as the `partition` command does); False when it
    was already."""
    return db_partitions.convert(conn, "pgq", interval=86400.0, lock_timeout=10.0)


def partition_of(conn: Conn, job_id: JobId) -> str:
    row = conn.execute("SELECT tableoid::regclass::text FROM pgq.job WHERE id = %s", (job_id,))
    found = row.fetchone()
    assert found is not None, f"job {job_id} is gone"
    return str(found[0])


def partitions(conn: Conn) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT name FROM pgq.job_partitions()")}


def still_to_run(conn: Conn, kind: str, first: JobId) -> tuple[JobId, JobId]:
    """A job of `kind` that is still to run, made three days ago (`first`: a job made now, for
    it to wait on), and a finished one beside it."""
    done = pgq.enqueue(conn, "t", {})  # a finished job beside it
    db.succeed(conn, "pgq", claim_one(conn, "t").lease, [(done, None)])
    if kind == "ready":
        held = pgq.enqueue(conn, "h", {})
    elif kind == "delayed":
        held = pgq.enqueue(conn, "h", {}, start_at=datetime.now(UTC) + timedelta(days=30))
    elif kind == "tenant":
        held = pgq.enqueue(conn, "h", {}, tenant="acme")
    elif kind == "running":
        held = pgq.enqueue(conn, "h", {})
        claim_one(conn, "h")
    elif kind == "waiting":
        held = pgq.enqueue(conn, "h", {}, depends_on=[first])
    elif kind == "ordered":
        held = pgq.enqueue(conn, "h", {}, ordered_key="k")
    else:  # a retry of a job made three days ago: pending again in its old partition
        held = pgq.enqueue(conn, "h", {}, max_retry_count=2)
        job = claim_one(conn, "h", max_retry_count=2)
        db.end_attempt(conn, "pgq", [held], error="again", kind=AttemptKind.ERROR, lease=job.lease)
    return held, done


def old_bundle(conn: Conn, types: list[str]) -> BundleId:
    """A bundle of jobs of `types` as enqueue_bundle makes it, with ids of three days ago
    (enqueue_bundle's ids are the database's: its clock cannot be faked)."""
    clock = PastClock()
    bundle = BundleId(uuid.UUID(int=db_params.time_ordered(uuid.uuid4().int, clock.time_ns())))
    conn.execute(
        "INSERT INTO pgq.job_bundle (id, type, num_jobs) VALUES (%s, 'b', %s)",
        (bundle, len(types)),
    )
    for t in types:
        conn.execute(
            "INSERT INTO pgq.job (id, bundle_id, type, payload) VALUES (%s, %s, %s, '{}')",
            (uuid.UUID(int=db_params.time_ordered(uuid.uuid4().int, clock.time_ns())), bundle, t),
        )
    return bundle
