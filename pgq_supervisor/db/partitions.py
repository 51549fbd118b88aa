"""job's partitions (schema/0029): ranges of ids, hence of enqueue times, made ahead and
dropped whole once every job in them is finished and past its window (docs/storage.md)."""

from __future__ import annotations

import dataclasses
import math
import uuid
from typing import TypedDict

from psycopg.rows import scalar_row

from pgq_supervisor.db.connection import Conn, atomic, cursor, statement, wrapped
from pgq_supervisor.db.rows import NamedRow

AHEAD = 3 * 3600.0  # partitions exist this far ahead of now
MAX_CARRY = 10_000  # a partition with more jobs still within their window waits for them
LOCK_TIMEOUT = 0.5  # seconds a drop may wait for the table lock (claims queue behind it)


class PartitionEnsureParams(TypedDict):
    interval: float
    ahead: int


class LockTimeoutParams(TypedDict):
    lock_timeout: int  # milliseconds


class PartitionParams(TypedDict):
    succeeded: float | None
    failed: float | None
    after: uuid.UUID | None


class PartitionCleanParams(PartitionParams):
    count: bool


class PartitionExpireParams(PartitionParams):
    max_carry: int
    lock_timeout: float


PARTITION_PARAMS: dict[str, type] = {
    "partition_convert": PartitionEnsureParams,
    "partition_lock_timeout": LockTimeoutParams,
    "partition_ensure": PartitionEnsureParams,
    "partition_clean": PartitionCleanParams,
    "partition_expire": PartitionExpireParams,
}


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionStep:
    """What a retention transaction did to one partition: `outcome` is 'cleaned' (its jobs
    that leave with consequences were deleted), 'dropped' (gone, `carried` jobs moved into the
    default partition first), 'unfinished', 'kept' or 'busy' (schema/0029 says when). `hi`:
    its upper bound, after which the next partition is looked at."""

    partition: str
    outcome: str
    hi: uuid.UUID
    carried: int = 0
    jobs: int = 0  # after `clean`: the jobs in it then (`carried` of them stay, the rest go)


STEP = NamedRow(PartitionStep)


def convert(conn: Conn, schema: str, *, interval: float, lock_timeout: float) -> bool:
    """Partition the job table (schema/0029's job_partition_convert) in one transaction,
    waiting at most `lock_timeout` seconds for its lock; False when it is partitioned already.
    Raises DatabaseError ("lock timeout" when the lock was not had)."""
    params: PartitionEnsureParams = {"interval": interval, "ahead": ahead_of(interval)}
    waits: LockTimeoutParams = {"lock_timeout": int(lock_timeout * 1000)}
    with wrapped(), atomic(conn):
        conn.execute(statement("partition_lock_timeout", schema), waits)
        with cursor(conn, scalar_row) as cur:
            done: bool | None = cur.execute(
                statement("partition_convert", schema), params
            ).fetchone()
    return bool(done)


def ahead_of(interval: float) -> int:
    """How many intervals ahead the partitions are made: at least AHEAD seconds, and one."""
    return max(1, math.ceil(AHEAD / interval))


def ensure(conn: Conn, schema: str, *, interval: float, ahead: int) -> list[str] | None:
    """Make the partitions of the intervals up to `ahead` intervals from now; their names, or
    None when another session is making them."""
    params: PartitionEnsureParams = {"interval": interval, "ahead": ahead}
    with wrapped(), cursor(conn, scalar_row) as cur:
        made: list[str] | None = cur.execute(
            statement("partition_ensure", schema), params
        ).fetchone()
    return made


def clean(
    conn: Conn,
    schema: str,
    *,
    succeeded: float | None,
    failed: float | None,
    after: uuid.UUID | None,
    count: bool = False,
) -> PartitionStep | None:
    """Retention's first transaction for the oldest partition past `after` that is old enough
    to drop; None when there is none. `count`: its jobs counted (a scan), not estimated."""
    params: PartitionCleanParams = {
        "succeeded": succeeded,
        "failed": failed,
        "after": after,
        "count": count,
    }
    with wrapped(), cursor(conn, STEP) as cur:
        return cur.execute(statement("partition_clean", schema), params).fetchone()


def expire(
    conn: Conn,
    schema: str,
    *,
    succeeded: float | None,
    failed: float | None,
    after: uuid.UUID | None,
    max_carry: int,
    lock_timeout: float,
) -> PartitionStep | None:
    """Retention's second transaction: the drop of the partition `clean` named."""
    params: PartitionExpireParams = {
        "succeeded": succeeded,
        "failed": failed,
        "after": after,
        "max_carry": max_carry,
        "lock_timeout": lock_timeout,
    }
    with wrapped(), cursor(conn, STEP) as cur:
        return cur.execute(statement("partition_expire", schema), params).fetchone()


@dataclasses.dataclass(frozen=True, slots=True)
class Expired:
    """What `expire_old` did: the partitions dropped, the jobs that left with them, the
    finished jobs still within their window carried into the default partition, and the
    partitions looked at that stay, with why (schema/0029's outcomes)."""

    dropped: tuple[str, ...] = ()
    jobs: int = 0
    carried: int = 0
    held: dict[str, str] = dataclasses.field(default_factory=dict)


def expire_old(
    conn: Conn,
    schema: str,
    *,
    succeeded: float | None,
    failed: float | None,
    max_carry: int = MAX_CARRY,
    lock_timeout: float = LOCK_TIMEOUT,
    max_steps: int = 16,
    count: bool = False,
) -> Expired:
    """Retention by partition, on an autocommit connection: each partition old enough to drop,
    oldest first (at most `max_steps`), through `clean` then `expire`, each its own
    transaction; one another session holds, or that waited `lock_timeout` for the table lock,
    ends the round (`busy`: the next round tries again). `jobs`: counted with `count` (a scan
    of each partition before its drop), else the planner's estimates."""
    dropped: list[str] = []
    held: dict[str, str] = {}
    jobs = carried = 0
    after: uuid.UUID | None = None
    for _ in range(max_steps):
        step = clean(conn, schema, succeeded=succeeded, failed=failed, after=after, count=count)
        if step is not None and step.outcome == "cleaned":
            counted = step.jobs
            step = expire(
                conn,
                schema,
                succeeded=succeeded,
                failed=failed,
                after=after,
                max_carry=max_carry,
                lock_timeout=lock_timeout,
            )
            if step is not None and step.outcome == "dropped":
                jobs += max(counted - step.carried, 0)
        if step is None:
            break
        if step.outcome == "dropped":
            dropped.append(step.partition)
            carried += step.carried
        else:
            held[step.partition] = step.outcome
            if step.outcome == "busy":
                break
        after = step.hi
    return Expired(tuple(dropped), jobs, carried, held)
