"""Who may act on the dashboard: read-only unless an `authorize` is given or unauthenticated
actions are allowed out loud; `read_only=True` always read-only; HTTP Basic (`basic_auth`).
The `dashboard` command's settings for the same are in tests/acceptance/test_dashboard_cli.py."""

from __future__ import annotations

import logging
from typing import TypedDict

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobId, JobState, NewJob
from pgq_supervisor.periodic import Schedule
from pgq_supervisor.web import basic_auth, create_app
from pgq_supervisor.web.app import NO_AUTH, READ_ONLY, Action, Authorize
from tests.integration.test_web import CSRF_RE, fail_job
from tests.support.db import SCHEMA, claim_one, count_rows, get


class Options(TypedDict, total=False):
    authorize: Authorize
    read_only: bool
    allow_unauthenticated_actions: bool


def everyone(request: Request, action: Action) -> bool:
    return True


def _actions(failed: JobId, running: JobId) -> list[tuple[str, dict[str, str]]]:
    return [
        (f"/jobs/{failed}/retry", {}),
        (f"/jobs/{running}/cancel", {}),
        (f"/jobs/{failed}/delete", {}),
        ("/types/retry-failed", {"type": "t"}),
        ("/types/pause", {"type": "t"}),
        ("/types/resume", {"type": "t"}),
        ("/jobs/bulk", {"action": "delete", "id": str(failed), "confirmed": "1"}),
        ("/jobs/bulk", {"action": "cancel", "id": str(running), "confirmed": "1"}),
        ("/schedules/run", {"name": "nightly"}),
        ("/schedules/pause", {"name": "nightly"}),
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({}, NO_AUTH, id="by-default"),
        pytest.param({"read_only": True}, READ_ONLY, id="read_only"),
        pytest.param(
            {"read_only": True, "authorize": everyone, "allow_unauthenticated_actions": True},
            READ_ONLY,
            id="read_only-beats-the-rest",
        ),
    ],
)
def test_read_only_hides_and_refuses_every_action(
    dsn: str, conn: Conn, options: Options, message: str
) -> None:
    failed = fail_job(conn)
    running = db.enqueue(conn, SCHEMA, NewJob("r", {}))
    claim_one(conn, "r")
    db.declare_schedules(conn, SCHEMA, [Schedule.make("nightly", type="t", cron="0 3 * * *")])
    app = create_app(dsn, **options)
    with TestClient(app) as client:
        pages = ("/", f"/jobs/{failed}", f"/jobs/{running}", "/jobs", "/types/t", "/schedules")
        for path in pages:
            page = client.get(path)
            assert page.status_code == 200
            assert '<form method="post"' not in page.text, path
            assert "read-only" in page.text
        # a client that copies the CSRF cookie into its form gets no further
        token = client.cookies.get("pgq_csrf")
        assert token
        for path, data in _actions(failed, running):
            answer = client.post(path, data={"csrf": token, **data})
            assert answer.status_code == 403 and answer.text == message, path
    app.state.pgq_close()
    assert get(conn, failed).state is JobState.FAILED
    assert get(conn, running).state is JobState.RUNNING
    assert not db.type_controls(conn, SCHEMA)
    assert count_rows(conn) == 2  # "run now" enqueued nothing
    assert [s.paused_at for s in db.list_schedules(conn, SCHEMA)] == [None]


def test_the_default_refusal_says_how_to_turn_actions_on() -> None:
    for needed in ("authorize", "PGQ_DASHBOARD_USER", "allow_unauthenticated_actions"):
        assert needed in NO_AUTH


def _acts(client: TestClient, conn: Conn, auth: tuple[str, str] | None = None) -> None:
    """Retry and pause through the forms work, with these credentials if any."""
    failed = fail_job(conn)
    page = client.get(f"/jobs/{failed}", auth=auth)
    assert page.status_code == 200 and "read-only" not in page.text
    found = CSRF_RE.search(page.text)
    assert found is not None, "no action form on the page"
    token = found.group(1)
    for path, data in ((f"/jobs/{failed}/retry", {}), ("/types/pause", {"type": "t"})):
        if auth is None:
            done = client.post(path, data={"csrf": token, **data})
        else:
            done = client.post(path, data={"csrf": token, **data}, auth=auth)
        assert done.status_code == 200, (path, done.text)
    assert get(conn, failed).state is JobState.PENDING
    assert [c.type for c in db.type_controls(conn, SCHEMA) if c.paused] == ["t"]


