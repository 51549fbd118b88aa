"""Large payloads and results (issue 38 item 5): `show` and the dashboard's job page cut them
at display.SHOWN_CHARS with the whole size and a way to the whole (`show --full`, the page's
link); the page does not read a large one whole, and its live poll answers an unchanged page
with 304 before rendering anything."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import jinja2
import pytest
from starlette.testclient import TestClient

import pgq_supervisor as pgq
from pgq_supervisor.db import Conn
from pgq_supervisor.display import SHOWN_CHARS
from pgq_supervisor.jobs import JobId, JsonValue
from pgq_supervisor.jsontext import MAX_PAYLOAD_ENV
from tests.integration.test_admin_cli import cli, ok, ok_json
from tests.support.web import dashboard_client

PAYLOAD: JsonValue = {"rows": [{"n": i, "text": "x" * 90} for i in range(20_000)]}  # ~2.3 MB
RESULT: JsonValue = {"lines": ["y" * 100] * 10_000}  # ~1 MB


@pytest.fixture
def big_job(conn: Conn, monkeypatch: pytest.MonkeyPatch) -> JobId:
    """A succeeded job with a payload and a result far over SHOWN_CHARS (under a raised cap)."""
    monkeypatch.setenv(MAX_PAYLOAD_ENV, str(8 << 20))
    job_id = pgq.enqueue(conn, "t", PAYLOAD)
    conn.execute(
        "UPDATE pgq.job SET state = 'succeeded', result = %s::jsonb, started_at = now(),"
        " stopped_at = now(), updated_at = now() WHERE id = %s",
        (json.dumps(RESULT), job_id),
    )
    return job_id


@pytest.fixture
def client(dsn: str) -> Iterator[TestClient]:
    with dashboard_client(dsn) as c:
        yield c


def test_show_cuts_a_large_payload_and_result_and_full_prints_them(
    dsn: str, big_job: JobId
) -> None:
    out = ok(cli(dsn, "show", str(big_job)))
    assert len(out) < 3 * SHOWN_CHARS  # both cut, not 3.3 MB
    payload_size = len(json.dumps(PAYLOAD).encode())
    assert f"cut at {SHOWN_CHARS} characters: {payload_size} bytes of JSON in all" in out
    assert f"(show {big_job} --full)" in out
    assert f"{len(json.dumps(RESULT).encode())} bytes of JSON in all" in out

    full = ok(cli(dsn, "show", str(big_job), "--full"))
    assert json.dumps(PAYLOAD) in full and json.dumps(RESULT) in full
    assert "cut at" not in full
    # --json is for scripts: always whole
    doc = ok_json(cli(dsn, "show", str(big_job), "--json"))
    assert doc["job"]["payload"] == PAYLOAD and doc["job"]["result"] == RESULT


def test_show_prints_a_small_payload_whole(dsn: str, conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t", {"a": "z" * 1000})
    out = ok(cli(dsn, "show", str(job_id)))
    assert json.dumps({"a": "z" * 1000}) in out and "cut at" not in out


def test_the_job_page_cuts_a_large_payload_and_result_and_links_to_them(
    client: TestClient, big_job: JobId
) -> None:
    page = client.get(f"/jobs/{big_job}")
    assert page.status_code == 200
    assert len(page.content) < 3 * SHOWN_CHARS  # not the 3.3 MB of both
    payload = re.search(r'<pre id="payload">(.*?)</pre>', page.text, re.S)
    assert payload is not None and len(payload.group(1)) >= SHOWN_CHARS - 100
    cut = re.search(r'id="payload-cut">(.*?)</p>', page.text, re.S)
    assert cut is not None and "bytes of JSON in all" in cut.group(1)
    link = re.search(r'href="([^"]*/payload\.json)"', cut.group(1))
    assert link is not None
    whole = client.get(link.group(1))
    assert whole.status_code == 200 and whole.headers["content-type"] == "application/json"
    assert whole.json() == PAYLOAD
    result = re.search(r'id="result-cut">.*?href="([^"]*/result\.json)"', page.text, re.S)
    assert result is not None and client.get(result.group(1)).json() == RESULT
    assert client.get(f"/jobs/{big_job}/nothing.json").status_code == 404


def test_the_job_page_shows_a_small_payload_whole(client: TestClient, conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t", {"a": 1})
    page = client.get(f"/jobs/{job_id}").text
    assert '<pre id="payload">{\n  &#34;a&#34;: 1\n}</pre>' in page
    assert "payload-cut" not in page and '<pre id="result">null</pre>' in page


def test_an_unchanged_job_page_is_not_rendered_for_a_live_poll(
    client: TestClient, conn: Conn, big_job: JobId, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered: list[str] = []
    render = jinja2.Template.render

    def counted(self: jinja2.Template, *args: object, **kwargs: object) -> str:
        rendered.append(str(self.name))
        return render(self, *args, **kwargs)

    monkeypatch.setattr(jinja2.Template, "render", counted)
    live = {"X-Pgq-Live": "1"}
    first = client.get(f"/jobs/{big_job}", headers=live)
    assert first.status_code == 200 and rendered == ["job.html"]
    etag = first.headers["etag"]
    for _ in range(3):
        same = client.get(f"/jobs/{big_job}", headers={**live, "If-None-Match": etag})
        assert same.status_code == 304 and same.headers["etag"] == etag
    assert rendered == ["job.html"]  # the polls rendered nothing
    conn.execute("UPDATE pgq.job SET priority = 5, updated_at = now() WHERE id = %s", (big_job,))
    changed = client.get(f"/jobs/{big_job}", headers={**live, "If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert rendered == ["job.html", "job.html"]
