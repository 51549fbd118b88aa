"""deploy/systemd: the unit as systemd reads it, and the settings it and its environment file name.

`systemd-analyze verify` checks the unit where the machine has it (it needs no running systemd);
the keys the stop relies on are checked against the code either way."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from pgq_supervisor import cli
from pgq_supervisor.errors import ExitCode
from pgq_supervisor.registry import load_registry
from pgq_supervisor.settings import load_settings
from tests.unit.test_deploy_manifests import PGQ_NAME, ROOT, SETTING_ENV

SYSTEMD = ROOT / "deploy" / "systemd"
UNIT = SYSTEMD / "pgq-supervisor.service"
ENV_FILE = SYSTEMD / "pgq-supervisor.env"
SCRIPT = next(iter(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]))


class UnitParser(configparser.ConfigParser):
    """A unit file's INI dialect: `key=value`, case-sensitive keys, no interpolation; a key
    given twice is an error here (systemd would append or override: we never rely on it)."""

    def __init__(self) -> None:
        super().__init__(strict=True, interpolation=None, delimiters=("=",))

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def read_unit() -> UnitParser:
    unit = UnitParser()
    unit.read_string(UNIT.read_text())
    return unit


def test_the_unit_stops_the_supervisor_alone_and_waits_longer_than_shutdown_timeout() -> None:
    unit = read_unit()
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    assert service["Type"] in ("exec", "simple")
    # the supervisor stops its children itself; systemd SIGKILLs what is left after it exits
    assert service["KillMode"] == "mixed" and service["KillSignal"] == "SIGTERM"
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == SCRIPT and argv[1] == "run"
    args = cli.build_parser().parse_args(argv[1:])  # flags `run` has (exits 2 otherwise)
    shutdown = float(args.shutdown_timeout)
    # after shutdown_timeout the supervisor still kills (SIGTERM, 2 s, SIGKILL) and releases
    assert float(service["TimeoutStopSec"]) >= shutdown + 10
    pre = shlex.split(service["ExecStartPre"])
    assert Path(pre[0]).name == SCRIPT and pre[1:] == ["migrate"]


def test_the_unit_restarts_on_failures_a_restart_can_fix() -> None:
    service = read_unit()["Service"]
    assert service["Restart"] == "on-failure"
    assert float(service["RestartSec"]) > 0
    # bad settings, an app that does not import: the same again after a restart
    prevented = {int(code) for code in service["RestartPreventExitStatus"].split()}
    assert prevented == {ExitCode.USAGE, ExitCode.APP_LOAD}
    assert read_unit()["Install"]["WantedBy"] == "multi-user.target"


def test_the_unit_runs_unprivileged_and_hardened() -> None:
    service = read_unit()["Service"]
    assert service["User"] not in ("root", "0") and service["Group"] not in ("root", "0")
    expected = {
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",  # multiprocessing's sockets need a writable /tmp
        "PrivateDevices": "yes",
        "RestrictSUIDSGID": "yes",
        "SystemCallArchitectures": "native",
    }
    assert {k: service.get(k) for k in expected} == expected
    families = set(service["RestrictAddressFamilies"].split())
    assert families == {"AF_UNIX", "AF_INET", "AF_INET6"}


def test_the_environment_file_holds_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Path(read_unit()["Service"]["EnvironmentFile"]).is_absolute()
    env: dict[str, str] = {}
    for line in ENV_FILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
    assert env.keys() <= SETTING_ENV
    assert "PGQ_SHUTDOWN_TIMEOUT" not in env, "set in the unit, next to TimeoutStopSec"
    assert set(PGQ_NAME.findall(UNIT.read_text())) <= SETTING_ENV
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.app is not None
    load_registry(settings.app)


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    unit = read_unit()  # what systemd will parse, checked here on every machine
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        warnings.warn("systemd-analyze not found: the unit was only parsed as INI", stacklevel=1)
        assert unit["Service"]["ExecStart"]
        return
    # verify checks that the commands exist: point them at an executable this machine has
    installed = str(Path(shlex.split(unit["Service"]["ExecStart"])[0]))
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace(installed, sys.executable))
    done = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    # it exits 0 after a warning (an unknown key, a value it cannot parse): none is accepted
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
