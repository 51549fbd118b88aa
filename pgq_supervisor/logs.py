"""Logging set-up: text or JSON lines on stderr."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence

from pgq_supervisor.redaction import HidePasswords

_STD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD:
                out[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str)


def setup_logging(level: str = "info", fmt: str = "text", hide: Sequence[str | None] = ()) -> None:
    """Configure the root logger once per process (the supervisor and each child). `hide`:
    DSNs whose passwords no line may show (redaction.HidePasswords), whatever logs it."""
    handler = logging.StreamHandler(sys.stderr)
    if hide:
        handler.addFilter(HidePasswords(*hide))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-5s [%(process)d] %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Never write os.environ here: setproctitle rewrites the process's original argv/environ
    # block, and a changed variable moves out of that block and makes the title vanish.
