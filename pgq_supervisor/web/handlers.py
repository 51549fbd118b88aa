"""The dashboard's plumbing under its pages and actions: the pool, rendering a page (with its
CSRF cookie, flash message and ETag), the checks before an action and its confirmation step,
and the one-line message an action leaves for the next page. app.py says what they guard."""

from __future__ import annotations

import hashlib
import inspect
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar
from urllib.parse import quote, unquote, urlencode

import jinja2
import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from pgq_supervisor import db, ids
from pgq_supervisor.errors import InvalidInput, JobNotFound
from pgq_supervisor.jobs import BundleId, JobId
from pgq_supervisor.redaction import HidePasswords, hide_password
from pgq_supervisor.web import views
from pgq_supervisor.web.csrf import COOKIE as CSRF_COOKIE
from pgq_supervisor.web.csrf import FIELD as CSRF_FIELD
from pgq_supervisor.web.csrf import WRONG_TOKEN, Csrf, foreign

Action = Literal[
    "view", "retry", "cancel", "delete", "retry_failed", "pause", "resume",
    "run_schedule", "pause_schedule", "resume_schedule",
]  # fmt: skip
ACTIONS: tuple[Action, ...] = (
    "view", "retry", "cancel", "delete", "retry_failed", "pause", "resume",
    "run_schedule", "pause_schedule", "resume_schedule",
)  # fmt: skip
# authorize(request, action) -> bool (or an awaitable of one)
Authorize = Callable[[Request, Action], "bool | Awaitable[bool]"]

CONFIRMED_FIELD = "confirmed"
FLASH_COOKIE = "pgq_flash"
HERE = Path(__file__).resolve().parent
T = TypeVar("T")


class Store:
    """The pool, opened on first use (a mounted app gets no lifespan events), and the schema.

    A pool made from a DSN checks each connection before handing it out and replaces a broken
    one (a database restart breaks every idle connection: the next request must not answer
    500), and masks the DSN's password in what psycopg_pool logs. A malformed DSN is refused
    at once (InvalidInput, password masked) rather than retried by the pool forever."""

    def __init__(self, source: str | ConnectionPool, schema: str) -> None:
        self.schema = schema
        self._own = isinstance(source, str)
        self._hide: HidePasswords | None = None
        if isinstance(source, str):
            try:
                conninfo_to_dict(source)
            except psycopg.ProgrammingError as exc:
                why = hide_password(str(exc).strip().splitlines()[0], source)
                raise InvalidInput(f"invalid dsn: {why}") from None
            self._hide = HidePasswords(source)
            logging.getLogger("psycopg.pool").addFilter(self._hide)
            self._pool = ConnectionPool(
                source,
                min_size=1,
                max_size=4,
                kwargs={"autocommit": True, "application_name": "pgq-dashboard"},
                check=ConnectionPool.check_connection,
                open=False,
            )
        else:
            self._pool = source
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
        if self._own:  # opened, or opening (its attempts stop)
            self._pool.close()
        if self._hide is not None:
            logging.getLogger("psycopg.pool").removeFilter(self._hide)
            self._hide = None


class Refused(Exception):
    """A request answered 403 with this message."""


@dataclass(frozen=True, slots=True)
class Fields:
    """An action's form, every value of each field in order."""

    items: Sequence[tuple[str, str]]

    def get(self, name: str, default: str = "") -> str:
        return next((v for k, v in self.items if k == name), default)

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.items if k == name]

    @property
    def confirmed(self) -> bool:
        return self.get(CONFIRMED_FIELD) == "1"


