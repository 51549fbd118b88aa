"""Partitions of the job table (schema/0029), where it has them (opt-in: `partition`; a round
does nothing on the one table): made ahead of the enqueue times that need them, and dropped
whole once every job in them is finished and past its retention window.

One round (every PARTITIONS_EVERY seconds, on the control connection): the partitions of the
next `ahead` intervals are made; then each partition old enough to drop (its ids end before
`retain_succeeded` ago), oldest first, goes through retention's two transactions: `clean`
deletes, as the pruner would, its finished jobs whose leaving has consequences (bundles,
dependencies, ordered keys, workflow rows); `expire` takes the table lock for at most
`lock_timeout`, checks that no job in it is still to run, carries its finished jobs still
within their window into the default partition and drops it. A partition that a job still
to run holds back is passed over (the pruner deletes its finished rows once it is older than
the drop zone) and the next one is looked at. Every supervisor runs rounds; an advisory lock
lets one at a time do the work, the others find it busy and come back at their next round.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pgq_supervisor.db import Conn
from pgq_supervisor.db import partitions as db_partitions
from pgq_supervisor.display import plural
from pgq_supervisor.settings import Settings

log = logging.getLogger(__name__)

PARTITIONS_EVERY = 60.0  # seconds between rounds
MAX_STEPS = 16  # partitions looked at per round
# a partition past its time may wait this long for a round to drop it before the pruner
# deletes its jobs row by row (a round a minute; a busy one tries again)
GRACE = 600.0


def drop_zone(retain_succeeded: float | None, interval: float) -> float | None:
    """Seconds of enqueue time whose finished jobs leave by their partition's drop, not by the
    pruner's DELETE: a partition becomes droppable `retain_succeeded` after its range ends,
    and a job is at most `interval` older than that end; GRACE for the round. Past the zone,
    a partition still there is held back by a job still to run: its finished jobs go row by
    row. None: nothing is dropped, the pruner deletes every finished job."""
    return None if retain_succeeded is None else retain_succeeded + interval + GRACE


@dataclass(frozen=True, slots=True)
class PartitionRound:
    made: tuple[str, ...] = ()
    expired: db_partitions.Expired = field(default_factory=db_partitions.Expired)

    @property
    def dropped(self) -> tuple[str, ...]:
        return self.expired.dropped

    @property
    def carried(self) -> int:
        return self.expired.carried

    @property
    def held(self) -> dict[str, str]:
        return self.expired.held


class Partitions:
    """`interval`: seconds of enqueue time one partition spans; `retain_*`: the pruner's
    windows (None keeps that kind; with `retain_succeeded` None nothing is dropped)."""

    def __init__(
        self,
        schema: str,
        interval: float,
        retain_succeeded: float | None,
        retain_failed: float | None,
        *,
        max_carry: int = db_partitions.MAX_CARRY,
        lock_timeout: float = db_partitions.LOCK_TIMEOUT,
    ) -> None:
        if not interval >= 60:
            raise ValueError(f"partition_interval must be >= 60 seconds, got {interval}")
        self.schema = schema
        self.interval = interval
        self.ahead = db_partitions.ahead_of(interval)
        self.retain_succeeded = retain_succeeded
        self.retain_failed = retain_failed
        self.max_carry = max_carry
        self.lock_timeout = lock_timeout

    @classmethod
    def from_settings(cls, settings: Settings) -> Partitions:
        return cls(
            settings.db_schema,
            settings.partition_interval,
            settings.retain_succeeded,
            settings.retain_failed,
        )

    def run_once(self, conn: Conn) -> PartitionRound:
        """One round on an autocommit connection. Raises DatabaseError."""
        made = db_partitions.ensure(conn, self.schema, interval=self.interval, ahead=self.ahead)
        expired = db_partitions.expire_old(
            conn,
            self.schema,
            succeeded=self.retain_succeeded,
            failed=self.retain_failed,
            max_carry=self.max_carry,
            lock_timeout=self.lock_timeout,
            max_steps=MAX_STEPS,
        )
        result = PartitionRound(tuple(made or ()), expired)
        if result.made:
            log.info("made job partitions %s", ", ".join(result.made))
        if expired.dropped:
            log.info(
                "dropped job partitions %s: about %s gone, %s still within their window carried",
                ", ".join(expired.dropped),
                plural(expired.jobs, "finished job"),
                plural(expired.carried, "job"),
            )
        return result
