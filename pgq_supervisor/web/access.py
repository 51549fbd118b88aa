"""The `dashboard` command's request log: one DEBUG line per request.

uvicorn's access log writes every request at INFO, which for a page that polls every 2 s per
open tab buries the supervisor-style INFO lines an operator reads; at DEBUG it is there when
asked for and costs one level check otherwise.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("pgq_supervisor.web")


class RequestLog:
    """ASGI middleware: `GET /jobs?state=failed 200 3.1 ms` at DEBUG, after each response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.DEBUG):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            query = scope.get("query_string", b"").decode("latin-1")
            target = scope["path"] + (f"?{query}" if query else "")
            elapsed = (time.perf_counter() - start) * 1000
            log.debug("%s %s %s %.1f ms", scope["method"], target, status or "-", elapsed)
