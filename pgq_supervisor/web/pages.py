"""The dashboard's pages (GET): each reads its data through views in the thread pool and
renders its template; `authorize(request, "view")` is asked by Handlers._page."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from pgq_supervisor import db, ids
from pgq_supervisor.db.health import read_health
from pgq_supervisor.errors import JobNotFound
from pgq_supervisor.jobs import JobRecord, JobState, check_type_name
from pgq_supervisor.vacuum import MAX_TRANSACTION_AGE, Finding, diagnose
from pgq_supervisor.web import jobs_view, type_view, views
from pgq_supervisor.web.handlers import Handlers, bundle_exists, job_exists, parse_id

PAGE_SIZE = 50


def job_version(data: Mapping[str, object]) -> str:
    """What the job page shows, as one string: its data but the clock, which only a running
    job's "duration so far" reads (a finished one's page changes only when the job does)."""
    job = data.get("job")
    running = isinstance(job, JobRecord) and job.state is JobState.RUNNING
    return repr(sorted((k, v) for k, v in data.items() if k != "now" or running))


class Pages(Handlers):
    async def overview(self, request: Request) -> Response:
        data = await self._read(lambda conn, s: views.overview(conn, s, self.stale_after))
        if request.headers.get("x-pgq-live") != "1":  # the banner is outside the live part
            data = {**data, "vacuum_findings": await self._read(vacuum_findings)}
        return await self._page(request, "overview.html", data, live=True)

    async def jobs(self, request: Request) -> Response:
        try:
            query = jobs_view.JobsQuery.parse(request.query_params)
        except ValueError as exc:
            data = jobs_view.empty_jobs(str(exc)) | {"filters": dict(request.query_params)}
            return await self._page(request, "jobs.html", data, status=400)
        found = query.job_id
        if found is not None:
            if await self._read(lambda conn, s: job_exists(conn, s, found)):
                return RedirectResponse(self._url(request, "job", job_id=str(found)), 303)
            if await self._read(lambda conn, s: bundle_exists(conn, s, found)):
                return RedirectResponse(self._url(request, "bundle", bundle_id=str(found)), 303)
        data = await self._read(lambda conn, s: jobs_view.jobs(conn, s, query, PAGE_SIZE))
        return await self._page(request, "jobs.html", data)

    async def job(self, request: Request) -> Response:
        job_id = parse_id(str(request.path_params["job_id"]))
        if job_id is None:
            return await self._not_found(request, "not a job id")
        try:
            data = await self._read(lambda conn, s: views.job(conn, s, job_id))
        except JobNotFound:
            return await self._not_found(request, f"no job with id {job_id}")
        # the ETag of the data, compared before rendering: an unchanged page is not rendered
        return await self._page(request, "job.html", data, live=True, version=job_version(data))

    async def job_body(self, request: Request) -> Response:
        """A job's payload or result whole, as JSON (the job page's link to what it cut)."""
        if not await self._allowed(request, "view"):
            return PlainTextResponse("not allowed: view", status_code=403)
        job_id = parse_id(str(request.path_params["job_id"]))
        part = str(request.path_params["part"])
        if job_id is None or part not in ("payload", "result"):
            return await self._not_found(request, "not a job's payload or result")
        try:
            text = await self._read(lambda conn, s: db.job_body(conn, s, job_id, part))
        except JobNotFound:
            return await self._not_found(request, f"no job with id {job_id}")
        headers = {"Cache-Control": "no-cache"}
        return Response(text or "null", media_type="application/json", headers=headers)

    async def job_type(self, request: Request) -> Response:
        try:
            type_ = check_type_name(str(request.path_params["type"]))
            window = type_view.window_of(request.query_params.get("window", ""))
        except ValueError as exc:
            return await self._not_found(request, str(exc))
        data = await self._read(
            lambda conn, s: type_view.type_page(conn, s, type_, window, self.stale_after)
        )
        # live over the hour only: the longer windows read up to a week of finished jobs
        return await self._page(request, "type.html", data, live=window.name == "1h")

    async def bundles(self, request: Request) -> Response:
        data = await self._read(views.bundles)
        return await self._page(request, "bundles.html", data, live=True)

    async def bundle(self, request: Request) -> Response:
        try:
            bundle_id = ids.bundle_id(request.path_params["bundle_id"])
        except ValueError:
            return await self._not_found(request, "not a bundle id")
        try:
            data = await self._read(lambda conn, s: views.bundle(conn, s, bundle_id))
        except JobNotFound:
            return await self._not_found(request, f"no bundle with id {bundle_id}")
        return await self._page(request, "bundle.html", data, live=True)

    async def workers(self, request: Request) -> Response:
        data = await self._read(lambda conn, s: views.workers(conn, s, self.stale_after))
        return await self._page(request, "workers.html", data, live=True)

    async def schedules(self, request: Request) -> Response:
        data = await self._read(views.schedules)
        return await self._page(request, "schedules.html", data)


def vacuum_findings(conn: db.Conn, schema: str) -> list[Finding]:
    """What `doctor` would report, for the overview's banner (templates/_vacuum_health.html)."""
    return diagnose(read_health(conn, schema, older_than=MAX_TRANSACTION_AGE), schema)
