"""The vacuum gauges (pgq_vacuum_*, pgq_job_dead_tuples, pgq_job_table_bytes): what `doctor`
reads, refreshed on a timer when metrics are served, so an alert can fire on
pgq_vacuum_findings > 0 or on the horizon's age before claims slow down."""

from __future__ import annotations

from dataclasses import dataclass

from pgq_supervisor import db
from pgq_supervisor.db.health import read_health
from pgq_supervisor.supervisor.metrics import Metrics
from pgq_supervisor.vacuum import diagnose, oldest_transaction

# Seconds between refreshes: the causes build up over minutes, and pg_stat_activity is not
# free to read on a server with thousands of sessions.
EVERY = 30.0


@dataclass(frozen=True, slots=True)
class VacuumHealthResult:
    findings: int


class VacuumHealth:
    def __init__(self, schema: str, metrics: Metrics) -> None:
        self.schema = schema
        self.metrics = metrics

    def run_once(self, conn: db.Conn) -> VacuumHealthResult:
        """One refresh on an autocommit connection. Raises DatabaseError; the gauges keep
        their last values then."""
        health = read_health(conn, self.schema, older_than=0)
        findings = diagnose(health, self.schema)
        self.metrics.vacuum_findings.set(len(findings))
        self.metrics.horizon_age.set(oldest_transaction(health))
        if health.table is not None:
            self.metrics.dead_tuples.set(health.table.dead_tuples)
            self.metrics.table_bytes.set(health.table.total_bytes)
        return VacuumHealthResult(len(findings))
