"""The FastAPI recipe (examples/fastapi_app.py) on a real uvicorn, driven by httpx, with a
real supervisor running its jobs: an order and its job commit together (or neither does), and
a request waits for the job's result."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from tests.acceptance.dashboard import Served
from tests.support.processes import Supervisor
from tests.support.waiting import wait_for


class Uvicorn(Served):
    """`uvicorn examples.fastapi_app:app` on a free port, logs to a file."""

    def __init__(self, dsn: str) -> None:
        argv = [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app",
                "--host", "127.0.0.1", "--port", "{port}"]  # fmt: skip
        super().__init__(argv, {**os.environ, "PGQ_DSN": dsn}, "pgq-uvicorn-")

    def up(self) -> bool:
        assert self.proc.poll() is None, self.log()
        try:
            return httpx.get(self.url + "/docs", timeout=2).status_code == 200
        except httpx.TransportError:
            return False


@pytest.fixture
def api(dsn: str) -> Iterator[Uvicorn]:
    server = Uvicorn(dsn)
    try:
        wait_for("uvicorn answering", server.up, timeout=60)
        yield server
    finally:
        server.close()


@pytest.mark.slow
def test_an_order_and_its_job_commit_together_and_a_request_waits_for_the_result(
    api: Uvicorn, dsn: str, sups: list[Supervisor]
) -> None:
    with httpx.Client(base_url=api.url, timeout=60) as client:
        created = client.post("/orders", json={"quantity": 3, "unit_price": 7})
        assert created.status_code == 200, api.log()
        job_id = created.json()["job_id"]
        # rejected by the table after the enqueue: the job goes with the order
        refused = client.post("/orders", json={"quantity": 5000, "unit_price": 1})
        assert refused.status_code == 422, api.log()
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("SELECT o.total_job::text FROM orders o").fetchall()
            jobs = conn.execute("SELECT id::text FROM pgq.job").fetchall()
        assert rows == [(job_id,)] and jobs == [(job_id,)]

        sups.append(Supervisor(dsn, "examples.fastapi_app:registry", "--concurrency", "1"))
        waited = client.get(f"/jobs/{job_id}/result", params={"timeout": 45})
        assert waited.status_code == 200, sups[0].log()
        assert waited.json() == {"state": "succeeded", "result": 21, "error": None}
