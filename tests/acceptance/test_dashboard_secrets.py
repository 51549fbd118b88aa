"""Issue 38, secrets and operations: a DSN's password is in no process title and no log line,
whatever its shape (URL, key=value, malformed, split by libpq); `create_app` refuses a
malformed DSN at once; the dashboard answers 200 on its first request after a restart of the
database. The real `dashboard` and `run` commands, their /proc/<pid>/cmdline, real HTTP."""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable
from urllib.parse import quote, urlencode

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.testclient import TestClient

import pgq_supervisor as pgq
from pgq_supervisor.web import create_app
from tests.acceptance.dashboard import Dashboard
from tests.acceptance.pgserver import OwnServer
from tests.support.processes import APP, Supervisor
from tests.support.waiting import wait_for

SECRET = "s3cret-Pw"


def _url(dsn: str, password: str | None = None, query_password: str | None = None) -> str:
    """The suite's database as a URL (host and port as query parameters: the embedded
    server's host is a socket directory, with no port), the password where the shape puts it."""
    p = conninfo_to_dict(dsn)
    query = {k: str(p[k]) for k in ("host", "port") if p.get(k)}
    if query_password is not None:
        query["password"] = query_password
    user = str(p.get("user") or "postgres")
    userinfo = user if password is None else f"{user}:{quote(password, safe='')}"
    return f"postgresql://{userinfo}@/{p['dbname']}?{urlencode(query)}"


# each DSN shape names the suite's database (trust auth: the password is sent to no one)
SHAPES: list[tuple[str, Callable[[str], str]]] = [
    ("url", lambda dsn: _url(dsn, SECRET + "@x")),
    ("key-value", lambda dsn: make_conninfo(dsn, password=f"{SECRET} 'q")),
    ("url-query", lambda dsn: _url(dsn, query_password=SECRET)),
]


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace").strip()


def _ps_args(pid: int) -> str:
    return subprocess.run(
        ["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.parametrize(("shape", "make"), SHAPES, ids=[s for s, _ in SHAPES])
def test_the_dashboards_title_and_log_hold_no_password(
    dsn: str, started: list[Dashboard], shape: str, make: Callable[[str], str]
) -> None:
    secret_dsn = make(dsn)
    dash = Dashboard(secret_dsn, "--log-level", "debug")
    started.append(dash)
    dash.wait_up()
    assert httpx.get(dash.url + "/jobs").status_code == 200
    for shown in (_cmdline(dash.proc.pid), _ps_args(dash.proc.pid)):
        assert SECRET not in shown, shown
        assert shown == f"pgq-dashboard http://127.0.0.1:{dash.port}/", shown
    assert SECRET not in dash.log()


@pytest.mark.parametrize(("shape", "make"), SHAPES, ids=[s for s, _ in SHAPES])
def test_run_masks_the_password_in_its_title_while_it_waits_for_the_database(
    shape: str, make: Callable[[str], str]
) -> None:
    """Before the supervisor sets its own title (`pgq-supervisor [N procs]`) it may wait for
    the database for connect_timeout: its title shows the DSN masked meanwhile."""
    refused = make("host=127.0.0.1 port=1 user=app dbname=jobs")
    sup = Supervisor(refused, APP, "--connect-timeout", "20")
    try:
        wait_for("the waiting line", lambda: "waiting for the database" in sup.log(), timeout=15)
        shown = _cmdline(sup.proc.pid)
        assert SECRET not in shown and "***" in shown, shown
        assert "pgq-supervisor run --dsn " in shown, shown
        assert SECRET not in sup.log()
    finally:
        sup.close()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(f"postgresql://app:{SECRET}%zz@127.0.0.1/jobs", id="url"),
        pytest.param(f"host=127.0.0.1 user=app password={SECRET} x dbname=jobs", id="key-value"),
        pytest.param(f"host=127.0.0.1 password='{SECRET}", id="unterminated-quote"),
    ],
)
def test_create_app_refuses_a_malformed_dsn_at_once_password_masked(bad: str) -> None:
    with pytest.raises(pgq.InvalidInput) as raised:
        create_app(bad)
    line = str(raised.value)
    assert line.startswith("invalid dsn: ") and "\n" not in line, line
    assert SECRET not in line, line


def test_the_pools_retry_warnings_hold_no_piece_of_a_split_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """libpq splits `u:pw@ss@host` at the first @: `ss@host` becomes the host, which every
    failed attempt quotes. The pool logs each at WARNING: masked."""
    split = f"postgresql://app:pw@{SECRET}@127.0.0.1:1/jobs"
    app = create_app(split)
    caplog.set_level(logging.WARNING, logger="psycopg.pool")

    def request() -> None:
        # the pool gives up after its 10 s open timeout: the answer is a 500, not looked at
        with TestClient(app, raise_server_exceptions=False) as client:
            client.get("/")

    threading.Thread(target=request, daemon=True).start()
    found = wait_for(
        "the pool's warning",
        lambda: [r for r in caplog.records if "error connecting" in r.getMessage()],
        timeout=8,
    )
    app.state.pgq_close()  # its attempts stop
    for record in found:
        message = record.getMessage()
        assert SECRET not in message and "***" in message, message


def test_the_dashboards_first_request_after_a_database_restart_answers_200(
    started: list[Dashboard],
) -> None:
    with OwnServer() as server:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            pgq.migrate(conn)
        dash = Dashboard(server.dsn)
        started.append(dash)
        dash.wait_up()
        with httpx.Client(base_url=dash.url, timeout=20) as client:
            for page in ("/", "/jobs", "/workers"):  # connections in the pool, idle
                assert client.get(page).status_code == 200
            server.restart()
            first = client.get("/jobs")
            assert first.status_code == 200, (first.status_code, dash.log()[-2000:])
            assert client.get("/").status_code == 200
