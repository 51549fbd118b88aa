"""The `dashboard` command's safe default: read-only unless HTTP Basic credentials are set
(PGQ_DASHBOARD_USER, PGQ_DASHBOARD_PASSWORD) or --allow-unauthenticated-actions says so out
loud. Real command, real HTTP; what the app does behind it is in tests/integration/."""

from __future__ import annotations

import re
import signal

import httpx
import pytest

from tests.acceptance.conftest import Conn
from tests.acceptance.dashboard import Dashboard, free_port
from tests.integration.test_web import CSRF_RE
from tests.support.processes import run_cli
from tests.support.waiting import wait_for

CREDENTIALS = {"PGQ_DASHBOARD_USER": "oncall", "PGQ_DASHBOARD_PASSWORD": "s3cret"}


def _start(started: list[Dashboard], dsn: str, *args: str, **env: str) -> Dashboard:
    dash = Dashboard(dsn, *args, env=env)
    started.append(dash)
    return dash.wait_up()


def _pause(dash: Dashboard, auth: tuple[str, str] | None = None) -> httpx.Response:
    """POST a pause with the token of the Jobs page's form (the cookie's when the page shows
    no form: read-only)."""
    with httpx.Client(base_url=dash.url, auth=auth) as client:
        page = client.get("/jobs")
        found = CSRF_RE.search(page.text)
        token = found.group(1) if found else client.cookies["pgq_csrf"]
        return client.post("/types/pause", data={"csrf": token, "type": "t"})


def _paused(db: Conn) -> list[str]:
    return [str(t) for (t,) in db.execute("SELECT type FROM pgq.type_pause").fetchall()]


def test_without_credentials_the_dashboard_is_read_only(
    dsn: str, db: Conn, started: list[Dashboard]
) -> None:
    dash = _start(started, dsn)
    assert "read-only: set PGQ_DASHBOARD_USER and PGQ_DASHBOARD_PASSWORD" in dash.log()
    page = httpx.get(dash.url + "/")
    assert page.status_code == 200 and "read-only" in page.text
    assert '<form method="post"' not in page.text
    refused = _pause(dash)
    assert refused.status_code == 403
    assert refused.text.startswith("this dashboard is read-only: actions need authentication")
    assert _paused(db) == []


def test_allowing_unauthenticated_actions_warns_at_start(
    dsn: str, db: Conn, started: list[Dashboard]
) -> None:
    dash = _start(started, dsn, "--allow-unauthenticated-actions")
    assert re.search(r"WARNING .*actions .* are open to anyone", dash.log()), dash.log()
    assert _pause(dash).status_code == 303
    assert _paused(db) == ["t"]


def test_basic_auth_credentials_guard_pages_and_actions(
    dsn: str, db: Conn, started: list[Dashboard]
) -> None:
    dash = _start(started, dsn, **CREDENTIALS)
    assert "HTTP Basic, user oncall" in dash.log() and "WARNING" not in dash.log()
    asked = httpx.get(dash.url + "/")
    assert asked.status_code == 401 and asked.headers["www-authenticate"].startswith("Basic")
    assert httpx.get(dash.url + "/", auth=("oncall", "wrong")).status_code == 401
    page = httpx.get(dash.url + "/", auth=("oncall", "s3cret"))
    assert page.status_code == 200 and "read-only" not in page.text
    assert _pause(dash, ("oncall", "s3cret")).status_code == 303
    assert _paused(db) == ["t"]


def test_read_only_stays_read_only_with_credentials(
    dsn: str, db: Conn, started: list[Dashboard]
) -> None:
    dash = _start(started, dsn, "--read-only", "--allow-unauthenticated-actions", **CREDENTIALS)
    refused = _pause(dash, ("oncall", "s3cret"))
    assert refused.status_code == 403 and refused.text == "this dashboard is read-only"
    assert _paused(db) == []


@pytest.mark.parametrize("given", ["PGQ_DASHBOARD_USER", "PGQ_DASHBOARD_PASSWORD"])
def test_a_user_without_a_password_or_the_reverse_is_one_line_exit_2(dsn: str, given: str) -> None:
    out = run_cli(["dashboard", "--port", str(free_port())], dsn, env={given: CREDENTIALS[given]})
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert (
        len(lines) == 1 and "PGQ_DASHBOARD_USER and PGQ_DASHBOARD_PASSWORD go together" in lines[0]
    )
    assert "s3cret" not in out.stderr


@pytest.mark.parametrize("level", ["debug", "info"])
def test_sigterm_stops_it_with_exit_0_and_requests_are_logged_at_debug_only(
    dsn: str, started: list[Dashboard], level: str
) -> None:
    dash = _start(started, dsn, "--log-level", level)
    assert httpx.get(dash.url + "/jobs?state=failed").status_code == 200
    if level == "debug":
        wait_for("the request's DEBUG line", lambda: "GET /jobs?state=failed 200" in dash.log())
    dash.proc.send_signal(signal.SIGTERM)
    assert dash.proc.wait(timeout=30) == 0, dash.log()
    logged = [line for line in dash.log().splitlines() if "GET /" in line]
    if level == "debug":
        assert len(logged) == 2 and all(" DEBUG " in line for line in logged), logged
        assert re.search(r"GET /jobs\?state=failed 200 [\d.]+ ms$", logged[-1]), logged
    else:
        assert logged == []  # nor uvicorn's INFO access line
