"""JSON as the queue stores it in jsonb: one encoder, and the values jsonb refuses found before
the server sees them (in a batch, one such value would fail the statement for every job in it).
No database here: the db layer and the declarations that hold payloads (periodic) both use it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys

from pgq_supervisor.errors import ConfigError, InvalidInput
from pgq_supervisor.jobs import JsonValue

# The payload cap (docs/guide.md#payload-size): the most bytes of JSON text a payload,
# a schedule's payload or a handler's result may have, as dump_json writes it (compact ASCII,
# so its length is its size). The library reads the variable at each call, as PGQ_SCHEMA;
# the command line sets it from its settings (flag, environment, .env) for itself and its
# children.
MAX_PAYLOAD_ENV = "PGQ_MAX_PAYLOAD_BYTES"
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20  # 1 MiB
# the highest cap that may be set: jsonb refuses a value over 255 MiB, and a statement over
# 1 GiB is refused whole, aborting the caller's transaction
MAX_PAYLOAD_CAP = 128 << 20

# A \u0000 escape not itself escaped (an even run of backslashes before it): jsonb rejects it.
_JSON_NUL_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# one escape of JSON text: \uXXXX (its hex digits captured, lowercase as json.dumps writes them)
# or a backslash and one character
_ESCAPE_RE = re.compile(r"\\(?:u([0-9a-f]{4})|.)")

# one encoder: json.dumps with arguments builds a new one per call
_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def dump_json(value: object, what: str = "payload") -> str:
    """`value` as compact ASCII JSON text for a jsonb parameter; InvalidInput naming `what`
    if it is not JSON, is nested too deeply, or holds what jsonb refuses (NUL, lone surrogate)."""
    try:
        text = _encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not JSON-serializable: {exc}") from exc
    except RecursionError:
        # past Python's recursion limit (about 1000 levels): no worker could decode it either
        raise InvalidInput(f"{what} is nested too deeply to encode as JSON") from None
    if "\\u0000" in text and _JSON_NUL_RE.search(text):
        raise InvalidInput(f"{what} contains a NUL character (\\u0000), which jsonb cannot store")
    if "\\ud" in text and (lone := _lone_surrogate(text)):
        raise InvalidInput(f"{what} contains a lone surrogate ({lone}), which jsonb cannot store")
    return text


def load_json_object(text: str, what: str) -> dict[str, JsonValue]:
    """`text` (the CLI's argument) decoded, if it is a JSON object; InvalidInput naming
    `what` otherwise (not JSON, nested too deeply, an integer Python will not convert)."""
    try:
        value: JsonValue = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc.msg} at column {exc.colno}") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        digits = sys.get_int_max_str_digits()
        raise InvalidInput(f"{what} has an integer of more than {digits} digits") from None
    except RecursionError:
        raise InvalidInput(f"{what} is nested too deeply to decode as JSON") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def max_payload_bytes() -> int:
    """The payload cap: $PGQ_MAX_PAYLOAD_BYTES, or 1 MiB unset. ConfigError naming the
    variable unless it is a whole number of bytes from 1 to 128 MiB."""
    raw = os.environ.get(MAX_PAYLOAD_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_PAYLOAD_BYTES
    return _parse_cap(raw)


@functools.lru_cache(maxsize=8)
def _parse_cap(raw: str) -> int:
    try:
        cap = int(raw.strip())
    except ValueError:
        cap = 0
    if not 1 <= cap <= MAX_PAYLOAD_CAP:
        raise ConfigError(
            f"invalid setting {MAX_PAYLOAD_ENV}: must be a whole number of bytes from 1 to"
            f" {MAX_PAYLOAD_CAP}, got {raw[:40]!r}"
        )
    return cap


def check_size(text: str, what: str = "payload", cap: int | None = None) -> str:
    """`text` (dump_json's) if it is within the payload cap (`cap`, or max_payload_bytes());
    InvalidInput naming `what` and both sizes otherwise."""
    limit = max_payload_bytes() if cap is None else cap
    if len(text) > limit:  # ASCII: one byte a character
        raise InvalidInput(
            f"{what} is {len(text)} bytes of JSON, over the {limit}-byte cap ({MAX_PAYLOAD_ENV})"
        )
    return text


def dump_payload(value: object, what: str = "payload", cap: int | None = None) -> str:
    """dump_json, then the payload cap: what every enqueue and every handler result goes
    through before a statement."""
    return check_size(dump_json(value, what), what, cap)


def _lone_surrogate(text: str) -> str | None:
    """The first \\uXXXX escape of `text` (ASCII JSON) that is half a surrogate pair alone.
    Read escape by escape, so an escaped backslash before "ud800" is not taken for one."""
    high: str | None = None  # a high surrogate waiting for its low half, right after it
    end = -1
    for m in _ESCAPE_RE.finditer(text):
        code = m.group(1)
        if high is not None and (m.start() != end or code is None or not _is_low(code)):
            return f"\\u{high}"
        if high is not None:
            high = None
        elif code is not None and _is_high(code):
            high, end = code, m.end()
        elif code is not None and _is_low(code):
            return f"\\u{code}"
    return f"\\u{high}" if high is not None else None


def _is_high(code: str) -> bool:
    return "d800" <= code <= "dbff"


def _is_low(code: str) -> bool:
    return "dc00" <= code <= "dfff"
