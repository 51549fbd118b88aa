"""The supervisor with exactly the environment the shipped deploy files give it (the Kubernetes
Deployment and the compose file), placed first as a pod's env is: it must start, run jobs, keep
its titles, serve its probes and drain on SIGTERM. Only what points at this test's database and
app is replaced."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.acceptance.scrape import free_port, get
from tests.support.processes import APP, ROOT, Supervisor, count
from tests.support.waiting import wait_for


def _deployment_env() -> dict[str, str]:
    docs = yaml.safe_load_all((ROOT / "deploy" / "k8s" / "deployment.yaml").read_text())
    (deployment,) = [d for d in docs if d and d.get("kind") == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: str(e["value"]) for e in container["env"] if "value" in e}


def _compose_env() -> dict[str, str]:
    doc: dict[str, Any] = yaml.safe_load(Path(ROOT / "docker-compose.yml").read_text())
    env = doc["services"]["supervisor"]["environment"]
    return {k: str(v) for k, v in env.items()}


@pytest.mark.parametrize("source", [_deployment_env, _compose_env], ids=["k8s", "compose"])
def test_the_shipped_environment_runs_jobs_and_drains(
    source: Any, dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    env = source()
    assert env.get("PGQ_APP") and env.get("PGQ_METRICS_PORT"), env  # what we replace is there
    port = free_port()
    env |= {"PGQ_APP": APP, "PGQ_METRICS_PORT": str(port)}
    env.pop("PGQ_DSN", None)  # the helper passes the test database with --dsn
    procs = int(env.get("PGQ_PROCS", "1"))
    sup = Supervisor(dsn, APP, env=env)
    sups.append(sup)
    sup.wait_ready(procs, timeout=60)

    ids = pgq.enqueue_many(db, [pgq.NewJob("record", {}) for _ in range(50)])
    wait_for("50 succeeded", lambda: count(dsn, "state = 'succeeded'") == 50)
    assert get(port, "/healthz")[0] == 200
    wait_for("ready", lambda: get(port, "/readyz")[0] == 200)
    out = subprocess.run(["ps", "-o", "args=", "-p", str(sup.pid)], capture_output=True, text=True)
    assert out.stdout.strip() == f"pgq-supervisor [{procs} proc{'s' if procs != 1 else ''}]"

    sup.signal(signal.SIGTERM)
    assert sup.wait(timeout=30) == 0
    assert db.execute("SELECT count(DISTINCT job_id) FROM effects").fetchone() == (len(ids),)
    if env.get("PGQ_LOG_FORMAT") == "json":
        lines = [ln for ln in sup.log().splitlines() if ln.strip()]
        assert lines and all(json.loads(ln)["level"] for ln in lines)
