"""vacuum.diagnose: what needs action, from readings made up here (the integration tests read
real ones: tests/integration/test_doctor.py)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from pgq_supervisor.db.health import Backend, Health, JobTable, Prepared, Setting, Slot
from pgq_supervisor.vacuum import MAX_XMIN_AGE, diagnose, oldest_transaction

TABLE = JobTable(
    live_tuples=100_000, dead_tuples=5_000, total_bytes=2**30, table_bytes=2**29,
    last_vacuum=None, last_autovacuum=datetime(2026, 1, 1, tzinfo=UTC), autovacuum_count=3,
    options=[], partitions=3,
)  # fmt: skip
ON = [Setting("autovacuum", "on")]


def health(
    *,
    backends: list[Backend] | None = None,
    slots: list[Slot] | None = None,
    prepared: list[Prepared] | None = None,
    table: JobTable = TABLE,
    settings: list[Setting] = ON,
) -> Health:
    return Health(backends or [], slots or [], prepared or [], table, settings)


def test_healthy_is_no_finding() -> None:
    assert diagnose(health(), "pgq") == []
    assert oldest_transaction(health()) == 0.0


def test_each_cause_is_named_with_what_to_do() -> None:
    young = Backend(7, "app", "web", "active", "client backend", 10.0, 5, "SELECT 1")
    old = Backend(
        42,
        "bi",
        "report",
        "idle in transaction",
        "client backend",
        900.0,
        12_345,
        "SELECT *\n FROM t",
    )
    slot = Slot("standby_1", "physical", False, None, None, 3 * 2**20)
    busy = Slot("live", "physical", True, None, None, 0.0)  # active, no xmin: holds nothing
    prepared = Prepared("tx-1", "app", "db", 4000.0, 99)
    found = diagnose(health(backends=[young, old], slots=[slot, busy], prepared=[prepared]), "jobs")
    assert [f.what.split(" ")[0] for f in found] == ["session", "replication", "prepared"]
    assert "pid 42" in found[0].what and "15 min" in found[0].what
    assert "'SELECT * FROM t'" in found[0].what
    assert "pg_terminate_backend(42)" in found[0].action
    assert "3.0 MiB of WAL" in found[1].what
    assert "pg_drop_replication_slot('standby_1')" in found[1].action
    assert "ROLLBACK PREPARED 'tx-1'" in found[2].action
    assert oldest_transaction(health(backends=[young, old], prepared=[prepared])) == 4000.0


def test_dead_tuples_past_a_fifth_of_the_live_ones_and_autovacuum_off() -> None:
    bloated = dataclasses.replace(TABLE, dead_tuples=30_000)
    off = [Setting("autovacuum", "off")]
    found = diagnose(health(table=bloated, settings=off), "jobs")
    assert found[0].what == "autovacuum is off on this server"
    assert found[1].what.startswith("the job table has 30,000 dead row versions (100,000 live")
    assert found[1].action.startswith("VACUUM (VERBOSE) jobs.job; first end what holds")


def test_an_active_slot_counts_only_when_its_xmin_is_far_behind() -> None:
    # a healthy standby with hot_standby_feedback: its slot always holds an xmin, a few behind
    healthy = Slot("standby_1", "physical", True, 12, None, 2**16)
    assert diagnose(health(slots=[healthy]), "pgq") == []
    far = Slot("standby_2", "physical", True, MAX_XMIN_AGE, None, 2**16)
    (found,) = diagnose(health(slots=[healthy, far]), "pgq")
    assert "'standby_2' (physical, active)" in found.what
    assert f"({MAX_XMIN_AGE:,} transactions)" in found.what
    assert diagnose(health(slots=[far]), "pgq", max_xmin_age=MAX_XMIN_AGE + 1) == []
    # inactive, a slot is a finding whatever it holds: WAL, or an xmin however young
    gone = Slot("standby_3", "physical", False, 12, None, 2**20)
    wal_only = Slot("standby_4", "physical", False, None, None, 2**20)
    found_names = [f.what.split("'")[1] for f in diagnose(health(slots=[gone, wal_only]), "pgq")]
    assert found_names == ["standby_3", "standby_4"]


def test_a_walsender_counts_by_how_far_behind_its_xmin_is() -> None:
    # hot_standby_feedback without a slot: the walsender holds an xmin outside any transaction
    def walsender(pid: int, xmin_age: int) -> Backend:
        return Backend(pid, "replicator", "walreceiver", "active", "walsender", None, xmin_age, "")

    assert diagnose(health(backends=[walsender(9, 3)]), "pgq") == []
    assert oldest_transaction(health(backends=[walsender(9, MAX_XMIN_AGE)])) == 0.0
    (found,) = diagnose(health(backends=[walsender(9, 3), walsender(10, MAX_XMIN_AGE)]), "pgq")
    assert found.what.startswith("walsender pid 10 (user replicator, application 'walreceiver')")
    assert f"{MAX_XMIN_AGE:,} transactions behind" in found.what
    assert "hot_standby_feedback" in found.action
    assert diagnose(health(backends=[walsender(10, 50)]), "pgq", max_xmin_age=50) != []
