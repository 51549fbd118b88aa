"""Dependencies under a real supervisor (CLI subprocess, two children): a diamond runs in
order, a failed branch cancels what depends on it, and "run" runs a dependent anyway."""

from __future__ import annotations

import pgq_supervisor as pgq
from pgq_supervisor.jobs import JsonValue
from tests.acceptance.conftest import Conn
from tests.support.processes import APP, FAST, Supervisor, count
from tests.support.waiting import wait_for


def test_diamonds_run_in_order_and_failures_cancel_or_run_dependents(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = Supervisor(dsn, APP, "--procs", "2", *FAST)
    sups.append(sup)
    sup.wait_ready(2)

    def step(name: str, *deps: pgq.JobId, **extra: str | float | bool) -> pgq.JobId:
        rule = "run" if extra.pop("run", False) else "cancel"
        payload: dict[str, JsonValue] = {"name": name, "seconds": 0.2, **extra}
        return pgq.enqueue(
            db,
            "step",
            payload,
            depends_on=deps,
            on_dependency_failure=rule,  # type: ignore[arg-type]
        )

    with db.transaction():  # the whole graph at once: nothing starts before it exists
        a = step("a")
        b, c = step("b", a), step("c", a, seconds=0.5)
        d = step("d", b, c)
        a2 = step("a2")
        b2, c2 = step("b2", a2, fail=True), step("c2", a2)
        d2 = step("d2", b2, c2)
        e2 = step("e2", b2, run=True)
    wait_for("every step finished", lambda: count(dsn, "stopped_at IS NULL") == 0, timeout=30)
    jobs = {i: pgq.get_job(db, i) for i in (a, b, c, d, a2, b2, c2, d2, e2)}

    for first, then in ((a, b), (a, c), (b, d), (c, d), (a2, b2), (a2, c2), (b2, e2)):
        stopped, started = jobs[first].stopped_at, jobs[then].started_at
        assert stopped is not None and started is not None, (jobs[first], jobs[then])
        assert stopped <= started, (first, then)
    assert jobs[d].result == {
        "name": "d",
        "saw": {str(b): jobs[b].result, str(c): jobs[c].result},
    }
    assert jobs[b2].state is pgq.JobState.FAILED
    assert jobs[d2].state is pgq.JobState.CANCELLED and jobs[d2].started_at is None
    assert jobs[d2].error_msg == f"dependency {b2} failed"
    assert jobs[e2].state is pgq.JobState.SUCCEEDED
    assert jobs[e2].result == {"name": "e2", "saw": {str(b2): None}}
    assert sup.stop() == 0