class Handlers:
    """What every page and action handler shares (pages.py and actions.py subclass it)."""

    def __init__(
        self,
        store: Store,
        env: jinja2.Environment,
        authorize: Authorize | None,
        refusal: str | None,
        stale_after: float,
        csrf: Csrf,
    ) -> None:
        self.store = store
        self.csrf = csrf
        self.env = env
        self._authorize = authorize
        self.refusal = refusal  # None: actions allowed (authorize still asked)
        self.stale_after = stale_after

    async def _guard(self, request: Request, action: Action) -> Fields:
        """The checks before any action, each a Refused: read-only, another site's request,
        authorize (which may raise its own HTTPException: a 401 asking for credentials), the
        CSRF token (csrf.py, bound to the credentials just checked)."""
        if self.refusal is not None:
            raise Refused(self.refusal)
        if (why := foreign(request)) is not None:
            raise Refused(why)
        if not await self._allowed(request, action):
            raise Refused(f"not allowed: {action}")
        async with request.form() as form:
            fields = Fields([(k, v) for k, v in form.multi_items() if isinstance(v, str)])
        if not self.csrf.valid(request, fields.get(CSRF_FIELD)):
            raise Refused(WRONG_TOKEN)
        return fields

    def guarded(self, files: ASGIApp) -> ASGIApp:
        """`files` (the static files) behind the pages' authorize: a 403 when it says no, its
        own HTTPException (a 401) when it raises one."""

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and not await self._allowed(Request(scope), "view"):
                await PlainTextResponse("not allowed: view", status_code=403)(scope, receive, send)
                return
            await files(scope, receive, send)

        return app

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
        """The path of route `name`, each parameter percent-encoded whole (Starlette's builder
        quotes nothing and refuses a `/`): any job type check_type_name accepts has a link."""
        quoted = {k: quote(v, safe="") for k, v in params.items()}
        return str(request.url_for(name, **quoted).path)

    async def _page(
        self,
        request: Request,
        template: str,
        data: Mapping[str, object],
        *,
        live: bool = False,
        status: int = 200,
        version: str | None = None,
    ) -> Response:
        """`template` rendered with `data`. A live poll (X-Pgq-Live) whose If-None-Match is the
        page's ETag gets a 304: the ETag of the rendered HTML, or with `version` (a string
        that changes whenever what the page shows does) one made of it before rendering, so
        that an unchanged page is not rendered at all."""
        if not await self._allowed(request, "view"):
            return PlainTextResponse("not allowed: view", status_code=403)
        nonce, new_nonce = self.csrf.nonce(request)
        token = self.csrf.token(request, nonce)
        fragment = request.headers.get("x-pgq-live") == "1"
        etag = None
        if version is not None:
            seen = "\x00".join((template, version, token, str(self.refusal), str(fragment)))
            etag = '"v' + hashlib.sha256(seen.encode("utf-8", "replace")).hexdigest()[:32] + '"'
            if fragment and request.headers.get("if-none-match") == etag:
                return Response(
                    status_code=304, headers={"ETag": etag, "Cache-Control": "no-cache"}
                )
        flash = read_flash(request) if not fragment else None
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
            # the decoded path, encoded again (a type's `?` or `#` is no query nor fragment)
            request_path=quote(request.url.path, safe="/"),
        )
        if etag is None:
            etag = '"' + hashlib.sha256(html.encode()).hexdigest()[:32] + '"'
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if fragment and request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        response: Response = HTMLResponse(html, status_code=status, headers=headers)
        cookie_path = self._url(request, "overview")
        if new_nonce:
            response.set_cookie(
                CSRF_COOKIE, nonce, httponly=True, samesite="strict", path=cookie_path
            )
        if flash is not None:
            response.delete_cookie(FLASH_COOKIE, path=cookie_path)
        return response

    async def _confirm(
        self, request: Request, fields: Fields, question: str, label: str, back: str
    ) -> Response:
        """The confirmation step of a destructive action: a page asking `question`, whose
        button posts the same form again, confirmed (the page's script asks in a dialog
        instead, and posts confirmed at once)."""
        kept = [(k, v) for k, v in fields.items if k not in (CSRF_FIELD, CONFIRMED_FIELD)]
        data = {"question": question, "label": label, "fields": kept, "back": back,
                "action_path": quote(request.url.path, safe="/")}  # fmt: skip
        return await self._page(request, "confirm.html", data)

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


def read_flash(request: Request) -> views.Flash | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    kind, _, message = unquote(raw).partition(":")
    return views.Flash(ok=kind == "ok", message=message)


def parse_id(text: str) -> JobId | None:
    try:
        return ids.job_id(text)
    except ValueError:
        return None


def job_exists(conn: db.Conn, schema: str, job_id: JobId | None) -> bool:
    if job_id is None:
        return False
    try:
        db.get_job(conn, schema, job_id)
    except JobNotFound:
        return False
    return True


def bundle_exists(conn: db.Conn, schema: str, bundle_id: uuid.UUID) -> bool:
    try:
        db.get_bundle(conn, schema, BundleId(bundle_id))
    except JobNotFound:
        return False
    return True
