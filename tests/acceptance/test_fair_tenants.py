"""Fair claims across tenants through the real CLI, under two supervisors at once: a small
tenant's job, enqueued with `enqueue --tenant` after a big tenant's backlog, runs long before
that backlog drains; `show` names the tenant."""

from __future__ import annotations

import uuid

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.processes import FAST, Supervisor, count, run_cli
from tests.support.waiting import wait_for

APP = "pgq_semantics_app:registry"
BACKLOG = 600  # "busy" jobs of 20 ms: 6 s of work for the two children, more under load


def test_a_small_tenant_job_runs_before_the_big_tenant_backlog_drains(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    pgq.enqueue_many(db, [pgq.NewJob("busy", {"i": i}, tenant="big") for i in range(BACKLOG)])
    for _ in range(2):
        sups.append(Supervisor(dsn, APP, "--procs", "1", *FAST))
    for sup in sups:
        sup.wait_ready(1)
    wait_for("the big tenant's backlog to start", lambda: count(dsn, "state <> 'pending'") > 0)
    enq = run_cli(["enqueue", "busy", "{}", "--tenant", "small"], dsn=dsn)
    assert enq.returncode == 0, enq.stderr
    small = uuid.UUID(enq.stdout.strip())

    def small_done() -> bool:
        row = db.execute("SELECT state::text FROM pgq.job WHERE id = %s", (small,)).fetchone()
        return row is not None and row[0] == "succeeded"

    wait_for("the small tenant's job to run", small_done, timeout=60)
    # plain claim order (oldest first) would have run it after the whole backlog
    left = count(dsn, "tenant = 'big' AND state = 'pending'")
    assert left > BACKLOG // 2, left
    shown = run_cli(["show", str(small)], dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    assert any(line.split() == ["tenant", "small"] for line in shown.stdout.splitlines())
    bad = run_cli(["enqueue", "busy", "{}", "--tenant", ""], dsn=dsn)
    assert bad.returncode == 2 and "tenant" in bad.stderr, bad.stderr
    for sup in sups:
        assert sup.stop() == 0, sup.log()[-2000:]
