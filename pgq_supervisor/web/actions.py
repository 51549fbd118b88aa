"""The dashboard's actions (POST): each passes Handlers._guard (read-only, CSRF, authorize),
then, when destructive, a confirmation step, then writes in one transaction and redirects
(303) back with a one-line message."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from pgq_supervisor.errors import PgqError
from pgq_supervisor.jobs import check_type_name
from pgq_supervisor.web import jobs_view, views
from pgq_supervisor.web.handlers import Action, Fields, Refused, parse_id
from pgq_supervisor.web.pages import Pages

JOB_ACTIONS: dict[str, Action] = {"retry": "retry", "cancel": "cancel", "delete": "delete"}
TYPE_ACTIONS: dict[str, Action] = {
    "retry-failed": "retry_failed", "pause": "pause", "resume": "resume",
}  # fmt: skip
SCHEDULE_ACTIONS: dict[str, Action] = {
    "run": "run_schedule", "pause": "pause_schedule", "resume": "resume_schedule",
}  # fmt: skip
# what a destructive action asks before it acts (the label of its confirming button)
_ASK = {
    "cancel": ("Cancel job {what}? A running job's worker is stopped.", "Cancel"),
    "delete": ("Delete job {what} for good?", "Delete"),
    "retry_failed": ("Retry every failed job of type {what}?", "Retry all failed"),
}
_ASK_BULK = {
    "retry": ("Retry the {what} selected jobs?", "Retry"),
    "cancel": ("Cancel the {what} selected jobs? Running ones' workers are stopped.", "Cancel"),
    "delete": ("Delete the {what} selected jobs for good?", "Delete"),
}


class Dashboard(Pages):
    async def job_action(self, request: Request) -> Response:
        action = JOB_ACTIONS.get(str(request.path_params["action"]))
        job_id = parse_id(str(request.path_params["job_id"]))
        if action is None or job_id is None:
            return PlainTextResponse("no such action", status_code=404)
        try:
            fields = await self._guard(request, action)
        except Refused as exc:
            return PlainTextResponse(str(exc), status_code=403)
        back = self._url(request, "job", job_id=str(job_id))
        if action in _ASK and not fields.confirmed:
            return await self._ask(request, fields, action, str(job_id), back)
        try:
            ok, message = await self._write(
                lambda conn, s: jobs_view.job_action(conn, s, action, job_id)
            )
        except PgqError as exc:
            ok, message = False, str(exc)
        if ok and action == "delete":
            back = self._url(request, "jobs")
        return self._flash(RedirectResponse(back, 303), request, ok, message)

    async def bulk_action(self, request: Request) -> Response:
        """retry, cancel or delete the jobs selected on the Jobs page (form fields `action`
        and `id`, once per job); always confirmed first."""
        try:
            fields = await self._guard_named(request, JOB_ACTIONS)
        except Refused as exc:
            return PlainTextResponse(str(exc), status_code=403)
        except LookupError:
            return PlainTextResponse("no such action", status_code=404)
        action = JOB_ACTIONS[fields.get("action")]
        back = self._back(request, fields, "jobs")
        try:
            ids = jobs_view.parse_ids(fields.all("id"))
            if not ids:
                raise ValueError("no job selected: tick the jobs to act on first")
        except ValueError as exc:
            return self._flash(RedirectResponse(back, 303), request, False, str(exc))
        if not fields.confirmed:
            question, label = _ASK_BULK[action]
            return await self._confirm(request, fields, question.format(what=len(ids)), label, back)
        ok, message = await self._write(lambda conn, s: jobs_view.bulk_action(conn, s, action, ids))
        return self._flash(RedirectResponse(back, 303), request, ok, message)

    async def type_action(self, request: Request) -> Response:
        action = TYPE_ACTIONS.get(str(request.path_params["action"]))
        if action is None:
            return PlainTextResponse("no such action", status_code=404)
        try:
            fields = await self._guard(request, action)
        except Refused as exc:
            return PlainTextResponse(str(exc), status_code=403)
        back = self._back(request, fields, "overview")
        try:
            type_ = check_type_name(fields.get("type"))
        except ValueError as exc:
            return self._flash(RedirectResponse(back, 303), request, False, str(exc))
        if action in _ASK and not fields.confirmed:
            return await self._ask(request, fields, action, type_, back)
        who = f"dashboard ({request.client.host})" if request.client else "dashboard"
        ok, message = await self._write(
            lambda conn, s: views.type_action(conn, s, action, type_, who)
        )
        return self._flash(RedirectResponse(back, 303), request, ok, message)

    async def schedule_action(self, request: Request) -> Response:
        action = SCHEDULE_ACTIONS.get(str(request.path_params["action"]))
        if action is None:
            return PlainTextResponse("no such action", status_code=404)
        try:
            fields = await self._guard(request, action)
        except Refused as exc:
            return PlainTextResponse(str(exc), status_code=403)
        back = self._back(request, fields, "schedules")
        name = fields.get("name")
        if not 0 < len(name) <= 100:
            message = f"invalid schedule name: {name[:40]!r}"
            return self._flash(RedirectResponse(back, 303), request, False, message)
        who = f"dashboard ({request.client.host})" if request.client else "dashboard"
        try:
            ok, message = await self._write(
                lambda conn, s: views.schedule_action(conn, s, action, name, who)
            )
        except PgqError as exc:
            ok, message = False, str(exc)
        return self._flash(RedirectResponse(back, 303), request, ok, message)

    async def _guard_named(self, request: Request, named: dict[str, Action]) -> Fields:
        """_guard for the action a form field `action` names (LookupError: none)."""
        if self.refusal is not None:  # read-only says so whatever the form holds
            raise Refused(self.refusal)
        async with request.form() as form:
            name = str(form.get("action", ""))
        if name not in named:
            raise LookupError(name)
        return await self._guard(request, named[name])

    async def _ask(
        self, request: Request, fields: Fields, action: Action, what: str, back: str
    ) -> Response:
        question, label = _ASK[action]
        return await self._confirm(request, fields, question.format(what=what), label, back)

    def _back(self, request: Request, fields: Fields, default: str) -> str:
        """The page the form came from (its `back` field) when it is a path of this
        dashboard, else the page `default`: never another site (a leading `//` or a backslash
        could name one; a `//` further on is a type's, as in /types/a//b)."""
        home = self._url(request, "overview")
        sent = fields.get("back")
        ours = sent.startswith(home) and not sent.startswith("//") and "\\" not in sent
        ours = ours and not any(ord(c) < 0x21 or ord(c) == 0x7F for c in sent)
        return sent if ours else self._url(request, default)
