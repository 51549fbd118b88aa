"""The dashboard as an attacker drives it: the real `dashboard` command with HTTP Basic
configured, a real HTTP client holding good credentials (as a browser that cached them does),
and requests that another site could make that browser send. Nothing may change."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import httpx
import markupsafe
import pytest

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.acceptance.dashboard import Dashboard
from tests.integration.test_web import CSRF_RE

AUTH = ("oncall", "s3cret")
SECRET = "a-deployment-secret-of-32-bytes!"
ENV = {"PGQ_DASHBOARD_USER": AUTH[0], "PGQ_DASHBOARD_PASSWORD": AUTH[1]}


@pytest.fixture
def dash(dsn: str) -> Iterator[Dashboard]:
    served = Dashboard(dsn, env={**ENV, "PGQ_DASHBOARD_SECRET": SECRET})
    try:
        yield served.wait_up()
    finally:
        served.close()


def _token(client: httpx.Client) -> str:
    found = CSRF_RE.search(client.get("/jobs").text)
    assert found is not None, "no action form"
    return found.group(1)


def _state(db: Conn, job_id: pgq.JobId) -> pgq.JobState:
    return pgq.get_job(db, job_id).state


def _one_line_403(answer: httpx.Response, says: str) -> None:
    assert answer.status_code == 403, answer.text
    assert answer.text.count("\n") == 0 and says in answer.text, answer.text


def test_a_forged_csrf_pair_is_refused(db: Conn, dash: Dashboard) -> None:
    """A cookie and field of the attacker's choosing (a sibling subdomain can set the cookie)."""
    job_id = pgq.enqueue(db, "t")
    with httpx.Client(base_url=dash.url, auth=AUTH) as client:
        for path, extra in ((f"/jobs/{job_id}/cancel", {"confirmed": "1"}), ("/types/pause", {})):
            client.cookies.set("pgq_csrf", "forged123")
            answer = client.post(path, data={"csrf": "forged123", "type": "t", **extra})
            _one_line_403(answer, "missing or wrong CSRF token")
        # a well-formed nonce of the attacker's in both places, with no mac the server made
        nonce = "A" * 43
        client.cookies.set("pgq_csrf", nonce)
        answer = client.post("/types/pause", data={"csrf": f"{nonce}.{'B' * 43}", "type": "t"})
        _one_line_403(answer, "missing or wrong CSRF token")
    assert _state(db, job_id) is pgq.JobState.PENDING
    assert db.execute("SELECT count(*) FROM pgq.type_pause").fetchone() == (0,)


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        pytest.param({"Origin": "https://evil.example"}, "another origin", id="foreign-origin"),
        pytest.param({"Origin": "null"}, "another origin", id="origin-null"),
        pytest.param(
            {"Origin": "http://127.0.0.1.evil.example"}, "another origin", id="lookalike-origin"
        ),
        pytest.param(
            {"Referer": "https://evil.example/page"}, "another origin", id="foreign-referer"
        ),
        pytest.param({"Sec-Fetch-Site": "cross-site"}, "cross-site", id="sec-fetch-site"),
        pytest.param(
            {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
            "cross-site",
            id="both",
        ),
    ],
)
def test_a_request_from_another_site_is_refused_with_a_good_token(
    db: Conn, dash: Dashboard, headers: dict[str, str], says: str
) -> None:
    failed = pgq.enqueue(db, "t")
    db.execute(
        "UPDATE pgq.job SET state = 'failed', stopped_at = now(), error_msg = 'boom' WHERE id = %s",
        (failed,),
    )
    pending = pgq.enqueue(db, "t")
    with httpx.Client(base_url=dash.url, auth=AUTH) as client:
        token = _token(client)
        posts = [
            (f"/jobs/{failed}/retry", {}),
            (f"/jobs/{pending}/cancel", {"confirmed": "1"}),
            ("/types/pause", {"type": "t"}),
        ]
        for path, data in posts:
            answer = client.post(path, data={"csrf": token, **data}, headers=headers)
            _one_line_403(answer, says)
        assert _state(db, failed) is pgq.JobState.FAILED
        assert _state(db, pending) is pgq.JobState.PENDING
        # the same token from the dashboard's own page acts: the refusals were the headers'
        own = {"Origin": dash.url, "Referer": dash.url + "/jobs", "Sec-Fetch-Site": "same-origin"}
        done = client.post(f"/jobs/{failed}/retry", data={"csrf": token}, headers=own)
        assert done.status_code == 303, done.text
    assert _state(db, failed) is pgq.JobState.PENDING


