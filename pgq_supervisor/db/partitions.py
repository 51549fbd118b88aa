"""job's partitions (schema/0029): ranges of ids, hence of enqueue times, made ahead and
dropped whole once every job in them is finished and past its window (docs/storage.md)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import TypedDict

from psycopg.rows import scalar_row

from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.rows import NamedRow


class PartitionEnsureParams(TypedDict):
    interval: float
    ahead: int


class PartitionCleanParams(TypedDict):
    succeeded: float | None
    failed: float | None
    after: uuid.UUID | None


class PartitionExpireParams(PartitionCleanParams):
    max_carry: int
    lock_timeout: float


PARTITION_PARAMS: dict[str, type] = {
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


STEP = NamedRow(PartitionStep)


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
) -> PartitionStep | None:
    """Retention's first transaction for the oldest partition past `after` that is old enough
    to drop; None when there is none."""
    params: PartitionCleanParams = {"succeeded": succeeded, "failed": failed, "after": after}
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
