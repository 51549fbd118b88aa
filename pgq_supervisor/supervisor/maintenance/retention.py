"""Retention: deletes finished jobs once they are older than the configured windows.

`retain_succeeded` covers succeeded jobs; `retain_failed` covers failed and cancelled ones (the
jobs people come back to inspect). Unset keeps them forever. Age is `stopped_at` by the
database clock. Deleting keeps bundle counters true (a trigger does), and every supervisor may
prune at once: rows another pruner holds are skipped.

One round deletes at most `max_rows` per window, in batches of `batch` rows (one short
transaction each), so a round never stalls its caller for long; `PruneResult.more` says the
round stopped at that bound and another round should follow soon.

With a `zone` (the supervisor's: partitions.drop_zone), the finished jobs made in the last
`zone` seconds are left to their partition, which leaves whole (partitions.py); the pruner
deletes the rest: the default partition's jobs and those a partition held back by a job still
to run kept past the zone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pgq_supervisor import db
from pgq_supervisor.jobs import JobState
from pgq_supervisor.settings import Settings
from pgq_supervisor.supervisor.maintenance.partitions import drop_zone

log = logging.getLogger(__name__)

# Seconds between rounds when the last one found everything done.
PRUNE_EVERY = 60.0


@dataclass(frozen=True, slots=True)
class PruneResult:
    succeeded: int = 0
    failed: int = 0  # failed and cancelled jobs (they share retain_failed)
    more: bool = False

    @property
    def total(self) -> int:
        return self.succeeded + self.failed


class Pruner:
    """Deletes succeeded jobs older than `retain_succeeded` seconds and failed or cancelled
    jobs older than `retain_failed` seconds; None keeps that kind. ValueError if a window is
    not > 0, or the bounds are not >= 1."""

    def __init__(
        self,
        schema: str,
        retain_succeeded: float | None,
        retain_failed: float | None,
        *,
        batch: int = 5000,
        max_rows: int = 20_000,
        zone: float | None = None,
    ) -> None:
        for name, window in (
            ("retain_succeeded", retain_succeeded),
            ("retain_failed", retain_failed),
        ):
            if window is not None and not window > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {window}")
        if batch < 1 or max_rows < 1:
            raise ValueError(f"batch and max_rows must be >= 1, got {batch}, {max_rows}")
        self.schema = schema
        self.retain_succeeded = retain_succeeded
        self.retain_failed = retain_failed
        self.batch = batch
        self.max_rows = max_rows
        self.zone = zone

    @classmethod
    def from_settings(cls, settings: Settings) -> Pruner | None:
        """The pruner the settings ask for, or None when nothing is to be pruned."""
        if settings.retain_succeeded is None and settings.retain_failed is None:
            return None
        return cls(
            settings.db_schema,
            settings.retain_succeeded,
            settings.retain_failed,
            zone=drop_zone(settings.retain_succeeded, settings.partition_interval),
        )

    def run_once(self, conn: db.Conn) -> PruneResult:
        """One round on an autocommit connection. Raises DatabaseError if the database fails
        (the batches deleted before that stay deleted)."""
        succeeded = failed = 0
        if self.retain_succeeded is not None:
            succeeded = self._delete(conn, self.retain_succeeded, [JobState.SUCCEEDED])
        if self.retain_failed is not None:
            failed = self._delete(conn, self.retain_failed, [JobState.FAILED, JobState.CANCELLED])
        result = PruneResult(
            succeeded=succeeded,
            failed=failed,
            more=succeeded >= self.max_rows or failed >= self.max_rows,
        )
        if result.total:
            log.info(
                "pruned %d succeeded and %d failed or cancelled jobs%s",
                succeeded,
                failed,
                " (more to go)" if result.more else "",
            )
        return result

    def _delete(self, conn: db.Conn, older_than: float, states: list[JobState]) -> int:
        return db.delete_finished(
            conn,
            self.schema,
            older_than,
            states,
            batch=self.batch,
            max_rows=self.max_rows,
            zone=self.zone,
        )
