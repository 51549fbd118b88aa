"""The dashboard's deeper pages in a real Chromium (Debian's package, driven by Playwright),
served by the real `dashboard` command with HTTP Basic (issue 25): a type's page and its
windows, bulk actions and the dialog that confirms them (dismissed: nothing changes), the
confirmation of a single cancel, short ids that do not wrap and copy the whole id, the type
filter, the payload search, a bundle's page, schedules' run now and pause, a waiting job, jobs
claimed but not started on their worker. The rows are written through the library into the
real database (no supervisor: what is shown is what the rows say).
Screenshots go where test_web_browser's go (docs/img/ with PGQ_SCREENSHOTS=docs).

Like test_web_browser.py, ./scripts/test leaves this file out where no Chromium is found."""

from __future__ import annotations

from datetime import timedelta

import psycopg
from playwright.sync_api import Dialog, Page, expect

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.jobs import AttemptKind, JobId, JsonValue, NewJob
from pgq_supervisor.periodic import Schedule
from tests.acceptance.conftest import Conn
from tests.acceptance.dashboard import Dashboard
from tests.acceptance.test_web_browser import IMG, PASSWORD, USER, page
from tests.support.db import claim
from tests.support.processes import count
from tests.support.waiting import wait_for

SCHEMA = "pgq"
__all__ = ["page"]  # the fixture, shared with test_web_browser.py


def _fail(conn: Conn, type_: str, payload: JsonValue) -> JobId:
    job_id = pgq.enqueue(conn, type_, payload, max_retry_count=0)
    (job,) = claim(conn, [type_], max_retry_count=0)
    db.end_attempt(conn, SCHEMA, [job.id], error="RuntimeError: SMTP refused",
                   kind=AttemptKind.ERROR, lease=job.lease)  # fmt: skip
    return job_id


def _history(conn: Conn) -> None:
    """A day of finished `mail` jobs (a minute apart), of known run times, one in ten failed."""
    conn.execute(
        "INSERT INTO pgq.job (type, payload, state, started_at, stopped_at, worker_id, error_msg)"
        " SELECT 'mail', jsonb_build_object('user_id', g), CASE WHEN g % 10 = 0 THEN 'failed'"
        " ELSE 'succeeded' END::pgq.job_state, now() - make_interval(mins => g, secs => g % 7),"
        " now() - make_interval(mins => g), 'w', CASE WHEN g % 10 = 0 THEN 'boom' END"
        " FROM generate_series(1, 1440) g"
    )


def test_the_dashboards_deeper_pages_in_chromium(dsn: str, db: Conn, page: Page) -> None:
    dash = Dashboard(dsn, env={"PGQ_DASHBOARD_USER": USER, "PGQ_DASHBOARD_PASSWORD": PASSWORD})
    try:
        IMG.mkdir(parents=True, exist_ok=True)
        _run(dsn, db, page, dash)
    finally:
        dash.close()


def _state(dsn: str, job_id: JobId) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT state::text FROM pgq.job WHERE id = %s", (job_id,)).fetchone()
    return str(row[0]) if row else "gone"