def test_allowing_unauthenticated_actions_opens_them_and_warns(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="pgq_supervisor.web"):
        app = create_app(dsn, allow_unauthenticated_actions=True)
    (warning,) = [r for r in caplog.records if r.name == "pgq_supervisor.web.app"]
    assert warning.levelno == logging.WARNING
    assert "open to anyone" in warning.getMessage()
    with TestClient(app) as client:
        _acts(client, conn)
    app.state.pgq_close()


def test_an_authorize_callable_turns_actions_on_and_is_asked_for_each(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    asked: list[Action] = []

    def recording(request: Request, action: Action) -> bool:
        asked.append(action)
        return True

    with caplog.at_level(logging.WARNING, logger="pgq_supervisor.web"):
        app = create_app(dsn, authorize=recording)
    assert not caplog.records  # authenticated: nothing to warn about
    with TestClient(app) as client:
        _acts(client, conn)
    app.state.pgq_close()
    assert {"view", "retry", "pause"} <= set(asked)


def test_basic_auth_asks_for_credentials_and_lets_its_user_act(dsn: str, conn: Conn) -> None:
    app = create_app(dsn, authorize=basic_auth("oncall", "s3cret:with colon"))
    with TestClient(app) as client:
        asked = client.get("/")
        assert asked.status_code == 401
        assert asked.headers["www-authenticate"] == 'Basic realm="pgq dashboard"'
        for wrong in (("oncall", "s3cret"), ("other", "s3cret:with colon"), ("", "")):
            assert client.get("/", auth=wrong).status_code == 401, wrong
        bad_header = client.get("/", headers={"Authorization": "Basic not-base64!"})
        assert bad_header.status_code == 401
        # every action needs the credentials too, CSRF token or not
        failed = fail_job(conn)
        page = client.get("/", auth=("oncall", "s3cret:with colon"))
        found = CSRF_RE.search(page.text)
        assert page.status_code == 200 and found is not None
        refused = client.post(f"/jobs/{failed}/retry", data={"csrf": found.group(1)})
        assert refused.status_code == 401 and get(conn, failed).state is JobState.FAILED
        _acts(client, conn, auth=("oncall", "s3cret:with colon"))
    app.state.pgq_close()


@pytest.mark.parametrize("bad", [("", "pw"), ("user", "")])
def test_basic_auth_needs_a_user_and_a_password(bad: tuple[str, str]) -> None:
    with pytest.raises(ValueError, match="needs a user and a password"):
        basic_auth(*bad)


def test_the_csrf_secret_is_the_deployments_and_must_be_long_enough(dsn: str, conn: Conn) -> None:
    """Two apps with one secret accept each other's tokens (replicas behind one address); two
    without one (each a random secret) do not; a short secret is refused."""
    with pytest.raises(ValueError, match="at least 16 bytes"):
        create_app(dsn, secret="short")
    secret = "s" * 32
    pairs = [
        (
            create_app(dsn, authorize=everyone, secret=secret),
            create_app(dsn, authorize=everyone, secret=secret),
            200,
        ),
        (create_app(dsn, authorize=everyone), create_app(dsn, authorize=everyone), 403),
    ]
    for n, (minting, checking, status) in enumerate(pairs):
        failed = fail_job(conn, f"t{n}")
        with TestClient(minting) as first, TestClient(checking) as second:
            found = CSRF_RE.search(first.get(f"/jobs/{failed}").text)
            assert found is not None
            second.cookies.set("pgq_csrf", first.cookies["pgq_csrf"])
            answer = second.post(f"/jobs/{failed}/retry", data={"csrf": found.group(1)})
            assert answer.status_code == status, answer.text
        assert get(conn, failed).state is (JobState.PENDING if status == 200 else JobState.FAILED)
        minting.state.pgq_close()
        checking.state.pgq_close()
