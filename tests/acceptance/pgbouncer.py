"""A real PgBouncer in transaction mode in front of the test server, for the process tests.

Debian's `pgbouncer` package (1.18 on Debian 12: no max_prepared_statements, so clients must
turn server-side prepared statements off). It runs on a free port with its own ini and
userlist in a temporary directory; as root it drops to an unprivileged user (pgbouncer refuses
root): `nobody`, or the owner of the server's socket directory when the server is reached
through a Unix socket (the embedded server's lives in its private data directory). That
directory is made readable by others, wherever the checkout lives.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.waiting import wait_for


def binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _run_as(server: Mapping[str, object]) -> str:
    host = str(server.get("host") or "")
    if host.startswith("/"):
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    return "nobody"


@contextmanager
def pgbouncer(server_dsn: str) -> Iterator[str]:
    """Run PgBouncer (transaction pooling) in front of `server_dsn`'s server; yields a DSN of
    the same database through the pooler. Any database name is forwarded to the server."""
    exe = binary()
    assert exe is not None
    server = conninfo_to_dict(server_dsn)
    user = str(server.get("user") or "postgres")
    target = " ".join(
        f"{k}={_quote(str(server[k]))}" for k in ("host", "port", "user", "password") if k in server
    )
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="pgq-bouncer-"))
    tmp.chmod(0o755)  # readable by the unprivileged user it runs as
    userlist = tmp / "userlist.txt"
    userlist.write_text(f'"{user}" "{server.get("password") or ""}"\n')
    ini = tmp / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = {target}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {userlist}\n"
        "pool_mode = transaction\n"
        "max_client_conn = 200\n"
        "default_pool_size = 20\n"
        f"admin_users = {user}\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        + (f"user = {_run_as(server)}\n" if os.geteuid() == 0 else "")
    )
    for f in (userlist, ini):
        f.chmod(0o644)
    log = (tmp / "pgbouncer.log").open("wb")
    proc = subprocess.Popen([exe, str(ini)], stdout=log, stderr=subprocess.STDOUT)
    dsn = make_conninfo(server_dsn, host="127.0.0.1", port=str(port), password="")

    def answers() -> bool:
        assert proc.poll() is None, (tmp / "pgbouncer.log").read_text(errors="replace")
        try:
            psycopg.connect(dsn, prepare_threshold=None, connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    try:
        wait_for("pgbouncer answering", answers, timeout=15)
        yield dsn
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def clients(bouncer_dsn: str) -> list[str]:
    """The application_name of each client connected to the pooler (its admin console)."""
    with psycopg.connect(
        make_conninfo(bouncer_dsn, dbname="pgbouncer"), autocommit=True, prepare_threshold=None
    ) as admin:
        cur = psycopg.ClientCursor(admin)
        cur.execute("SHOW CLIENTS")
        names = [d.name for d in cur.description or ()]
        at = names.index("application_name")
        return [str(row[at]) for row in cur.fetchall()]
