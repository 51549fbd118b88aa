"""The dashboard in a real Chromium (Debian's package, driven by Playwright), served by the real
`dashboard` command (HTTP Basic from PGQ_DASHBOARD_USER and PGQ_DASHBOARD_PASSWORD, which the
browser sends), with a real supervisor running the jobs. One browser session for all the
checks: every page against known jobs, the counts shown equal the database's, a failed job's
traceback, pause a type and see none of its jobs start, retry and see the job pending, then
succeeded without a reload (the live update). Screenshots go to a temporary directory, or to
docs/img/ with PGQ_SCREENSHOTS=docs (how the docs' images are refreshed: a test run leaves the
checkout as it found it).

./scripts/test leaves this file out, saying so in one line, where no Chromium is found; run
directly without one it fails (PGQ_CHROMIUM names another executable)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

import pgq_supervisor as pgq
from tests.acceptance.apps.pgq_test_app import GATES_DDL
from tests.acceptance.conftest import Conn
from tests.acceptance.dashboard import Dashboard
from tests.support.processes import APP, FAST, ROOT, Supervisor, count
from tests.support.waiting import wait_for

CHROMIUM = os.environ.get("PGQ_CHROMIUM", "/usr/bin/chromium")
DOCS = ROOT / "docs"
# where the screenshots go: docs/img/ only when asked for (PGQ_SCREENSHOTS=docs)
IMG = (
    DOCS / "img"
    if os.environ.get("PGQ_SCREENSHOTS") == "docs"
    else Path(tempfile.gettempdir()) / "pgq-screenshots"
)
# the dashboard's actions need credentials: the command's HTTP Basic, which the browser sends
USER, PASSWORD = "oncall", "s3cret"


@pytest.fixture
def page() -> Iterator[Page]:
    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            http_credentials={"username": USER, "password": PASSWORD},
        )
        context.set_default_timeout(20_000)
        yield context.new_page()
        browser.close()


def _db_counts(db: Conn) -> dict[tuple[str, str], int]:
    """(type, column) -> count, as the overview's columns define them."""
    rows = db.execute(
        "SELECT type,"
        " CASE WHEN state <> 'pending' THEN state::text"
        "      WHEN waiting_on > 0 THEN 'waiting'"
        "      WHEN start_at <= now() THEN 'ready' ELSE 'delayed' END, count(*)"
        " FROM pgq.job GROUP BY 1, 2"
    ).fetchall()
    return {(str(t), str(c)): int(str(n)) for t, c, n in rows}


def test_the_dashboard_in_chromium(dsn: str, db: Conn, sups: list[Supervisor], page: Page) -> None:
    db.execute(GATES_DDL)
    dash = Dashboard(dsn, env={"PGQ_DASHBOARD_USER": USER, "PGQ_DASHBOARD_PASSWORD": PASSWORD})
    try:
        _run(dsn, db, sups, page, dash)
    finally:
        dash.close()


def _run(dsn: str, db: Conn, sups: list[Supervisor], page: Page, dash: Dashboard) -> None:
    sup = Supervisor(dsn, APP, "--procs", "2", "--types", "flaky,noop", *FAST)
    sups.append(sup)
    sup.wait_ready(2)
    # known jobs: 6 noop succeed, a flaky one fails, 2 noop wait an hour, 1 is cancelled
    failed = pgq.enqueue(db, "flaky", {"note": "<b>not bold</b>"})
    pgq.enqueue_bundle(db, "batch", [pgq.NewJob("noop", {"i": i}) for i in range(6)])
    in_an_hour = datetime.now(UTC) + timedelta(hours=1)
    later = [pgq.enqueue(db, "noop", {}, start_at=in_an_hour) for _ in range(3)]
    pgq.cancel_job(db, later[0])
    wait_for(
        "6 noop succeeded and the flaky job failed",
        lambda: count(dsn, "state = 'succeeded'") == 6 and count(dsn, "state = 'failed'") == 1,
    )
    wait_for("the dashboard answering", dash.up)

    # every page; the overview's counts are the database's
    page.goto(dash.url + "/")
    expected = _db_counts(db)
    for (type_, column), n in expected.items():
        cell = page.locator(f'tr[data-type="{type_}"] td[data-col="{column}"]')
        expect(cell).to_have_text(str(n))
    expect(page.locator("#hour-succeeded")).to_have_text("6")
    expect(page.locator("#hour-failed")).to_have_text("1")
    expect(page.locator("#failure-rate")).to_have_text("14.3 %")
    assert page.locator("svg.chart rect").count() >= 1
    IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMG / "dashboard-overview.png"), full_page=True)

    page.click("text=Jobs")
    expect(page.locator("table#jobs tbody tr")).to_have_count(count(dsn))
    page.select_option("select[name=state]", "failed")
    page.click("button:text('Filter')")
    expect(page.locator("table#jobs tbody tr")).to_have_count(1)
    page.click(f'tr[data-id="{failed}"] .sid a')

    # the failed job: its traceback, its payload shown as text
    expect(page.locator("#job-state")).to_have_text("failed")
    expect(page.locator("#last-traceback")).to_contain_text("RuntimeError: gate closed")
    expect(page.locator("#payload")).to_contain_text('"<b>not bold</b>"')
    page.screenshot(path=str(IMG / "dashboard-job.png"), full_page=True)
    job_url = page.url

    page.click("text=Bundles")
    expect(page.locator("table#bundles tbody tr")).to_have_count(1)
    expect(page.locator("table#bundles")).to_contain_text("6 / 6")
    page.click("text=Workers")
    expect(page.locator(f'section.supervisor[data-pid="{sup.pid}"] table.children tbody tr'))\
        .to_have_count(2)  # fmt: skip
    page.click("text=Schedules")
    expect(page.locator("h1")).to_have_text("Schedules")

    # pause flaky, open its gate, retry: it waits, pending, while the supervisor runs others
    page.click("text=Overview")
    page.locator('tr[data-type="flaky"]').get_by_role("button", name="Pause").click()
    expect(page.locator(".flash.ok")).to_contain_text("paused flaky")
    db.execute("INSERT INTO gates (job_id, step) VALUES (%s, 0)", (failed,))
    page.goto(job_url)
    page.get_by_role("button", name="Retry").click()
    expect(page.locator(".flash.ok")).to_contain_text("pending again")
    expect(page.locator("#job-state")).to_have_text("pending")
    probe = pgq.enqueue(db, "noop", {"probe": True})
    wait_for("a noop job enqueued after the pause ran", lambda: count(
        dsn, f"id = '{probe}' AND state = 'succeeded'"))  # fmt: skip
    assert count(dsn, f"id = '{failed}' AND state = 'pending' AND started_at IS NULL") == 1
    expect(page.locator("#job-state")).to_have_text("pending")

    # resume in another tab: the job page follows the job to succeeded without a reload
    other = page.context.new_page()
    other.goto(dash.url + "/")
    other.locator('tr[data-type="flaky"]').get_by_role("button", name="Resume").click()
    expect(other.locator(".flash.ok")).to_contain_text("resumed flaky")
    expect(page.locator("#job-state")).to_have_text("succeeded")
    assert page.url == job_url
    expect(page.locator("#result")).to_contain_text('"gate": "open"')
