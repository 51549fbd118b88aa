"""The dashboard's ASGI app: pages, actions, and what guards the actions.

    GET  /                      overview: per type counts, throughput, pauses and rates
    GET  /jobs                  jobs, newest first, by keyset; filters state, type, time, search
    GET  /jobs/{id}             one job: payload, result, progress, attempts, bundle, dependencies
    GET  /bundles  /workers  /schedules
    POST /jobs/{id}/retry | cancel | delete
    POST /types/retry-failed | pause | resume      (form field `type`)

Every request asks `authorize(request, action)` first (action "view" for a page, else the
action's name, see ACTIONS): False answers 403 and changes nothing. Actions are POST only and
carry a CSRF token, the double-submit kind: a random token in a SameSite=Strict cookie, echoed by
each form, compared in constant time. The token stops other sites' forms, not a client that
reads the cookie first, so actions need authentication: without an `authorize` (or an explicit
`allow_unauthenticated_actions=True`, logged as a WARNING) the dashboard is read-only. Read-only
(that, or `read_only=True`), no action is shown and each is answered 403. An action redirects
(303) to the page it came from with a one-line message, kept in a cookie for the next page.

Live updates are short polls: live.js asks for the page's live part every 2 s with the ETag it
has, and the server answers 304 when nothing changed (see the README for why not SSE).

The app reads through a psycopg_pool.ConnectionPool (made from a DSN, or the caller's own) in
Starlette's thread pool. Each checkout turns off prepared statements for its use, so each query
is planned with its values: the jobs page's optional filters then fold away and it keeps to
its indexes.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import secrets
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar
from urllib.parse import quote, unquote, urlencode

import jinja2
from psycopg_pool import ConnectionPool
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pgq_supervisor import db
from pgq_supervisor.db.health import read_health
from pgq_supervisor.errors import JobNotFound, PgqError
from pgq_supervisor.jobs import JobId, check_type_name
from pgq_supervisor.vacuum import MAX_TRANSACTION_AGE, Finding, diagnose
from pgq_supervisor.web import views

Action = Literal["view", "retry", "cancel", "delete", "retry_failed", "pause", "resume"]
ACTIONS: tuple[Action, ...] = (
    "view", "retry", "cancel", "delete", "retry_failed", "pause", "resume",
)  # fmt: skip
_JOB_ACTIONS: dict[str, Action] = {"retry": "retry", "cancel": "cancel", "delete": "delete"}
_TYPE_ACTIONS: dict[str, Action] = {
    "retry-failed": "retry_failed", "pause": "pause", "resume": "resume",
}  # fmt: skip
# authorize(request, action) -> bool (or an awaitable of one)
Authorize = Callable[[Request, Action], "bool | Awaitable[bool]"]

log = logging.getLogger(__name__)

READ_ONLY = "this dashboard is read-only"
NO_AUTH = (
    "this dashboard is read-only: actions need authentication (an authorize callable, or"
    " PGQ_DASHBOARD_USER and PGQ_DASHBOARD_PASSWORD for the dashboard command) or"
    " allow_unauthenticated_actions=True (--allow-unauthenticated-actions)"
)
CSRF_COOKIE = "pgq_csrf"
CSRF_FIELD = "csrf"
FLASH_COOKIE = "pgq_flash"
HERE = Path(__file__).resolve().parent
PAGE_SIZE = 50
T = TypeVar("T")


class _Db:
    """The pool, opened on first use (a mounted app gets no lifespan events), and the schema."""

    def __init__(self, source: str | ConnectionPool, schema: str) -> None:
        self.schema = schema
        self._own = isinstance(source, str)
        self._pool = (
            ConnectionPool(
                source,
                min_size=1,
                max_size=4,
                kwargs={"autocommit": True, "application_name": "pgq-dashboard"},
                open=False,
            )
            if isinstance(source, str)
            else source
        )
        self._lock = threading.Lock()
        self._opened = not self._own

    @contextmanager
    def connection(self) -> Iterator[db.Conn]:
        if not self._opened:
            with self._lock:
                if not self._opened:
                    self._pool.open(wait=True, timeout=10.0)
                    self._opened = True
        with self._pool.connection() as conn:
            before = conn.prepare_threshold
            conn.prepare_threshold = None
            try:
                yield conn
            finally:
                conn.prepare_threshold = before

    def close(self) -> None:
        if self._own and self._opened:
            self._pool.close()


def create_app(
    dsn_or_pool: str | ConnectionPool,
    *,
    authorize: Authorize | None = None,
    read_only: bool = False,
    allow_unauthenticated_actions: bool = False,
    schema: str = db.DEFAULT_SCHEMA,
    stale_after: float = 15.0,
) -> Starlette:
    """The dashboard as an ASGI app over `schema`. `dsn_or_pool`: a DSN (the app makes and
    closes its own small pool) or the caller's psycopg_pool.ConnectionPool (left open).
    `authorize(request, action)` is asked on every request (see ACTIONS). Without it every
    page is open and the dashboard is read-only, unless `allow_unauthenticated_actions=True`
    opens the actions to anyone who can reach it (logged as a WARNING). `read_only`: no action
    is shown, each is refused with 403, whatever else is given. `stale_after`: seconds without
    a heartbeat after which the Workers page marks a supervisor stale (3 x its
    heartbeat_interval, 5 s by default)."""
    refusal = None  # why actions are off, if they are
    if read_only:
        refusal = READ_ONLY
    elif authorize is None and not allow_unauthenticated_actions:
        refusal = NO_AUTH
    elif authorize is None:
        log.warning(
            "dashboard actions (retry, cancel, delete, pause, resume) are open to anyone who"
            " can reach it: no authentication, allow_unauthenticated_actions is on"
        )
    store = _Db(dsn_or_pool, schema)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = views.when
    env.filters["when_text"] = views.when_text
    env.filters["ago"] = views.ago
    env.filters["pretty"] = views.pretty
    env.filters["progress"] = views.progress
    dash = _Dashboard(store, env, authorize, refusal, stale_after)
    routes = [
        Route("/", dash.overview, name="overview"),
        Route("/jobs", dash.jobs, name="jobs"),
        Route("/jobs/{job_id}", dash.job, name="job"),
        Route("/jobs/{job_id}/{action}", dash.job_action, methods=["POST"], name="job_action"),
        Route("/types/{action}", dash.type_action, methods=["POST"], name="type_action"),
        Route("/bundles", dash.bundles, name="bundles"),
        Route("/workers", dash.workers, name="workers"),
        Route("/schedules", dash.schedules, name="schedules"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.pgq_close = store.close  # for a caller that wants its pool closed
    return app


def vacuum_findings(conn: db.Conn, schema: str) -> list[Finding]:
    return diagnose(read_health(conn, schema, older_than=MAX_TRANSACTION_AGE), schema)


class Refused(Exception):
    """A request answered 403 with this message."""


class _Dashboard:
    def __init__(
        self,
        store: _Db,
        env: jinja2.Environment,
        authorize: Authorize | None,
        refusal: str | None,
        stale_after: float,
    ) -> None:
        self.store = store
        self.env = env
        self._authorize = authorize
        self.refusal = refusal  # None: actions allowed (authorize still asked)
        self.stale_after = stale_after

    # ---- pages ----

    async def overview(self, request: Request) -> Response:
        data = await self._read(views.overview)
        if request.headers.get("x-pgq-live") != "1":  # the banner is outside the live part
            data = {**data, "vacuum_findings": await self._read(vacuum_findings)}
        return await self._page(request, "overview.html", data, live=True)

    async def jobs(self, request: Request) -> Response:
        try:
            query = views.JobsQuery.parse(request.query_params)
        except ValueError as exc:
            return await self._page(request, "jobs.html", views.empty_jobs(str(exc)), status=400)
        if query.job_id is not None:
            found = await self._read(lambda conn, s: _exists(conn, s, query.job_id))
            if found:
                return RedirectResponse(self._url(request, "job", job_id=str(query.job_id)), 303)
        data = await self._read(lambda conn, s: views.jobs(conn, s, query, PAGE_SIZE))
        return await self._page(request, "jobs.html", data)

    async def job(self, request: Request) -> Response:
        job_id = _parse_id(str(request.path_params["job_id"]))
        if job_id is None:
            return await self._not_found(request, "not a job id")
        try:
            data = await self._read(lambda conn, s: views.job(conn, s, job_id))
        except JobNotFound:
            return await self._not_found(request, f"no job with id {job_id}")
        return await self._page(request, "job.html", data, live=True)

    async def bundles(self, request: Request) -> Response:
        data = await self._read(views.bundles)
        return await self._page(request, "bundles.html", data, live=True)

    async def workers(self, request: Request) -> Response:
        data = await self._read(lambda conn, s: views.workers(conn, s, self.stale_after))
        return await self._page(request, "workers.html", data, live=True)

    async def schedules(self, request: Request) -> Response:
        data = await self._read(views.schedules)
        return await self._page(request, "schedules.html", data)

    # ---- actions ----

    async def job_action(self, request: Request) -> Response:
        action = _JOB_ACTIONS.get(str(request.path_params["action"]))
        job_id = _parse_id(str(request.path_params["job_id"]))
        if action is None or job_id is None:
            return PlainTextResponse("no such action", status_code=404)
        try:
            await self._guard(request, action)
        except Refused as exc:
            return PlainTextResponse(str(exc), status_code=403)
        back = self._url(request, "job", job_id=str(job_id))
        try:
            ok, message = await self._write(
                lambda conn, s: views.job_action(conn, s, action, job_id)
            )
        except PgqError as exc:
            ok, message = False, str(exc)
        if ok and action == "delete":
            back = self._url(request, "jobs")
        return self._flash(RedirectResponse(back, 303), request, ok, message)

    async def type_action(self, request: Request) -> Response:
        action = _TYPE_ACTIONS.get(str(request.path_params["action"]))
        if action is None:
            return PlainTextResponse("no such action", status_code=404)
        try:
            form = await self._guard(request, action)
            type_ = check_type_name(str(form.get("type", "")))
        except Refused as exc:
            return PlainTextResponse(str(exc), status_code=403)
        except ValueError as exc:
            return self._flash(
                RedirectResponse(self._url(request, "overview"), 303), request, False, str(exc)
            )
        who = f"dashboard ({request.client.host})" if request.client else "dashboard"
        ok, message = await self._write(
            lambda conn, s: views.type_action(conn, s, action, type_, who)
        )
        return self._flash(
            RedirectResponse(self._url(request, "overview"), 303), request, ok, message
        )

    async def _guard(self, request: Request, action: Action) -> Mapping[str, object]:
        """The checks before any action, each a Refused: read-only, CSRF, authorize."""
        if self.refusal is not None:
            raise Refused(self.refusal)
        async with request.form() as form:
            fields = {k: v for k, v in form.items() if isinstance(v, str)}
        cookie = request.cookies.get(CSRF_COOKIE, "")
        sent = fields.get(CSRF_FIELD, "")
        if not cookie or not sent or not hmac.compare_digest(cookie.encode(), sent.encode()):
            raise Refused("missing or wrong CSRF token: reload the page and try again")
        if not await self._allowed(request, action):
            raise Refused(f"not allowed: {action}")
        return fields

    async def _allowed(self, request: Request, action: Action) -> bool:
        if self._authorize is None:
            return True
        verdict = self._authorize(request, action)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return bool(verdict)

    # ---- plumbing ----

    async def _read(self, load: Callable[[db.Conn, str], T]) -> T:
        def run() -> T:
            with self.store.connection() as conn:
                return load(conn, self.store.schema)

        return await run_in_threadpool(run)

    async def _write(self, act: Callable[[db.Conn, str], tuple[bool, str]]) -> tuple[bool, str]:
        def run() -> tuple[bool, str]:
            with self.store.connection() as conn, conn.transaction():
                return act(conn, self.store.schema)

        return await run_in_threadpool(run)

    def _url(self, request: Request, name: str, **params: str) -> str:
        return str(request.url_for(name, **params).path)

    async def _page(
        self,
        request: Request,
        template: str,
        data: Mapping[str, object],
        *,
        live: bool = False,
        status: int = 200,
    ) -> Response:
        if not await self._allowed(request, "view"):
            return PlainTextResponse("not allowed: view", status_code=403)
        token = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
        fragment = request.headers.get("x-pgq-live") == "1"
        flash = _read_flash(request) if not fragment else None
        html = self.env.get_template(template).render(
            **data,
            fragment=fragment,
            live=live,
            flash=flash,
            csrf=token,
            read_only=self.refusal is not None,
            refusal=self.refusal or "",
            url=lambda name, **p: self._url(request, name, **{k: str(v) for k, v in p.items()}),
            static=lambda path: self._url(request, "static", path=path),
            query=lambda **p: "?" + urlencode({k: v for k, v in p.items() if v}),
            request_path=request.url.path,
        )
        etag = '"' + hashlib.sha256(html.encode()).hexdigest()[:32] + '"'
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if fragment and request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        response: Response = HTMLResponse(html, status_code=status, headers=headers)
        cookie_path = self._url(request, "overview")
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(
                CSRF_COOKIE, token, httponly=True, samesite="strict", path=cookie_path
            )
        if flash is not None:
            response.delete_cookie(FLASH_COOKIE, path=cookie_path)
        return response

    async def _not_found(self, request: Request, message: str) -> Response:
        return await self._page(request, "missing.html", {"message": message}, status=404)

    def _flash(self, response: Response, request: Request, ok: bool, message: str) -> Response:
        value = ("ok:" if ok else "error:") + message[:300]
        response.set_cookie(
            FLASH_COOKIE,
            quote(value),
            httponly=True,
            samesite="strict",
            path=self._url(request, "overview"),
        )
        return response


def _read_flash(request: Request) -> views.Flash | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    kind, _, message = unquote(raw).partition(":")
    return views.Flash(ok=kind == "ok", message=message)


def _parse_id(text: str) -> JobId | None:
    try:
        return JobId(uuid.UUID(text))
    except ValueError:
        return None


def _exists(conn: db.Conn, schema: str, job_id: JobId | None) -> bool:
    if job_id is None:
        return False
    try:
        db.get_job(conn, schema, job_id)
    except JobNotFound:
        return False
    return True