def _run(dsn: str, conn: Conn, page: Page, dash: Dashboard) -> None:
    _history(conn)
    failed = [_fail(conn, "mail", {"user_id": 42 + i}) for i in range(3)]
    first = pgq.enqueue(conn, "report", {"user_id": 7})
    waiting = pgq.enqueue(conn, "report", {}, depends_on=[first])
    bundle = pgq.enqueue_bundle(conn, "import", [NewJob("row", {"i": i}) for i in range(4)])
    db.sync_rates(conn, SCHEMA, ["mail"], {"mail": (100, 60.0)})
    db.sync_limits(conn, SCHEMA, ["mail"], {"mail": (8, 2)})
    db.declare_schedules(conn, SCHEMA, [
        Schedule.make("digest", type="mail", cron="0 7 * * *", payload={"digest": True}),
        Schedule.make("cleanup", type="report", every=timedelta(minutes=15)),
    ])  # fmt: skip
    # a child that runs one row job and holds two more it has not started
    in_hand, held_1, held_2 = claim(conn, ["row"], worker_id="h:1:0:ab", limit=3)
    db.register_supervisor(
        conn, SCHEMA, id="h:1", host="worker-host", pid=4242, procs=1,
        types=["mail", "report", "row"], started_at=db.db_now(conn, SCHEMA),
        children=[{"index": 0, "pid": 4243, "worker_id": "h:1:0:ab", "state": "busy",
                   "job_id": str(in_hand.id), "job_type": "row", "in_flight": 1, "held": 2,
                   "jobs_done": 12}],
    )  # fmt: skip
    wait_for("the dashboard answering", dash.up)

    # the overview links each type to its page: windows, percentiles, limits, schedules
    page.goto(dash.url + "/")
    page.locator('tr[data-type="mail"] a', has_text="mail").first.click()
    expect(page.locator("h1")).to_contain_text("mail")
    expect(page.locator("#limit-rate")).to_contain_text("100 starts per 60 s")
    expect(page.locator("#limit-global")).to_contain_text("8 at once")
    expect(page.locator('#type-schedules tr[data-schedule="digest"]')).to_be_visible()
    hour = int(page.locator("#type-succeeded").inner_text())
    assert 50 <= hour <= 60  # a job a minute, one in ten failed
    page.locator("#windows a", has_text="24h").click()
    expect(page.locator("#windows strong")).to_have_text("24h")
    # the minutes 1..1439 ago (the 1440th is just out), one in ten failed
    expect(page.locator("#type-succeeded")).to_have_text("1296")
    expect(page.locator("#type-failed")).to_have_text("146")  # 143, and the 3 just failed
    expect(page.locator('#durations td[data-p="50"]')).to_have_text("3.0 s")
    assert page.locator("#type-chart rect.failed").count() >= 40
    page.screenshot(path=str(IMG / "dashboard-type.png"), full_page=True)

    # the Jobs page: a type filter listing the types, short ids on one line, copy, durations
    page.goto(dash.url + "/jobs")
    options = page.locator("#type-filter option").all_inner_texts()
    assert {"mail", "report", "row"} <= set(options), options
    page.select_option("#type-filter", "report")
    page.click("button:text('Filter')")
    expect(page.locator("table#jobs tbody tr")).to_have_count(2)
    row = page.locator(f'tr[data-id="{waiting}"]')
    expect(row.locator(".state")).to_have_text("waiting")
    page.goto(dash.url + "/jobs")
    page.set_viewport_size({"width": 1024, "height": 800})
    sid = page.locator(f'tr[data-id="{failed[0]}"] .sid')
    expect(sid).to_have_attribute("title", str(failed[0]))
    lines = page.locator("table#jobs tbody tr .sid, table#jobs tbody tr .time").evaluate_all(
        "els => els.map(e => e.getClientRects().length)"
    )
    assert lines and set(lines) == {1}, lines  # every id and time on one line
    shown = page.locator("table#jobs tbody tr .sid a").all_inner_texts()
    assert len(set(shown)) == len(shown), shown  # ids made in one millisecond told apart
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=dash.url)
    sid.locator("button.copy").click()
    wait_for("the whole id copied", lambda: page.evaluate("navigator.clipboard.readText()")
             == str(failed[0]))  # fmt: skip
    duration = page.locator(f'tr[data-id="{failed[0]}"] td.duration').inner_text()
    assert duration.endswith("ms") or duration.endswith(" s"), duration
    page.set_viewport_size({"width": 1280, "height": 900})

    # search by a payload field
    page.fill('input[name="q"]', "payload.user_id = 43")
    page.click("button:text('Filter')")
    expect(page.locator("table#jobs tbody tr")).to_have_count(2)  # failed[1], history's #43
    expect(page.locator(f'tr[data-id="{failed[1]}"]')).to_be_visible()

    # bulk retry: the dialog dismissed changes nothing, accepted retries the ticked jobs
    page.select_option("#type-filter", "mail")
    page.fill('input[name="q"]', "")
    page.select_option("select[name=state]", "failed")
    page.click("button:text('Filter')")
    for job_id in failed[:2]:
        page.locator(f'tr[data-id="{job_id}"] input[name="id"]').check()
    page.screenshot(path=str(IMG / "dashboard-jobs.png"), full_page=False)
    asked: list[str] = []

    def dismiss(d: Dialog) -> None:
        asked.append(d.message)
        d.dismiss()

    page.once("dialog", dismiss)
    page.locator("#bulk button", has_text="Retry").click()
    wait_for("the confirmation dialog", lambda: bool(asked))
    assert asked == ["Retry the 2 selected jobs?"]
    assert [_state(dsn, j) for j in failed] == ["failed"] * 3
    page.once("dialog", lambda d: d.accept())
    page.locator("#bulk button", has_text="Retry").click()
    expect(page.locator(".flash.ok")).to_contain_text("2 jobs retried")
    assert [_state(dsn, j) for j in failed] == ["pending", "pending", "failed"]

    # a single cancel asks too
    page.goto(f"{dash.url}/jobs/{failed[0]}")
    page.once("dialog", lambda d: d.dismiss())
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator("#job-state")).to_have_text("pending")
    assert _state(dsn, failed[0]) == "pending"
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator(".flash.ok")).to_contain_text("cancelled")
    assert _state(dsn, failed[0]) == "cancelled"

    # a bundle's page, from the list
    page.goto(dash.url + "/bundles")
    page.locator(f'a[href$="/bundles/{bundle.id}"]').click()
    expect(page.locator("table#bundle-jobs tbody tr")).to_have_count(4)
    expect(page.locator("#bundle-progress")).to_contain_text("0 / 4")
    shown = page.locator("table#bundle-jobs .sid a").all_inner_texts()
    assert len(set(shown)) == 4, shown  # one enqueue_many's ids differ in their last digits
    page.screenshot(path=str(IMG / "dashboard-bundle.png"), full_page=True)

    # the worker holds two jobs it has not started: named on its row
    page.goto(dash.url + "/workers")
    held = page.locator('section.supervisor[data-pid="4242"] td.held .sid')
    expect(held).to_have_count(2)
    assert set(held.evaluate_all("els => els.map(e => e.title)")) == {
        str(held_1.id),
        str(held_2.id),
    }
    page.screenshot(path=str(IMG / "dashboard-workers.png"), full_page=True)

    # schedules: next run, run now, pause
    page.goto(dash.url + "/schedules")
    digest = page.locator('tr[data-schedule="digest"]')
    expect(digest.locator(".next-run")).to_contain_text(" 07:00:00")
    before = count(dsn, "type = 'mail' AND state = 'pending'")
    digest.get_by_role("button", name="Run now").click()
    expect(page.locator(".flash.ok")).to_contain_text("enqueued, due now")
    assert count(dsn, "type = 'mail' AND state = 'pending'") == before + 1
    page.locator('tr[data-schedule="cleanup"]').get_by_role("button", name="Pause").click()
    expect(page.locator('tr[data-schedule="cleanup"] .next-run')).to_contain_text("paused")
    expect(page.locator('tr[data-schedule="cleanup"]').get_by_role("button", name="Resume"))\
        .to_be_visible()  # fmt: skip
    page.screenshot(path=str(IMG / "dashboard-schedules.png"), full_page=True)
