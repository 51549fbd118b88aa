"""The dashboard's pages under hostile input (issue 38): every accepted job type name renders on
every page and its link leads to its own page (the alphabet is check_type_name's, and each URL
is built with quoting, so one producer's `emails/send` cannot take the overview down for
everyone); a way back never leads to another site; a search PostgreSQL cannot take answers
400 with a line, as the other filters do. The real command's side is
tests/acceptance/test_dashboard_hostile.py."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from urllib.parse import quote, unquote, urlsplit

import markupsafe
import pytest
from starlette.testclient import TestClient

from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import NewJob, check_type_name
from pgq_supervisor.periodic import Schedule
from tests.integration.test_web import csrf_of, fail_job
from tests.support.db import SCHEMA
from tests.support.web import dashboard_client

# one of each class of character the alphabet accepts that means something in a URL or HTML
NAMES = [
    "emails/send",  # a path separator
    "/leading",
    "trailing/",
    "a//b",
    "50%off",  # a percent sign
    "a%2Fb",  # what looks like an escape already
    "what?now",  # a query
    "tag#1",  # a fragment
    "a+b&c=d;e",  # query punctuation
    "dots.in.it",
    "<b>'x'\"y\"</b>",  # markup and quotes: escaped, never markup
    "über/日本語/🚀",  # non-ASCII: Latin, CJK, outside the BMP
    "a\\b",  # a backslash
]
REFUSED = [" ", "a b", "a\tb", "a\u00a0b", "a\u2028b", "a\x00b", "a\x01b", "a\x7fb", "a\x85b",
           "a\ud800b", ".", "..", "", "x" * 101]  # fmt: skip


def test_the_alphabet_is_decided_in_check_type_name() -> None:
    for name in NAMES:
        assert check_type_name(name) == name
    for bad in REFUSED:
        with pytest.raises(ValueError, match="invalid job type"):
            check_type_name(bad)


@pytest.fixture
def client(dsn: str) -> Iterator[TestClient]:
    with dashboard_client(dsn, open_actions=True) as c:
        yield c


def _type_links(text: str) -> dict[str, str]:
    """Each link to a type's page on a page: the name it shows -> its href."""
    found = re.findall(r'<a href="([^"]*/types/[^"]*)">([^<]*)</a>', text)
    return {html.unescape(name): html.unescape(href) for href, name in found}


# Starlette's TestClient decodes a path twice (httpx's URL.path is decoded already, and it
# unquotes that again): a name holding an escape is followed through the real command's uvicorn
# in tests/acceptance/test_dashboard_hostile.py instead
FOLLOWED = [n for n in NAMES if unquote(n) == n]


@pytest.mark.parametrize("name", FOLLOWED)
def test_every_page_renders_a_type_of_each_accepted_class(
    client: TestClient, conn: Conn, name: str
) -> None:
    failed = fail_job(conn, name)
    db.enqueue(conn, SCHEMA, NewJob(name, {}))
    db.declare_schedules(conn, SCHEMA, [Schedule.make("tick", type=name, cron="0 3 * * *")])
    db.register_supervisor(
        conn, SCHEMA, id="h:1:0", host="host-1", pid=4242, procs=1, types=[name],
        started_at=db.db_now(conn, SCHEMA),
        children=[{"index": 0, "pid": 4243, "state": "busy", "job_id": str(failed),
                   "job_type": name, "jobs_done": 7}],
    )  # fmt: skip
    pages = ["/", "/jobs", f"/jobs?state=failed&type={_q(name)}", f"/jobs/{failed}", "/workers",
             "/schedules"]  # fmt: skip
    for path in pages:
        page = client.get(path)
        assert page.status_code == 200, (path, page.text[:300])
        assert _escaped(name) in page.text, path
        if _escaped(name) != name:
            assert name not in page.text, f"{path}: unescaped"
        if path != "/jobs?state=failed&type=" + _q(name):
            link = _type_links(page.text).get(name)
            assert link is not None, f"{path}: no link to the type's page"
            # the link, followed as a browser does, is the type's own page
            type_page = client.get(link)
            assert type_page.status_code == 200, (path, link)
            assert f"<h1>Type <code>{_escaped(name)}</code>" in type_page.text, link
            assert urlsplit(link).query == "" and urlsplit(link).fragment == ""
    # the type's page, its window links, and an action from it back to it
    (link,) = {_type_links(client.get("/").text)[name]}
    type_page = client.get(link)
    windows = re.findall(r'<a class="window" href="([^"]+)">', type_page.text)
    assert windows and all(client.get(html.unescape(w)).status_code == 200 for w in windows)
    token = csrf_of(client, link)
    back = re.search(r'name="back" value="([^"]+)"', type_page.text)
    assert back is not None
    done = client.post(
        "/types/pause",
        data={"csrf": token, "type": name, "back": html.unescape(back.group(1))},
        follow_redirects=False,
    )
    assert done.status_code == 303
    back_to = unquote(urlsplit(done.headers["location"]).path)
    assert back_to == unquote(urlsplit(link).path) == f"/types/{name}"
    assert [c.type for c in db.type_controls(conn, SCHEMA) if c.paused] == [name]
    assert client.get(done.headers["location"]).status_code == 200


def _escaped(text: str) -> str:
    """As Jinja escapes it."""
    return str(markupsafe.escape(text))


def _q(text: str) -> str:
    return quote(text, safe="")


@pytest.mark.parametrize(
    "back", ["//evil.example/", "/\\evil.example/", "https://evil.example/", "/\r\nX: y", ""]
)
def test_a_way_back_to_another_site_is_not_taken(client: TestClient, back: str) -> None:
    token = csrf_of(client, "/jobs")
    done = client.post(
        "/types/pause", data={"csrf": token, "type": "t", "back": back}, follow_redirects=False
    )
    assert (done.status_code, done.headers["location"]) == (303, "/")


@pytest.mark.parametrize(
    ("search", "says"),
    [
        pytest.param("key\x00with a NUL", "holds a NUL character", id="nul-in-unique-key"),
        pytest.param('payload.a = "\\u0000"', "holds a NUL character", id="nul-escape"),
        pytest.param('payload.a = {"\\u0000": 1}', "holds a NUL character", id="nul-key"),
        pytest.param('payload.a = "\\ud800"', "holds a lone surrogate", id="lone-surrogate"),
        pytest.param("payload.a = NaN", "NaN has no JSON form", id="nan"),
        pytest.param("payload.a = -Infinity", "-Infinity has no JSON form", id="-infinity"),
        pytest.param("payload.a = Infinity", "Infinity has no JSON form", id="infinity"),
        pytest.param("payload.a = 1e999", "a number out of range", id="1e999"),
        pytest.param("payload.a = [-1e999]", "a number out of range", id="nested-1e999"),
        pytest.param("payload.a = " + "[" * 5000 + "]" * 5000, "nested too deep", id="deep"),
        pytest.param("payload.a = " + "[" * 150 + "]" * 150, "nested too deep", id="deep-json"),
    ],
)
def test_a_search_postgresql_cannot_take_answers_400_with_a_line(
    client: TestClient, conn: Conn, search: str, says: str
) -> None:
    fail_job(conn)
    page = client.get("/jobs", params={"q": search})
    assert page.status_code == 400, page.text[-300:]
    found = re.search(r'<p class="flash error" id="jobs-error">([^<]*)</p>', page.text)
    assert found is not None and says in html.unescape(found.group(1)), page.text[-500:]
    assert found.group(1).startswith("invalid search: ")
    assert client.get("/jobs", params={"q": "payload.a = 1e308"}).status_code == 200
