"""The dashboard over HTTP (Starlette's TestClient, a real database): pages, actions, and what
guards them: CSRF, authorize, escaping (read-only and authentication: test_web_auth.py). The
browser tests are in tests/acceptance/test_web_browser.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.testclient import TestClient

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobId, JobState, JsonValue, NewJob
from pgq_supervisor.periodic import Schedule
from pgq_supervisor.web import ACTIONS, create_app
from pgq_supervisor.web.app import Action
from pgq_supervisor.web.csrf import WRONG_TOKEN
from tests.readme import doc_texts
from tests.support.db import SCHEMA, claim, claim_one, count_rows, get
from tests.support.web import dashboard_client

CSRF_RE = re.compile(r'name="csrf" value="([^"]+)"')


def fail_job(conn: Conn, type_: str = "t", payload: JsonValue = None) -> JobId:
    """A job that failed for good, with a traceback in its history."""
    job_id = db.enqueue(conn, SCHEMA, NewJob(type_, payload or {}, max_retry_count=0))
    job = claim_one(conn, type_, max_retry_count=0)
    assert job.id == job_id
    db.end_attempt(
        conn, SCHEMA, [job_id], error="RuntimeError: boom", kind=AttemptKind.ERROR,
        lease=job.lease, error_data={"traceback": "Traceback (most recent call last):\n  boom"},
    )  # fmt: skip
    record = get(conn, job_id)
    assert record.state is JobState.FAILED
    # schema/0010: each attempt keeps its own traceback
    last = record.attempts[-1]
    assert isinstance(last, dict)
    assert last["traceback"] == "Traceback (most recent call last):\n  boom"
    return job_id


@pytest.fixture
def client(dsn: str) -> Iterator[TestClient]:
    """A client of a dashboard whose actions are open (these tests are about the actions)."""
    with dashboard_client(dsn, open_actions=True) as c:
        yield c


def csrf_of(client: TestClient, path: str = "/") -> str:
    page = client.get(path)
    assert page.status_code == 200, page.text
    found = CSRF_RE.search(page.text)
    assert found is not None, "no action form on the page"
    return found.group(1)


def test_every_page_answers_and_shows_the_counts(client: TestClient, conn: Conn) -> None:
    failed = fail_job(conn)
    for _ in range(3):
        db.enqueue(conn, SCHEMA, NewJob("t", {}))
    overview = client.get("/")
    assert overview.status_code == 200
    row = re.search(r'<tr data-type="t">(.*?)</tr>', overview.text, re.S)
    assert row is not None
    assert re.search(r'data-col="ready">3<', row.group(1))
    assert re.search(r'data-col="failed"><a [^>]*>1</a>', row.group(1))
    for path in ("/jobs", f"/jobs/{failed}", "/bundles", "/workers", "/schedules"):
        assert client.get(path).status_code == 200, path
    listed = client.get("/jobs?state=pending")
    assert listed.text.count('class="state pending"') == 3
    job_page = client.get(f"/jobs/{failed}")
    assert "Traceback (most recent call last)" in job_page.text
    assert client.get("/jobs/not-a-uuid").status_code == 404
    assert client.get("/jobs?state=bogus").status_code == 400
    # with something on each: a completed bundle, a schedule, a registered supervisor
    bundle = pgq.enqueue_bundle(conn, "batch", [NewJob("b", {})], on_complete="after")
    (member,) = claim(conn, ["b"])
    db.succeed(conn, SCHEMA, member.lease, [(member.id, None)])
    db.declare_schedules(conn, SCHEMA, [Schedule.make("nightly", type="t", cron="0 3 * * *")])
    db.register_supervisor(
        conn, SCHEMA, id="h:1:0", host="host-1", pid=4242, procs=1, types=["t"],
        started_at=db.db_now(conn, SCHEMA),
        children=[{"index": 0, "pid": 4243, "state": "busy", "job_id": str(failed),
                   "job_type": "t", "jobs_done": 7}],
    )  # fmt: skip
    bundles = client.get("/bundles").text
    assert str(bundle.id) in bundles and "1 / 1" in bundles and 'class="state pending"' in bundles
    assert "0 3 * * *" in client.get("/schedules").text
    workers = client.get("/workers").text
    assert "host-1 pid 4242" in workers and f'title="{failed}"' in workers


def test_jobs_claimed_but_not_started_show_as_such(client: TestClient, conn: Conn) -> None:
    """A child's row says it runs one job and holds others it has not started (issue 20):
    the Workers page counts them, and such a job's page says so (the job in hand's does not)."""
    for _ in range(3):
        db.enqueue(conn, SCHEMA, NewJob("t", {}))
    in_hand, waiting, _ = claim(conn, ["t"], worker_id="h:1:0:ab", limit=3)
    db.register_supervisor(
        conn, SCHEMA, id="h:1", host="host-1", pid=4242, procs=1, types=["t"],
        started_at=db.db_now(conn, SCHEMA),
        children=[{"index": 0, "pid": 4243, "worker_id": "h:1:0:ab", "state": "busy",
                   "job_id": str(in_hand.id), "job_type": "t", "in_flight": 1, "held": 2,
                   "jobs_done": 7}],
    )  # fmt: skip
    workers = client.get("/workers").text
    held = re.search(r'<td class="held">(.*?)</td>', workers, re.S)
    assert held is not None, "the Workers page has no column of jobs claimed, not started"
    assert str(waiting.id) in held.group(1) and str(in_hand.id) not in held.group(1)
    assert held.group(1).count('class="held-job"') == 2
    in_hand_cell = re.search(r'<td class="in-hand">(.*?)</td>', workers, re.S)
    assert in_hand_cell is not None and 'class="duration"' in in_hand_cell.group(1)
    page = client.get(f"/jobs/{waiting.id}").text
    found = re.search(r'<td id="not-started">(.*?)</td>', page, re.S)
    assert found is not None, "the job page does not say the job was not started"
    assert "claimed, not started" in found.group(1) and str(in_hand.id) in found.group(1)
    assert 'id="not-started"' not in client.get(f"/jobs/{in_hand.id}").text


def test_search_by_id_opens_the_job_and_by_unique_key_lists_it(
    client: TestClient, conn: Conn
) -> None:
    job_id = db.enqueue(conn, SCHEMA, NewJob("t", {}, unique_key="order-42"))
    found = client.get(f"/jobs?q={job_id}", follow_redirects=False)
    assert found.status_code == 303 and found.headers["location"].endswith(f"/jobs/{job_id}")
    listed = client.get("/jobs?q=order-42")
    assert str(job_id) in listed.text
    assert str(job_id) not in client.get("/jobs?q=order-43").text


def test_a_tenant_job_page_names_its_tenant(client: TestClient, conn: Conn) -> None:
    job_id = db.enqueue(conn, SCHEMA, NewJob("t", {}, tenant="acme"))
    found = re.search(r'<td id="tenant">(.*?)</td>', client.get(f"/jobs/{job_id}").text, re.S)
    assert found is not None and found.group(1).startswith("acme")
    plain = db.enqueue(conn, SCHEMA, NewJob("t", {}))
    assert 'id="tenant"' not in client.get(f"/jobs/{plain}").text


def test_keyset_pages_cover_every_job_once(client: TestClient, conn: Conn) -> None:
    ids = {str(db.enqueue(conn, SCHEMA, NewJob("t", {"i": i}))) for i in range(120)}
    seen: list[str] = []
    path: str | None = "/jobs"
    while path is not None:
        page = client.get(path)
        seen += re.findall(r'<tr data-id="([0-9a-f-]+)"', page.text)
        older = re.search(r'id="older" href="([^"]+)"', page.text)
        path = older.group(1).replace("&amp;", "&") if older else None
    assert len(seen) == len(ids) and set(seen) == ids


def test_retry_cancel_delete_and_pause_through_forms(client: TestClient, conn: Conn) -> None:
    failed = fail_job(conn)
    token = csrf_of(client, f"/jobs/{failed}")
    done = client.post(f"/jobs/{failed}/retry", data={"csrf": token})
    assert done.status_code == 200  # followed the redirect back to the job
    assert "pending again" in done.text
    assert get(conn, failed).state is JobState.PENDING

    # cancel and delete ask first: unconfirmed, a page that asks and nothing changed
    asked = client.post(f"/jobs/{failed}/cancel", data={"csrf": token})
    assert asked.status_code == 200 and f"Cancel job {failed}?" in asked.text
    assert 'name="confirmed" value="1"' in asked.text
    assert get(conn, failed).state is JobState.PENDING
    done = client.post(f"/jobs/{failed}/cancel", data={"csrf": token, "confirmed": "1"})
    assert "cancelled" in done.text and get(conn, failed).state is JobState.CANCELLED
    asked = client.post(f"/jobs/{failed}/delete", data={"csrf": token})
    assert f"Delete job {failed} for good?" in asked.text and count_rows(conn) == 1
    done = client.post(f"/jobs/{failed}/delete", data={"csrf": token, "confirmed": "1"})
    assert "deleted" in done.text and count_rows(conn) == 0

    client.post("/types/pause", data={"csrf": token, "type": "t"})
    assert [c.type for c in db.type_controls(conn, SCHEMA) if c.paused] == ["t"]
    again = client.post("/types/pause", data={"csrf": token, "type": "t"})
    assert "already paused" in again.text
    client.post("/types/resume", data={"csrf": token, "type": "t"})
    assert not db.type_controls(conn, SCHEMA)

    fail_job(conn, "u")
    fail_job(conn, "u")
    fail_job(conn, "v")
    asked = client.post("/types/retry-failed", data={"csrf": token, "type": "u"})
    assert "Retry every failed job of type u?" in asked.text
    assert count_rows(conn, where="state = 'failed'") == 3
    done = client.post("/types/retry-failed", data={"csrf": token, "type": "u", "confirmed": "1"})
    assert "2 failed jobs of type u pending again" in done.text
    assert count_rows(conn, where="state = 'failed'") == 1

    bad = client.post("/types/pause", data={"csrf": token, "type": "has space"})
    assert "invalid job type" in bad.text


def test_an_action_without_the_csrf_token_is_refused(client: TestClient, conn: Conn) -> None:
    failed = fail_job(conn)
    token = csrf_of(client)
    for data in ({}, {"csrf": "forged"}, {"csrf": token + "x"}):
        answer = client.post(f"/jobs/{failed}/retry", data=data)
        assert answer.status_code == 403 and "CSRF" in answer.text
    # the form's token without its cookie (another site's form posting here) is refused too
    cookieless = TestClient(client.app)
    answer = cookieless.post(f"/jobs/{failed}/retry", data={"csrf": token})
    assert answer.status_code == 403
    assert get(conn, failed).state is JobState.FAILED
    # GET never acts
    assert client.get(f"/jobs/{failed}/retry").status_code == 405


def test_authorize_false_gives_403_and_changes_nothing(dsn: str, conn: Conn) -> None:
    failed = fail_job(conn)
    asked: list[Action] = []

    def viewers_only(request: Request, action: Action) -> bool:
        asked.append(action)
        return action == "view"

    app = create_app(dsn, authorize=viewers_only)
    with TestClient(app) as client:
        token = csrf_of(client, f"/jobs/{failed}")
        for path, data in (
            (f"/jobs/{failed}/retry", {}),
            (f"/jobs/{failed}/delete", {}),
            ("/types/pause", {"type": "t"}),
            ("/types/retry-failed", {"type": "t"}),
        ):
            answer = client.post(path, data={"csrf": token, **data})
            assert answer.status_code == 403, path
    app.state.pgq_close()
    assert get(conn, failed).state is JobState.FAILED
    assert not db.type_controls(conn, SCHEMA)
    assert set(asked) == {"view", "retry", "delete", "pause", "retry_failed"}
    assert set(asked) <= set(ACTIONS)

    async def nobody(request: Request, action: Action) -> bool:
        return False

    app = create_app(dsn, authorize=nobody)
    with TestClient(app) as client:
        assert client.get("/").status_code == 403
    app.state.pgq_close()


def test_a_script_in_a_payload_is_shown_escaped(client: TestClient, conn: Conn) -> None:
    evil = "<script>alert(1)</script>"
    job_id = fail_job(conn, "t", {"note": evil})
    conn.execute("UPDATE pgq.job SET error_msg = %s WHERE id = %s", (evil, job_id))
    for path in (f"/jobs/{job_id}", "/jobs"):
        text = client.get(path).text
        assert "<script>alert" not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    # the only script elements are the dashboard's own
    scripts = re.findall(r"<script[^>]*>", client.get(f"/jobs/{job_id}").text)
    assert len(scripts) == 2 and all("/static/" in s for s in scripts)


def test_live_polls_get_304_until_something_changes(client: TestClient, conn: Conn) -> None:
    job_id = db.enqueue(conn, SCHEMA, NewJob("t", {}))
    live = {"X-Pgq-Live": "1"}
    first = client.get(f"/jobs/{job_id}", headers=live)
    assert first.status_code == 200 and "<html" not in first.text
    etag = first.headers["etag"]
    same = client.get(f"/jobs/{job_id}", headers={**live, "If-None-Match": etag})
    assert same.status_code == 304
    claim_one(conn, "t")
    changed = client.get(f"/jobs/{job_id}", headers={**live, "If-None-Match": etag})
    assert changed.status_code == 200 and "running" in changed.text


def test_mounted_under_a_prefix_its_links_and_forms_keep_the_prefix(dsn: str, conn: Conn) -> None:
    failed = fail_job(conn)
    dashboard = create_app(dsn, allow_unauthenticated_actions=True)
    outer = Starlette(routes=[Mount("/ops/queue", app=dashboard)])
    with TestClient(outer) as client:
        page = client.get(f"/ops/queue/jobs/{failed}")
        assert page.status_code == 200
        assert f'action="/ops/queue/jobs/{failed}/retry"' in page.text
        assert 'href="/ops/queue/static/style.css"' in page.text
        assert client.get("/ops/queue/static/live.js").status_code == 200
        token = CSRF_RE.search(page.text)
        assert token is not None
        done = client.post(f"/ops/queue/jobs/{failed}/retry", data={"csrf": token.group(1)})
        assert done.status_code == 200 and str(done.url).endswith(f"/ops/queue/jobs/{failed}")
    dashboard.state.pgq_close()
    assert get(conn, failed).state is JobState.PENDING


def test_overview_counts_throughput_of_the_last_hour(client: TestClient, conn: Conn) -> None:
    fail_job(conn)
    ok = db.enqueue(conn, SCHEMA, NewJob("t", {}))
    job = claim_one(conn, "t")
    assert job.id == ok
    conn.execute(
        "UPDATE pgq.job SET state = 'succeeded', stopped_at = now(), lease = NULL,"
        " worker_alive_at = NULL WHERE id = %s",
        (ok,),
    )
    old = fail_job(conn)
    conn.execute(
        "UPDATE pgq.job SET stopped_at = now() - %s WHERE id = %s", (timedelta(hours=2), old)
    )
    text = client.get("/").text
    assert re.search(r'id="hour-succeeded">1<', text)
    assert re.search(r'id="hour-failed">1<', text)
    assert re.search(r'id="failure-rate">50.0 %<', text)
    assert text.count("<rect") == 2


def test_the_readme_http_basic_example_asks_checks_and_separates_roles(
    dsn: str, conn: Conn
) -> None:
    readme = next(t for t in doc_texts() if "```python\nimport base64, binascii, hmac" in t)
    code = readme.split("```python\nimport base64, binascii, hmac")[1].split("```")[0]
    scope: dict[str, object] = {}
    exec("import base64, binascii, hmac" + code, scope)
    failed = fail_job(conn)
    app = create_app(dsn, authorize=scope["authorize"])  # type: ignore[arg-type]
    with TestClient(app) as client:
        asked = client.get("/")
        assert asked.status_code == 401 and asked.headers["www-authenticate"].startswith("Basic")
        assert client.get("/", auth=("viewer", "wrong")).status_code == 401
        assert client.get("/", auth=("viewer", "v1ew")).status_code == 200
        page = client.get(f"/jobs/{failed}", auth=("viewer", "v1ew"))
        token = CSRF_RE.search(page.text)
        assert token is not None
        retry = f"/jobs/{failed}/retry"
        data = {"csrf": token.group(1)}
        assert client.post(retry, data=data, auth=("viewer", "v1ew")).status_code == 403
        assert get(conn, failed).state is JobState.FAILED
        # the token is bound to the credentials it was minted for: the viewer's is not oncall's
        refused = client.post(retry, data=data, auth=("oncall", "s3cret"))
        assert (refused.status_code, refused.text) == (403, WRONG_TOKEN)
        page = client.get(f"/jobs/{failed}", auth=("oncall", "s3cret"))
        token = CSRF_RE.search(page.text)
        assert token is not None
        data = {"csrf": token.group(1)}
        assert client.post(retry, data=data, auth=("oncall", "s3cret")).status_code == 200
        assert get(conn, failed).state is JobState.PENDING
    app.state.pgq_close()
