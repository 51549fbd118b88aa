"""Keeping a DSN's password out of what is shown: logs, process titles and error lines.

libpq's parser quotes the token it rejects (`invalid percent-encoded token: "secret%zz"`,
`missing "=" after "secret"`), and a password it split (`password=my secret`, `u:p@ss@host`)
lands partly in another field, which connect errors then quote (`host name "ss@host"`). So the
password is found in the DSN's text as written, not by parsing it (a DSN that does not parse
is exactly the case), and every quoted token holding it, or a piece of it, is masked.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict
from setproctitle import setproctitle

MASK = "***"

# password=value in a key=value DSN: quoted (maybe unterminated), or bare up to the next key
_KV_PASSWORD = re.compile(
    r"(?:^|\s)password\s*=\s*(?:'((?:[^'\\]|\\.)*)'?|(.*?)(?=\s+\w+\s*=|\s*$))", re.S
)
_URL = re.compile(r"^\s*postgres(?:ql)?://(.*)$", re.S | re.I)
_URL_QUERY_PASSWORD = re.compile(r"[?&]password=([^&]*)", re.I)
_QUOTED = re.compile(r"\"([^\"]*)\"|'([^']*)'")
_SPLIT = re.compile(r"[\s@]+")


def _written(dsn: str) -> list[str]:
    """The password as written in `dsn` (every place it may be given), unparsed."""
    found: list[str] = []
    url = _URL.match(dsn)
    if url is None:
        for m in _KV_PASSWORD.finditer(dsn):
            quoted, bare = m.group(1), m.group(2)
            found.append(re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare or "")
        return [p for p in found if p]
    rest = url.group(1)
    # up to the last @ of the authority: libpq splits at the first, a password may hold one
    authority = rest.split("?", 1)[0]
    at = authority.rfind("@")
    if at >= 0:
        found.append(authority[:at].partition(":")[2])
    found += _URL_QUERY_PASSWORD.findall(rest)
    return [p for p in found if p]


@functools.lru_cache(maxsize=64)  # asked for each log line a filter masks
def secrets_of(dsn: str | None) -> tuple[frozenset[str], frozenset[str]]:
    """(the password as written and decoded, the pieces of it libpq puts in other fields)."""
    whole: set[str] = set()
    pieces: set[str] = set()
    for written in _written(dsn or ""):
        for form in (written, unquote(written)):
            whole.add(form)
            # libpq keeps the first piece as the password (and never shows it): the others
            # become another field's value or the token an error quotes
            pieces.update(p for p in _SPLIT.split(form)[1:] if p)
    return frozenset(whole), frozenset(pieces)


def hide_password(text: str, *dsns: str | None) -> str:
    """`text` with every quoted token that holds a password of `dsns`, or a piece of one,
    replaced by ***. Conservative on purpose: a user name equal to the password is masked
    too, since showing it would show the password."""
    needles: set[str] = set()
    for dsn in dsns:
        whole, pieces = secrets_of(dsn)
        needles |= whole | pieces
    if not needles:
        return text

    def masked(m: re.Match[str]) -> str:
        token = m.group(1) if m.group(1) is not None else m.group(2)
        if any(n in token for n in needles):
            quote = m.group(0)[0]
            return f"{quote}{MASK}{quote}"
        return m.group(0)

    return _QUOTED.sub(masked, text)


def redact(dsn: str) -> str:
    """The DSN without its password, for logs and process titles: `key=value` pairs, any value
    holding a piece of a password libpq split off shown as ***."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    params.pop("password", None)
    whole, pieces = secrets_of(dsn)
    needles = whole | pieces
    shown = {k: MASK if any(n in str(v) for n in needles) else str(v) for k, v in params.items()}
    return " ".join(f"{k}={v}" for k, v in shown.items())


def _password_spans(dsn: str) -> list[tuple[int, int]]:
    """Where the password is written in `dsn` (as _written finds it, quotes and escapes kept)."""
    spans: list[tuple[int, int]] = []
    url = _URL.match(dsn)
    if url is None:
        for m in _KV_PASSWORD.finditer(dsn):
            group = 1 if m.group(1) is not None else 2
            if m.group(group):
                spans.append(m.span(group))
        return spans
    start, rest = url.start(1), url.group(1)
    authority = rest.split("?", 1)[0]
    at = authority.rfind("@")
    colon = authority[: max(at, 0)].find(":")
    if at >= 0 and 0 <= colon < at - 1:
        spans.append((start + colon + 1, start + at))
    spans += [(start + m.start(1), start + m.end(1)) for m in _URL_QUERY_PASSWORD.finditer(rest)]
    return [s for s in spans if s[1] > s[0]]


def mask_dsn(dsn: str) -> str:
    """`dsn` as written with its password replaced by *** wherever it is given, whether or not
    the DSN parses: what a process title may show of an argument."""
    for begin, end in sorted(_password_spans(dsn), reverse=True):
        dsn = dsn[:begin] + MASK + dsn[end:]
    return dsn


def masked_args(args: Sequence[str], *dsns: str | None) -> list[str] | None:
    """`args` with the password of each of `dsns` masked where it is given (mask_dsn), for a
    process title; None when no argument holds one. Bytes that are not UTF-8 (surrogate
    escapes) are shown escaped."""
    masked = list(args)
    for dsn in (d for d in dsns if d):
        masked = [arg.replace(dsn, mask_dsn(dsn)) for arg in masked]
    if masked == list(args):
        return None
    return [a.encode("utf-8", "backslashreplace").decode("utf-8") for a in masked]


# a password this short is masked inside quoted tokens only: anywhere, it would mask words
_ANYWHERE_MIN = 4


def hide_secrets(text: str, *dsns: str | None) -> str:
    """hide_password, and every whole password of `dsns` (of 4 characters or more) masked
    wherever it stands, quoted or not: for log lines and tracebacks."""
    text = hide_password(text, *dsns)
    for dsn in dsns:
        whole, _pieces = secrets_of(dsn)
        for secret in sorted(whole, key=len, reverse=True):
            if len(secret) >= _ANYWHERE_MIN:
                text = text.replace(secret, MASK)
    return text


class HidePasswords(logging.Filter):
    """A logging filter that masks the passwords of `dsns` (hide_secrets) in each record's
    message and traceback: on a handler, every line it writes; on a logger, its own records."""

    def __init__(self, *dsns: str | None) -> None:
        super().__init__()
        self.dsns = [d for d in dsns if d and any(secrets_of(d))]

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.dsns:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a bad format: the handler's formatter reports it, as it would
            return True
        masked = hide_secrets(message, *self.dsns)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = hide_secrets(record.exc_text, *self.dsns)
        return True


def title_without_secrets(
    args: Sequence[str], dsn: str | None, listen_dsn: str | None, dashboard: str | None
) -> None:
    """What `ps -o args` shows: no DSN password (docs/operations.md#secrets-in-titles-and-logs).
    `dashboard`: the dashboard's URL, its whole title; `run`'s supervisor sets its own title
    once started."""
    masked = masked_args(args, dsn, listen_dsn)
    if dashboard is not None:
        setproctitle(f"pgq-dashboard {dashboard}")
    elif masked is not None:
        setproctitle(" ".join(["pgq-supervisor", *masked]))
