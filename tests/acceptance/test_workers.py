"""Supervisors register in the supervisor table (schema/0010): `workers` lists each with its
children and the job each holds; a clean exit removes the row."""

from __future__ import annotations

import json
import signal
import socket

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.support.processes import APP, FAST, Supervisor, run_cli
from tests.support.waiting import wait_for


def _workers(dsn: str) -> list[dict[str, object]]:
    out = run_cli(["workers", "--json"], dsn)
    assert out.returncode == 0, out.stderr
    supervisors = json.loads(out.stdout)["supervisors"]
    assert isinstance(supervisors, list)
    return supervisors


def test_workers_lists_each_supervisor_and_child_until_it_exits(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = Supervisor(dsn, APP, "--procs", "2", "--types", "busy_loop,noop", *FAST)
    sups.append(sup)
    pids = sup.wait_ready(2)
    job_id = pgq.enqueue(db, "busy_loop", {})

    def holding() -> list[dict[str, object]] | None:
        found = _workers(dsn)
        if len(found) != 1:
            return None
        children = found[0]["children"]
        assert isinstance(children, list)
        held = [c for c in children if c.get("job_id") == str(job_id)]
        return found if held and len(children) == 2 else None

    (row,) = wait_for("the supervisor's row showing the job in hand", holding)
    assert row["pid"] == sup.pid and row["procs"] == 2 and row["stale"] is False
    assert row["types"] == ["busy_loop", "noop"]
    children = row["children"]
    assert isinstance(children, list)
    assert sorted(c["pid"] for c in children) == sorted(pids)
    (busy,) = [c for c in children if c["job_id"] == str(job_id)]
    assert busy["job_type"] == "busy_loop" and busy["state"] == "busy"

    text = run_cli(["workers"], dsn)
    assert text.returncode == 0 and f"pid {sup.pid}" in text.stdout
    assert f"job busy_loop {job_id}" in text.stdout

    pgq.cancel_job(db, job_id)  # a busy loop never ends on its own: the shutdown would wait
    sup.signal(signal.SIGTERM)
    assert sup.wait(timeout=30) == 0
    assert _workers(dsn) == []
    assert "no supervisor is registered" in run_cli(["workers"], dsn).stdout


def test_dashboard_refuses_a_port_it_cannot_use_in_one_line(dsn: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = run_cli(["dashboard", "--port", str(port)], dsn)
    assert out.returncode == 2
    assert out.stderr.strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    out = run_cli(["dashboard", "--port", "70000"], dsn)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "invalid port" in out.stderr
