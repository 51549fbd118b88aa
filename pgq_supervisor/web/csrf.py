"""What stops another site from driving the dashboard's actions with a browser's credentials.

Two checks, each enough alone against a browser, both on every action:

- **Where it came from.** A browser names the page that sent a POST: `Origin` (or, when it
  sends none, `Referer`) must be this dashboard's own origin (its host and port as the request
  reached it: `Host`, or `X-Forwarded-Host` behind a proxy), and `Sec-Fetch-Site` must not be
  `cross-site`. `Origin: null` (a sandboxed frame, a data: page) names no origin and is refused.
  A request with neither header (curl, a script) passes this check and meets the next.
- **A token the server signed.** The form's token is `nonce.mac`: the nonce is also in a
  `SameSite=Strict`, `HttpOnly` cookie, and the mac an HMAC-SHA256, under a secret only the
  server holds, of the nonce and of the request's credentials (its `Authorization` header). A
  pair of the attacker's choosing (a cookie set from a sibling subdomain and the same value in
  the field) has no valid mac; a token minted for one user's credentials is refused with
  another's. The secret is the deployment's (`create_app(secret=...)`, the `dashboard`
  command's PGQ_DASHBOARD_SECRET: the same on every replica behind one address), else random
  per process (a restart then asks the open pages to be reloaded before they act).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request

COOKIE = "pgq_csrf"
FIELD = "csrf"
_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)
WRONG_TOKEN = "missing or wrong CSRF token: reload the page and try again"


class Csrf:
    """Mints and checks the dashboard's CSRF tokens under one secret."""

    def __init__(self, secret: str | bytes | None = None) -> None:
        """`secret`: the deployment's (at least 16 bytes), or None for a random one."""
        if secret is None:
            key = secrets.token_bytes(32)
        else:
            key = secret.encode() if isinstance(secret, str) else bytes(secret)
            if len(key) < 16:
                raise ValueError("the dashboard's CSRF secret must be at least 16 bytes")
        self._key = key

    @staticmethod
    def nonce(request: Request) -> tuple[str, bool]:
        """The browser's nonce (its cookie's, when well formed) and whether it is new (then
        the response sets the cookie)."""
        sent = request.cookies.get(COOKIE, "")
        if _NONCE.fullmatch(sent):
            return sent, False
        return secrets.token_urlsafe(32), True

    def token(self, request: Request, nonce: str) -> str:
        """The form field for `nonce` and the request's credentials."""
        return f"{nonce}.{self._mac(request, nonce)}"

    def valid(self, request: Request, sent: str) -> bool:
        """Whether the form's token is one this server minted for the request's cookie and
        credentials (compared in constant time)."""
        cookie = request.cookies.get(COOKIE, "")
        nonce, _, mac = sent.partition(".")
        if not _NONCE.fullmatch(cookie) or not _NONCE.fullmatch(nonce):
            return False
        same_nonce = hmac.compare_digest(nonce.encode(), cookie.encode())
        good_mac = hmac.compare_digest(mac.encode(), self._mac(request, nonce).encode())
        return same_nonce and good_mac

    def _mac(self, request: Request, nonce: str) -> str:
        credentials = hashlib.sha256(request.headers.get("authorization", "").encode()).digest()
        digest = hmac.new(self._key, b"pgq-csrf\0" + nonce.encode() + b"\0" + credentials,
                          hashlib.sha256).digest()  # fmt: skip
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def foreign(request: Request) -> str | None:
    """Why a state-changing request comes from another site, or None when it does not (or
    says nothing: no `Origin`, `Referer` nor `Sec-Fetch-Site`)."""
    if request.headers.get("sec-fetch-site", "").lower() == "cross-site":
        return "refused: a cross-site request (Sec-Fetch-Site: cross-site)"
    origin = request.headers.get("origin")
    header = "Origin"
    if origin is None:
        referer = request.headers.get("referer")
        if referer is None:
            return None
        header, origin = "Referer", referer
    if _host_of(origin) not in _own_hosts(request):
        return f"refused: a request from another origin ({header}: {origin[:100]!r})"
    return None


def _host_of(url: str) -> str | None:
    """host[:port] of an http(s) URL, lowercased; None for anything else (`null`)."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc or "@" in parts.netloc:
        return None
    host = parts.netloc.lower()
    default = ":443" if parts.scheme == "https" else ":80"
    return host.removesuffix(default)


def _own_hosts(request: Request) -> set[str]:
    """The names this request was sent to: `Host` and, behind a proxy, `X-Forwarded-Host` (a
    header no cross-site form can set)."""
    hosts = set()
    for name in ("host", "x-forwarded-host"):
        value = request.headers.get(name, "").split(",")[0].strip().lower()
        if value:
            hosts.add(value.removesuffix(":80").removesuffix(":443"))
    return hosts