def test_the_token_is_bound_to_the_browser_and_the_credentials(
    dsn: str, db: Conn, dash: Dashboard
) -> None:
    with httpx.Client(base_url=dash.url, auth=AUTH) as client:
        token = _token(client)
    with httpx.Client(base_url=dash.url, auth=AUTH) as other:  # its own cookie
        _token(other)
        _one_line_403(
            other.post("/types/pause", data={"csrf": token, "type": "t"}),
            "missing or wrong CSRF token",
        )
    # the same secret on a second replica: its pages' tokens act on the first, as behind one
    # load balancer
    with httpx.Client(auth=AUTH) as client:
        replica = Dashboard(dsn, env={**ENV, "PGQ_DASHBOARD_SECRET": SECRET}).wait_up()
        try:
            found = CSRF_RE.search(client.get(replica.url + "/jobs").text)
        finally:
            replica.close()
        assert found is not None
        cookie = client.cookies["pgq_csrf"]
        client.cookies.clear()
        client.cookies.set("pgq_csrf", cookie)
        done = client.post(dash.url + "/types/pause", data={"csrf": found.group(1), "type": "t"})
        assert done.status_code == 303, done.text
    assert db.execute("SELECT type FROM pgq.type_pause").fetchall() == [("t",)]


FRAMING = {
    "x-frame-options": "DENY",
    "content-security-policy": "frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
}


def test_every_response_forbids_framing_and_sniffing_and_static_files_need_credentials(
    db: Conn, dash: Dashboard
) -> None:
    job_id = pgq.enqueue(db, "t")
    with httpx.Client(base_url=dash.url) as anonymous:
        asked = [anonymous.get(path) for path in ("/", "/static/live.js", "/static/style.css")]
        assert [a.status_code for a in asked] == [401, 401, 401]
        assert all("live" not in a.text and "{" not in a.text for a in asked[1:])
    with httpx.Client(base_url=dash.url, auth=AUTH) as client:
        token = _token(client)
        answers = [
            client.get("/"),
            client.get(f"/jobs/{job_id}"),
            client.get("/static/live.js"),
            client.get("/static/style.css"),
            client.get("/static/nope.js"),
            client.get("/no/such/page"),
            client.post("/types/pause", data={"csrf": "forged", "type": "t"}),
            client.post("/types/pause", data={"csrf": token, "type": "t"}),
        ]
    statuses = [a.status_code for a in answers]
    assert statuses == [200, 200, 200, 200, 404, 404, 403, 303], statuses
    assert "fetch(" in answers[2].text  # the script itself, to its user
    for answer in [*asked, *answers]:
        got = {k: answer.headers.get(k) for k in FRAMING}
        assert got == FRAMING, (answer.request.url, answer.status_code, got)


@pytest.mark.parametrize("name", ["emails/send", "a%2Fb", "50%off", "what?now#x", "über/日本"])
def test_a_type_with_url_characters_links_to_its_own_page_under_uvicorn(
    db: Conn, dash: Dashboard, name: str
) -> None:
    """Through the real server (it decodes a path once, as browsers expect), including names
    that hold an escape already, which Starlette's TestClient would decode twice."""
    pgq.enqueue(db, name)
    with httpx.Client(base_url=dash.url, auth=AUTH) as client:
        for path in ("/", "/jobs"):
            page = client.get(path)
            assert page.status_code == 200, page.text[:300]
            links = re.findall(r'<a href="([^"]*/types/[^"]*)">([^<]*)</a>', page.text)
            (href,) = [h for h, shown in links if html.unescape(shown) == name]
            type_page = client.get(html.unescape(href))
            assert type_page.status_code == 200
            assert f"<h1>Type <code>{markupsafe.escape(name)}</code>" in type_page.text
