"""Headers on every response of the dashboard, errors and static files included: it may not be
framed by another page (clickjacking its buttons: `X-Frame-Options: DENY`, CSP
`frame-ancestors 'none'`), a response is never sniffed into another type than it says
(`X-Content-Type-Options: nosniff`), and its URLs (job ids, searches) are not sent as
`Referer` to other sites. A header the response already has is left as it is."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class SecurityHeaders:
    """ASGI middleware adding HEADERS to each HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, sending)
