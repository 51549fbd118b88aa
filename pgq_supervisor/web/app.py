"""The dashboard's ASGI app: pages, actions, and what guards the actions.

    GET  /                      overview: per type counts, throughput, pauses and rates
    GET  /jobs                  jobs, newest first, by keyset; filters state, type, time, search
    GET  /jobs/{id}             one job: payload, result, progress, attempts, bundle, dependencies
    GET  /types/{type}          one type: charts over ?window=1h|24h|7d, run times, limits
    GET  /bundles  /bundles/{id}  /workers  /schedules
    POST /jobs/{id}/retry | cancel | delete
    POST /jobs/bulk                              (fields `action`, `id` once per job)
    POST /types/retry-failed | pause | resume      (form field `type`)
    POST /schedules/run | pause | resume           (form field `name`)

Every request asks `authorize(request, action)` first (action "view" for a page, else the
action's name, see ACTIONS): False answers 403 and changes nothing. Actions are POST only; one
whose `Origin` (or `Referer`) names another origin, or whose `Sec-Fetch-Site` is `cross-site`,
is refused, and each carries a CSRF token the server signed, bound to a SameSite=Strict cookie
and to the request's credentials (csrf.py). These stop other sites' forms, not a client that
reads a page first, so actions need authentication: without an `authorize` (or an explicit
`allow_unauthenticated_actions=True`, logged as a WARNING) the dashboard is read-only. Read-only
(that, or `read_only=True`), no action is shown and each is answered 403. A destructive action
(cancel, delete, retry all failed, any bulk action) is confirmed first: posted without
`confirmed=1` it answers a page that asks, whose button posts it again confirmed (static/
actions.js asks in a dialog instead). An action redirects (303) to the page it came from with a
one-line message, kept in a cookie for the next page.

Every response (pages, static files, errors) says it may not be framed nor sniffed (headers.py);
the static files are behind the same `authorize` as the pages.

Live updates are short polls: live.js asks for the page's live part every 2 s with the ETag it
has, and the server answers 304 when nothing changed (docs/dashboard.md says why not SSE).

The app reads through a psycopg_pool.ConnectionPool (made from a DSN, or the caller's own) in
Starlette's thread pool. Each checkout turns off prepared statements for its use, so each query
is planned with its values: the jobs page's optional filters then fold away and it keeps to
its indexes.
"""

from __future__ import annotations

import logging

import jinja2
from psycopg_pool import ConnectionPool
from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from pgq_supervisor import db, jobs
from pgq_supervisor.web.actions import Dashboard
from pgq_supervisor.web.csrf import Csrf
from pgq_supervisor.web.filters import FILTERS, duration
from pgq_supervisor.web.handlers import ACTIONS, HERE, Action, Authorize, Refused, Store
from pgq_supervisor.web.headers import SecurityHeaders

__all__ = ["ACTIONS", "Action", "Authorize", "Refused", "create_app"]

log = logging.getLogger(__name__)

READ_ONLY = "this dashboard is read-only"
NO_AUTH = (
    "this dashboard is read-only: actions need authentication (an authorize callable, or"
    " PGQ_DASHBOARD_USER and PGQ_DASHBOARD_PASSWORD for the dashboard command) or"
    " allow_unauthenticated_actions=True (--allow-unauthenticated-actions)"
)


class _Dashboard(Starlette):
    def build_middleware_stack(self) -> ASGIApp:
        # outside Starlette's own error handling, so that a 500 has the headers too
        return SecurityHeaders(super().build_middleware_stack())


def create_app(
    dsn_or_pool: str | ConnectionPool,
    *,
    authorize: Authorize | None = None,
    read_only: bool = False,
    allow_unauthenticated_actions: bool = False,
    schema: str = db.DEFAULT_SCHEMA,
    stale_after: float | None = None,
    secret: str | bytes | None = None,
) -> Starlette:
    """The dashboard as an ASGI app over `schema`. `dsn_or_pool`: a DSN (the app makes and
    closes its own small pool) or the caller's psycopg_pool.ConnectionPool (left open).
    `authorize(request, action)` is asked on every request (see ACTIONS). Without it every
    page is open and the dashboard is read-only, unless `allow_unauthenticated_actions=True`
    opens the actions to anyone who can reach it (logged as a WARNING). `read_only`: no action
    is shown, each is refused with 403, whatever else is given. `stale_after`: seconds without
    a refresh after which a supervisor's row is stale (Workers page) and serves nothing; None:
    three of the default heartbeat_interval's (jobs.stale_after; the `dashboard` command passes
    three of the configured one's).
    `secret` (16 bytes or more) signs the CSRF tokens: give every replica behind one address
    the same; without it each process makes a random one (ValueError if too short)."""
    refusal = None  # why actions are off, if they are
    if read_only:
        refusal = READ_ONLY
    elif authorize is None and not allow_unauthenticated_actions:
        refusal = NO_AUTH
    elif authorize is None:
        log.warning(
            "dashboard actions (retry, cancel, delete, pause, resume, run now) are open to anyone"
            " who can reach it: no authentication, allow_unauthenticated_actions is on"
        )
    csrf = Csrf(secret)  # first: a bad secret is refused before any pool is made
    store = Store(dsn_or_pool, schema)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(FILTERS)
    env.globals["duration"] = duration
    window = jobs.stale_after() if stale_after is None else stale_after
    dash = Dashboard(store, env, authorize, refusal, window, csrf)
    routes = [
        Route("/", dash.overview, name="overview"),
        Route("/jobs", dash.jobs, name="jobs"),
        Route("/jobs/bulk", dash.bulk_action, methods=["POST"], name="bulk_action"),
        Route("/jobs/{job_id}", dash.job, name="job"),
        # GET: a payload or a result whole (the job page cuts it at display.SHOWN_CHARS)
        Route("/jobs/{job_id}/{part}.json", dash.job_body, name="job_body"),
        Route("/jobs/{job_id}/{action}", dash.job_action, methods=["POST"], name="job_action"),
        Route("/types/{action}", dash.type_action, methods=["POST"], name="type_action"),
        # a type may hold `/` (check_type_name): the rest of the path is the type
        Route("/types/{type:path}", dash.job_type, name="type"),
        Route("/bundles", dash.bundles, name="bundles"),
        Route("/bundles/{bundle_id}", dash.bundle, name="bundle"),
        Route("/workers", dash.workers, name="workers"),
        Route("/schedules", dash.schedules, name="schedules"),
        Route(
            "/schedules/{action}", dash.schedule_action, methods=["POST"], name="schedule_action"
        ),
        Mount("/static", dash.guarded(StaticFiles(directory=HERE / "static")), name="static"),
    ]
    app = _Dashboard(routes=routes)
    app.state.pgq_close = store.close  # for a caller that wants its pool closed
    return app
