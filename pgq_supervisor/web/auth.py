"""HTTP Basic for the dashboard: one user, every page and action (the `dashboard` command's
PGQ_DASHBOARD_USER and PGQ_DASHBOARD_PASSWORD). Send it over TLS only: Basic is a password in
each request. For roles, or your own sign-in, pass your own `authorize` (docs/dashboard.md).
"""

from __future__ import annotations

import base64
import binascii
import hmac

from starlette.exceptions import HTTPException
from starlette.requests import Request

from pgq_supervisor.web.app import Action, Authorize

REALM = "pgq dashboard"


def basic_auth(user: str, password: str) -> Authorize:
    """An `authorize` that lets `user` with `password` view and act, and answers every other
    request 401 with a Basic challenge (the browser then asks for a name and password)."""
    if not user or not password:
        raise ValueError("basic_auth needs a user and a password, both non-empty")
    expected = f"{user}:{password}".encode()

    def authorize(request: Request, action: Action) -> bool:
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        try:
            sent = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            sent = b""
        # compared whole, in constant time: neither the name nor the password leaks by timing
        if scheme.lower() != "basic" or not hmac.compare_digest(sent, expected):
            raise HTTPException(401, headers={"WWW-Authenticate": f'Basic realm="{REALM}"'})
        return True

    return authorize
