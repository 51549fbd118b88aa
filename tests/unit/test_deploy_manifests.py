"""deploy/ and docker-compose.yml: they parse, and every setting they name exists and is valid.

Docker and a cluster are not available to the suite, so these read the files the way the tools
would and check them against the code: Settings, the CLI's commands, the metrics server's paths.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pgq_supervisor import cli
from pgq_supervisor import sql as queries
from pgq_supervisor.registry import load_registry
from pgq_supervisor.settings import Settings, load_settings
from pgq_supervisor.supervisor.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
MANIFESTS = sorted(K8S.glob("*.yaml"))
YAML_FILES = [*MANIFESTS, COMPOSE]

# the env names Settings reads: PGQ_ + field name, except schema (PGQ_SCHEMA, via its alias)
SETTING_ENV = {f"PGQ_{name.upper()}" for name in Settings.model_fields} - {"PGQ_DB_SCHEMA"}
SETTING_ENV |= {"PGQ_SCHEMA"}
PGQ_NAME = re.compile(r"\bPGQ_[A-Z0-9_]+\b")


def load_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def by_kind(kind: str) -> list[tuple[Path, Any]]:
    return [(p, d) for p in MANIFESTS for d in load_all(p) if d.get("kind") == kind]


def container_env(container: Any) -> dict[str, str | None]:
    """name -> literal value (None when it comes from a secret or a config map)."""
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def the_deployment() -> Any:
    ((_, deployment),) = by_kind("Deployment")
    return deployment


def the_supervisor_container() -> Any:
    spec = the_deployment()["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return container


def compose_services() -> dict[str, Any]:
    (doc,) = load_all(COMPOSE)
    services = doc["services"]
    assert isinstance(services, dict)
    return services


def compose_env(service: Any) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # the KEY=value spelling
        return dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.name)
def test_parses_as_yaml(path: Path) -> None:
    docs = load_all(path)
    assert docs, f"{path} holds no document"
    for doc in docs:
        assert isinstance(doc, dict)


@pytest.mark.parametrize("path", [*YAML_FILES, DOCKERFILE], ids=lambda p: p.name)
def test_every_pgq_name_is_a_setting(path: Path) -> None:
    """Env names anywhere in the file, comments included: a typo there misleads a reader too."""
    named = set(PGQ_NAME.findall(path.read_text()))
    unknown = named - SETTING_ENV
    assert not unknown, f"{path.name} names settings that do not exist: {sorted(unknown)}"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_kubernetes_objects_have_the_basics(path: Path) -> None:
    for doc in load_all(path):
        assert isinstance(doc.get("apiVersion"), str) and isinstance(doc.get("kind"), str)
        if doc["kind"] != "Kustomization":
            assert doc["metadata"]["name"] == "pgq-supervisor"


def test_kustomization_lists_files_that_exist() -> None:
    ((path, kustomization),) = by_kind("Kustomization")
    resources = kustomization["resources"]
    assert resources and all((path.parent / r).is_file() for r in resources)
    # one ScaledObject per Deployment: KEDA rejects a second one
    assert sum(1 for r in resources if r.startswith("scaledobject")) == 1


def test_the_deployment_env_is_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    env = container_env(the_supervisor_container())
    assert env.keys() <= SETTING_ENV
    assert env["PGQ_DSN"] is None, "the DSN comes from a secret, never a literal"
    for name, value in env.items():
        if value is not None:
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("PGQ_DSN", "postgresql://u:p@db.example:5432/app")
    settings = load_settings()
    assert settings.metrics_port is not None
    assert settings.retain_succeeded is not None and settings.retain_failed is not None
    assert settings.app is not None
    load_registry(settings.app)  # the example app the manifest names can be loaded


def test_termination_grace_outlasts_the_shutdown_timeout() -> None:
    spec = the_deployment()["spec"]["template"]["spec"]
    shutdown = float(container_env(the_supervisor_container())["PGQ_SHUTDOWN_TIMEOUT"] or "nan")
    # after shutdown_timeout the supervisor still kills (SIGTERM, 2 s, SIGKILL) and releases
    assert spec["terminationGracePeriodSeconds"] >= shutdown + 10


def test_probes_hit_health_endpoints_on_the_metrics_port() -> None:
    container = the_supervisor_container()
    port = int(container_env(container)["PGQ_METRICS_PORT"] or "0")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": port}
    probes = {
        k: container[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["startupProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert all(p["port"] in ("metrics", port) for p in probes.values())
    annotations = the_deployment()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)


def test_the_deployment_runs_as_non_root_and_migrates_first() -> None:
    spec = the_deployment()["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    (init,) = spec["initContainers"]
    assert init["args"] == ["migrate"]
    assert the_supervisor_container()["args"] == ["run"]


def test_keda_postgresql_trigger_counts_ready_jobs() -> None:
    scaled = {p.name: d for p, d in by_kind("ScaledObject")}
    assert set(scaled) == {"scaledobject.yaml", "scaledobject-prometheus.yaml"}
    deployment_name = the_deployment()["metadata"]["name"]

    pg = scaled["scaledobject.yaml"]
    assert pg["spec"]["scaleTargetRef"]["name"] == deployment_name
    assert pg["spec"]["minReplicaCount"] == 0
    (trigger,) = pg["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    meta = trigger["metadata"]
    # KEDA reads the connection string from this env var of the scaled container
    assert meta["connectionFromEnv"] in container_env(the_supervisor_container())
    # the schema's depth() and nothing else: `depth` and the gauge call the same function
    # (tests/integration/test_depth.py runs this text against a database)
    assert meta["query"] == "SELECT pgq.depth()"
    assert queries.query("depth", "pgq").as_string() == (
        'SELECT "pgq".depth(VARIADIC %(types)s::text[])'
    )
    float(meta["targetQueryValue"])
    float(meta["activationTargetQueryValue"])

    prom = scaled["scaledobject-prometheus.yaml"]
    assert prom["spec"]["scaleTargetRef"]["name"] == deployment_name
    # the pods are the metric's source: at zero replicas nobody would report it
    assert prom["spec"]["minReplicaCount"] >= 1
    (trigger,) = prom["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    # every pod reports the same database-wide gauge (the schema's depth()): max across pods
    assert trigger["metadata"]["query"] == 'max(pgq_queue_depth{namespace="default"})'
    assert Metrics().registry.get_sample_value("pgq_queue_depth") == 0
    float(trigger["metadata"]["threshold"])


def test_compose_runs_postgres_then_migrate_then_the_supervisor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services = compose_services()
    assert set(services) == {"postgres", "migrate", "supervisor"}
    migrate, sup = services["migrate"], services["supervisor"]
    assert migrate["command"] == ["migrate"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert sup["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert sup["command"][0] in cli.COMMANDS
    for service in (migrate, sup):
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()

    env = compose_env(sup)
    assert env.keys() <= SETTING_ENV
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.app is not None
    load_registry(settings.app)
    port = settings.metrics_port
    assert any(str(p).endswith(f":{port}:{port}") for p in sup["ports"])
    grace = re.fullmatch(r"(\d+)s", sup["stop_grace_period"])
    assert grace is not None and int(grace.group(1)) > settings.shutdown_timeout


def test_dockerfile_installs_the_package_as_a_non_root_user() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert stages and all("slim" in s for s in stages)
    for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE):
        for source in copied.split():
            assert (ROOT / source).exists(), f"COPY {source}: not in the build context"
    user = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert re.search(r'^ENTRYPOINT \[.*"python", "-m", "pgq_supervisor"\]', text, re.MULTILINE)
    ignored = (ROOT / ".dockerignore").read_text().split()
    for needed in ("pyproject.toml", "README.md", "pgq_supervisor", "schema"):
        assert needed not in ignored
