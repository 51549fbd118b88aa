"""A workflow as `show ID` and the dashboard's job page list it (issue 26): its steps with
their state, result or error and duration, and what it sleeps or waits on now."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

import pgq_supervisor as pgq
from pgq_supervisor import testing
from pgq_supervisor.db import Conn
from pgq_supervisor.supervisor.metrics import Metrics, QueueMetrics
from tests.support.processes import run_cli
from tests.support.web import dashboard_client


def _registry() -> pgq.Registry:
    registry = pgq.Registry()

    @registry.workflow("onboard")
    def onboard(ctx: pgq.WorkflowContext, payload: object) -> None:
        ctx.step("create", lambda: {"account": 7})
        ctx.wait_for("approved", timeout=3600)

    return registry


@pytest.fixture
def waiting(conn: Conn) -> pgq.JobId:
    job_id = pgq.enqueue(conn, "onboard", {})
    testing.drain(conn, _registry())
    return job_id


def test_show_lists_the_steps_and_the_current_wait(dsn: str, waiting: pgq.JobId) -> None:
    result = run_cli(["show", str(waiting)], dsn)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "workflow: waits for signal 'approved' until " in text
    assert "workflow steps (2):" in text
    lines = [line.split("  ") for line in text.splitlines() if line.startswith("  #")]
    step, wait = [[cell.strip() for cell in line if cell.strip()] for line in lines]
    assert step[:4] == ["#1", "step", "'create'", "succeeded"]
    assert step[4].endswith(" ms") and step[5] == '{"account": 7}'
    assert wait[:4] == ["#2", "wait", "'approved'", "waiting"]

    doc = json.loads(run_cli(["show", str(waiting), "--json"], dsn).stdout)
    assert [(s["name"], s["state"]) for s in doc["steps"]] == [
        ("create", "succeeded"),
        ("approved", "waiting"),
    ]
    assert doc["steps"][0]["result"] == {"account": 7}


@pytest.fixture
def client(dsn: str) -> Iterator[TestClient]:
    with dashboard_client(dsn) as c:
        yield c


def test_the_job_page_lists_the_steps(client: TestClient, waiting: pgq.JobId) -> None:
    page = client.get(f"/jobs/{waiting}").text
    assert "Workflow steps (2)" in page
    assert 'id="workflow-pause">Now: waits for signal &#39;approved&#39; until' in page
    assert "<td>create</td><td>succeeded</td>" in page
    assert "<td>approved</td><td>waiting</td>" in page


def test_a_job_that_is_no_workflow_shows_no_steps(dsn: str, conn: Conn, client: TestClient) -> None:
    job_id = pgq.enqueue(conn, "plain", {})
    assert "workflow" not in run_cli(["show", str(job_id)], dsn).stdout
    assert "Workflow steps" not in client.get(f"/jobs/{job_id}").text


def test_the_metrics_count_the_paused_workflows(conn: Conn, waiting: pgq.JobId) -> None:
    metrics = Metrics()
    QueueMetrics("pgq", metrics, 1.0).run_once(conn)
    gauge = metrics.registry.get_sample_value
    assert gauge("pgq_workflows_paused", {"type": "onboard", "reason": "waiting"}) == 1
    pgq.signal(conn, waiting, "approved", True)
    testing.drain(conn, _registry())
    QueueMetrics("pgq", metrics, 1.0).run_once(conn)
    assert gauge("pgq_workflows_paused", {"type": "onboard", "reason": "waiting"}) == 0
