"""The dashboard's deeper pages and actions over HTTP (Starlette's TestClient, a real
database): a type's page, a bundle's, bulk actions and their confirmation, the search by
payload, schedules' run now and pause, waiting jobs, attempt numbers as the CLI's. The browser
tests are in tests/acceptance/test_web_browser.py."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from starlette.testclient import TestClient

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobId, JobState, NewJob
from pgq_supervisor.periodic import Schedule
from pgq_supervisor.supervisor.maintenance.scheduler import Scheduler
from tests.integration.test_admin_cli import cli, ok
from tests.integration.test_web import csrf_of, fail_job
from tests.support.db import SCHEMA, claim, claim_one, count_rows, get
from tests.support.web import dashboard_client


@pytest.fixture
def client(dsn: str) -> Iterator[TestClient]:
    with dashboard_client(dsn, open_actions=True) as c:
        yield c


def _cell(html: str, id_: str) -> str:
    found = re.search(rf'id="{id_}"[^>]*>(.*?)</', html, re.S)
    assert found is not None, f"no #{id_} on the page"
    return found.group(1).strip()


def _finish(conn: Conn, type_: str, seconds: list[float], *, ago: str = "10 minutes") -> None:
    """Jobs of `type_` that succeeded `ago`, each having run for one of `seconds`."""
    for s in seconds:
        conn.execute(
            "INSERT INTO pgq.job (type, payload, state, started_at, stopped_at, worker_id)"
            " VALUES (%s, '{}', 'succeeded', now() - %s::interval - make_interval(secs => %s),"
            " now() - %s::interval, 'w')",
            (type_, ago, s, ago),
        )


def test_a_type_page_shows_its_window_percentiles_limits_and_schedules(
    client: TestClient, conn: Conn
) -> None:
    _finish(conn, "mail", [float(i) for i in range(1, 101)])  # 1..100 s, ten minutes ago
    _finish(conn, "mail", [500.0], ago="3 hours")  # in 24h, not in 1h
    fail_job(conn, "mail")
    fail_job(conn, "other")
    db.sync_rates(conn, SCHEMA, ["mail"], {"mail": (10, 60.0)})
    db.sync_limits(conn, SCHEMA, ["mail"], {"mail": (4, 2)})
    db.declare_schedules(conn, SCHEMA, [Schedule.make("digest", type="mail", cron="0 7 * * *")])
    pgq.pause(conn, "mail", reason="SMTP down")

    hour = client.get("/types/mail").text
    assert _cell(hour, "type-succeeded") == "100" and _cell(hour, "type-failed") == "1"
    assert _cell(hour, "type-failure-rate") == "1.0 %"
    # the failed job ran for an instant: 101 run times, 0 then 1..100 s
    assert 'data-p="50">50 s<' in hour and 'data-p="99">1 min 39 s<' in hour
    assert 'data-p="95">1 min 35 s<' in hour
    assert "10 starts per 60 s" in _cell(hour, "limit-rate")
    assert _cell(hour, "limit-global").startswith("4 at once")
    assert _cell(hour, "limit-key").startswith("2 at once per concurrency_key")
    assert 'data-schedule="digest"' in hour and _cell(hour, "type-paused") == "paused"
    assert "SMTP down" in hour
    assert len(re.findall(r'<rect [^>]*class="succeeded"', hour)) == 1  # one minute's bar

    day = client.get("/types/mail?window=24h").text
    assert _cell(day, "type-succeeded") == "101"
    assert len(re.findall(r'<rect [^>]*class="succeeded"', day)) == 2
    assert '<strong class="window">24h</strong>' in day
    week = client.get("/types/mail?window=7d").text
    assert _cell(week, "type-succeeded") == "101"

    bad = client.get("/types/mail?window=1y")
    assert (
        bad.status_code == 404 and "invalid window: &#39;1y&#39; (one of 1h, 24h, 7d)" in bad.text
    )
    empty = client.get("/types/nothing-here").text
    assert _cell(empty, "type-succeeded") == "0" and 'data-p="50">-<' in empty
    # the overview links each type to its page
    assert 'href="/types/mail"' in client.get("/").text


def test_a_bundle_page_lists_its_jobs_and_an_id_search_opens_it(
    client: TestClient, conn: Conn
) -> None:
    bundle = pgq.enqueue_bundle(conn, "import", [NewJob("row", {"i": i}) for i in range(3)])
    (first,) = claim(conn, ["row"])
    db.succeed(conn, SCHEMA, first.lease, [(first.id, None)])
    page = client.get(f"/bundles/{bundle.id}")
    assert page.status_code == 200
    progress = page.text.split('id="bundle-progress"')[1].split("</td>")[0]
    assert '<span class="num">1 / 3</span>' in progress
    assert len(re.findall(r'<tr data-id="', page.text)) == 3
    states = page.text.split('id="bundle-states"')[1].split("</td>")[0]
    assert "pending</span> 2" in states and "succeeded</span> 1" in states
    found = client.get(f"/jobs?q={bundle.id}", follow_redirects=False)
    assert found.status_code == 303 and found.headers["location"].endswith(f"/bundles/{bundle.id}")
    assert f'href="/bundles/{bundle.id}"' in client.get("/bundles").text
    assert f'href="/bundles/{bundle.id}"' in client.get(f"/jobs/{first.id}").text
    assert client.get("/bundles/01234567-89ab-cdef-0123-456789abcdef").status_code == 404
    # a completed bundle names its completion job, however many bundles came after it
    done = pgq.enqueue_bundle(conn, "import", [NewJob("one", {})], on_complete="report")
    (member,) = claim(conn, ["one"])
    db.succeed(conn, SCHEMA, member.lease, [(member.id, None)])
    for _ in range(101):  # more than the Bundles page lists
        db.insert_bundle(conn, SCHEMA, "later", 0, None, None)
    page = client.get(f"/bundles/{done.id}").text
    completion = page.split('id="bundle-completion">')[1].split("</td>")[0]
    assert "report" in completion and "not yet" not in completion


def test_a_bundles_completion_is_looked_up_only_once_complete_and_found_after_changes(
    conn: Conn,
) -> None:
    members = [NewJob("a", {}), NewJob("b", {})]
    bundle = pgq.enqueue_bundle(conn, "import", members, on_complete="report")
    a, b = db.jobs_page(conn, SCHEMA, bundle_id=bundle.id, limit=5)

    def completions() -> list[JobId]:
        found = conn.execute("SELECT id FROM pgq.job WHERE type = 'report' ORDER BY id")
        return [JobId(r[0]) for r in found.fetchall()]

    def shown() -> JobId | None:
        link = db.bundle_completion(conn, SCHEMA, db.get_bundle(conn, SCHEMA, bundle.id))
        return None if link is None else link.id

    assert shown() is None
    db.cancel(conn, SCHEMA, a.id)
    db.cancel(conn, SCHEMA, b.id)
    assert shown() == completions()[0]
    # retried, a member runs again: the last round's completion job is not this round's
    assert db.reset(conn, SCHEMA, a.id, force=False) is None
    assert shown() is None
    db.cancel(conn, SCHEMA, a.id)
    (_, second) = completions()
    assert shown() == second
    # a change after it (a member deleted) moves the bundle's updated_at past the job
    assert db.delete_job(conn, SCHEMA, b.id)
    assert shown() == second
    conn.execute("UPDATE pgq.job_bundle SET updated_at = updated_at + interval '1 hour'")
    assert shown() == second


def test_bulk_actions_ask_first_then_act_on_each_job_that_fits(
    client: TestClient, conn: Conn
) -> None:
    failed = [fail_job(conn) for _ in range(2)]
    running = db.enqueue(conn, SCHEMA, NewJob("r", {}))
    claim_one(conn, "r")
    token = csrf_of(client, "/jobs")
    form = [("csrf", token), ("action", "retry"), ("back", "/jobs?state=failed")]
    form += [("id", str(i)) for i in (*failed, running)]
    asked = client.post("/jobs/bulk", data=_encode(form))
    assert asked.status_code == 200 and "Retry the 3 selected jobs?" in asked.text
    assert count_rows(conn, where="state = 'failed'") == 2  # nothing yet
    assert asked.text.count('name="id"') == 3 and 'name="confirmed" value="1"' in asked.text

    done = client.post("/jobs/bulk", data=_encode([*form, ("confirmed", "1")]))
    assert done.url.path == "/jobs" and done.url.query == b"state=failed"  # back where it was
    assert "2 jobs retried, 1 skipped" in done.text
    assert [get(conn, i).state for i in failed] == [JobState.PENDING] * 2
    assert get(conn, running).state is JobState.RUNNING

    form = [("csrf", token), ("action", "cancel"), ("confirmed", "1")]
    done = client.post("/jobs/bulk", data=_encode(form + [("id", str(i)) for i in failed]))
    assert "2 jobs cancelled" in done.text
    form = [("csrf", token), ("action", "delete"), ("confirmed", "1")]
    done = client.post("/jobs/bulk", data=_encode(form + [("id", str(i)) for i in failed]))
    assert "2 jobs deleted" in done.text and count_rows(conn) == 1

    nothing = client.post("/jobs/bulk", data=_encode([("csrf", token), ("action", "delete")]))
    assert "no job selected" in nothing.text
    unknown = client.post("/jobs/bulk", data=_encode([("csrf", token), ("action", "drop")]))
    assert unknown.status_code == 404
    # the back field never leads off the dashboard
    form = [("csrf", token), ("action", "delete"), ("id", str(running)), ("confirmed", "1"),
            ("back", "//evil.example/")]  # fmt: skip
    off = client.post("/jobs/bulk", data=_encode(form), follow_redirects=False)
    assert off.headers["location"] == "/jobs"


def _encode(form: list[tuple[str, str]]) -> dict[str, list[str]]:
    """A form with repeated fields, as TestClient takes it."""
    fields: dict[str, list[str]] = {}
    for k, v in form:
        fields.setdefault(k, []).append(v)
    return fields


def test_search_by_payload_field_and_what_it_says_of_a_bad_one(
    client: TestClient, conn: Conn
) -> None:
    user_42 = db.enqueue(conn, SCHEMA, NewJob("t", {"user_id": 42, "kind": "a"}))
    user_7 = db.enqueue(conn, SCHEMA, NewJob("t", {"user_id": 7, "meta": {"team": "x y"}}))
    text_42 = db.enqueue(conn, SCHEMA, NewJob("t", {"user_id": "42"}))

    def listed(q: str) -> set[str]:
        page = client.get("/jobs", params={"q": q})
        assert page.status_code == 200, page.text
        return set(re.findall(r'<tr data-id="([0-9a-f-]+)"', page.text))

    assert listed("payload.user_id = 42") == {str(user_42)}
    assert listed('payload.user_id="42"') == {str(text_42)}
    assert listed("payload.meta.team = x y") == {str(user_7)}  # a bare word is text
    assert listed("payload.user_id = 43") == set()
    bad = client.get("/jobs", params={"q": "payload.user_id ="})
    assert bad.status_code == 400 and "has no value after" in bad.text


def test_a_payload_search_no_index_serves_is_cut_short_with_advice(conn: Conn) -> None:
    conn.execute(
        "INSERT INTO pgq.job (type, payload) SELECT 't', jsonb_build_object('g', g)"
        " FROM generate_series(1, 200000) g"
    )
    with pytest.raises(db.SearchTimedOut, match=r"took over 0\.001 s"):
        db.jobs_page(conn, SCHEMA, payload='{"g": -1}', time_limit=0.001)
    # the connection is usable after: the limit was the transaction's only
    assert db.jobs_page(conn, SCHEMA, payload='{"g": 5}', limit=1)[0].type == "t"


def test_schedules_show_next_run_and_run_now_pause_resume(
    client: TestClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    every = Schedule.make("tick", type="t", every=timedelta(hours=1), payload={"n": 1})
    db.declare_schedules(conn, SCHEMA, [every])
    page = client.get("/schedules").text
    row = page.split('data-schedule="tick"')[1].split("</tr>")[0]
    now = db.db_now(conn, SCHEMA)
    assert every.next_tick(now).strftime("%Y-%m-%d %H:%M:%S") in row
    token = csrf_of(client, "/schedules")

    done = client.post("/schedules/run", data={"csrf": token, "name": "tick"})
    assert "enqueued, due now" in done.text and done.url.path == "/schedules"
    (job,) = db.list_jobs(conn, SCHEMA, state=JobState.PENDING, type_=None, limit=5)
    assert job.payload == {"n": 1} and job.origin == "periodic:tick (run now)"

    done = client.post("/schedules/pause", data={"csrf": token, "name": "tick"})
    assert "paused schedule tick" in done.text
    row = done.text.split('data-schedule="tick"')[1].split("</tr>")[0]
    assert "paused" in row and ">Resume<" in row
    # a due tick of a paused schedule enqueues nothing, and is not reported as missed
    conn.execute("UPDATE pgq.schedule SET last_tick = now() - interval '3 hours'")
    scheduler = Scheduler(SCHEMA, [every])
    with caplog.at_level(logging.INFO, logger="pgq_supervisor"):
        paused = scheduler.run_once(conn)
    assert paused.enqueued == () and paused.next_in is not None and paused.next_in <= 3600
    assert not [r for r in caplog.records if "missed" in r.getMessage()]
    done = client.post("/schedules/resume", data={"csrf": token, "name": "tick"})
    assert "resumed schedule tick" in done.text
    (record,) = db.list_schedules(conn, SCHEMA)
    assert record.paused_at is None and record.last_tick is not None
    assert record.last_tick >= now  # the ticks missed while paused are skipped
    assert scheduler.run_once(conn).enqueued == ()
    assert count_rows(conn) == 1
    unknown = client.post("/schedules/run", data={"csrf": token, "name": "nope"})
    assert "no schedule named nope" in unknown.text


def test_run_now_of_a_schedule_without_a_stored_payload_enqueues_null_and_errors_flash(
    client: TestClient, conn: Conn
) -> None:
    # declared before schema 15: no payload until a supervisor declares it again
    db.declare_schedules(conn, SCHEMA, [Schedule.make("old", type="t", cron="0 7 * * *")])
    conn.execute("UPDATE pgq.schedule SET payload = NULL")
    token = csrf_of(client, "/schedules")
    done = client.post("/schedules/run", data={"csrf": token, "name": "old"})
    assert done.status_code == 200 and "enqueued, due now" in done.text
    (job,) = db.list_jobs(conn, SCHEMA, state=JobState.PENDING, type_=None, limit=5)
    assert job.payload is None and job.origin == "periodic:old (run now)"
    # a database error while enqueuing is one flash message on the page, not a 500
    conn.execute(
        "CREATE FUNCTION pgq.refuse() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'no jobs today'; END$$"
    )
    conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON pgq.job EXECUTE FUNCTION pgq.refuse()")
    refused = client.post("/schedules/run", data={"csrf": token, "name": "old"})
    assert refused.status_code == 200 and refused.url.path == "/schedules"
    assert "no jobs today" in refused.text
    assert count_rows(conn) == 1


def test_waiting_jobs_show_as_waiting_and_attempts_count_as_the_cli_counts(
    dsn: str, client: TestClient, conn: Conn
) -> None:
    first = db.enqueue(conn, SCHEMA, NewJob("t", {}))
    then = pgq.enqueue(conn, "t", {}, depends_on=[first])
    page = client.get("/jobs").text
    row = page.split(f'<tr data-id="{then}"')[1].split("</tr>")[0]
    assert 'class="state waiting"' in row
    assert _cell(client.get(f"/jobs/{then}").text, "waiting").startswith("on 1 unfinished")

    retried = db.enqueue(conn, SCHEMA, NewJob("u", {}, max_retry_count=3))
    job = claim_one(conn, "u")
    db.end_attempt(conn, SCHEMA, [job.id], error="boom", kind=AttemptKind.ERROR,
                   lease=job.lease)  # fmt: skip
    shown = _cell(client.get(f"/jobs/{retried}").text, "attempt")
    text = ok(cli(dsn, "show", str(retried)))
    (line,) = [x for x in text.splitlines() if x.startswith("attempt ")]
    assert shown == "2 of 4" and line.split(None, 1)[1].strip() == shown
    listed = client.get("/jobs").text.split(f'<tr data-id="{retried}"')[1].split("</tr>")[0]
    assert ">2/4<" in listed


def test_the_job_page_says_why_a_job_option_holds_a_job_back(
    client: TestClient, conn: Conn
) -> None:
    """The `held back` line of `show` is on the job page too (an ordered key's second job)."""
    first, second = (pgq.enqueue(conn, "t", {"n": n}, ordered_key="account:42") for n in (1, 2))
    page = client.get(f"/jobs/{second}").text
    assert _cell(page, "held-back") == (
        "ordered (key &#39;account:42&#39;): waits for the earlier jobs of its key"
    )
    assert 'id="held-back"' not in client.get(f"/jobs/{first}").text  # the key's head


def test_the_overview_and_a_type_page_name_the_pending_types_no_live_supervisor_serves(
    client: TestClient, conn: Conn
) -> None:
    """Issue 36: a misspelt type is not shown as ordinary pending work."""
    pgq.enqueue_many(conn, [NewJob("gret"), NewJob("gret"), NewJob("greet")])
    page = client.get("/").text
    assert 'aria-label="unserved types"' in page
    assert "No live supervisor is registered" in page
    db.register_supervisor(
        conn, SCHEMA, id="a", host="h", pid=1, procs=1, types=["greet", "resize"],
        started_at=db.db_now(conn, SCHEMA), children=[],
    )  # fmt: skip
    page = client.get("/").text
    banner = page[
        page.index('id="unserved"') : page.index("</section>", page.index('id="unserved"'))
    ]
    assert '<a href="/types/gret">gret</a>: 2 pending jobs' in banner
    assert '(did you mean <a href="/types/greet">greet</a>?)' in banner
    assert "Served: greet, resize (1 live supervisor)." in banner
    assert "greet</a>: " not in banner  # the served type is not named unserved

    overview: str = page

    def row(type_: str) -> str:
        start = overview.index(f'<tr data-type="{type_}">')
        return overview[start : overview.index("</tr>", start)]

    assert ">unserved</span>" in row("gret") and ">unserved</span>" not in row("greet")
    typo = client.get("/types/gret").text
    said = typo[
        typo.index('id="type-unserved"') : typo.index("</p>", typo.index('id="type-unserved"'))
    ]
    assert "2 pending jobs, and no live supervisor serves this type" in said
    assert 'did you mean <a href="/types/greet">greet</a>?' in said
    assert "served: greet, resize (1 live supervisor)" in said
    assert 'id="type-unserved"' not in client.get("/types/greet").text
    # its row goes stale (past 3 x the heartbeat): it serves nothing
    conn.execute("UPDATE pgq.supervisor SET seen_at = now() - interval '1 hour'")
    assert "No live supervisor is registered" in client.get("/").text
    assert "no live supervisor is registered" in client.get("/types/greet").text
