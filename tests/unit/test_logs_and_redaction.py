from __future__ import annotations

import json
import logging

from pgq_supervisor.db import describe_connect_error, redact
from pgq_supervisor.logs import JsonFormatter


def test_redact_drops_the_password() -> None:
    shown = redact("host=db.example user=app password=s3cret dbname=jobs")
    assert "s3cret" not in shown and "host=db.example" in shown and "dbname=jobs" in shown
    assert "s3cret" not in redact("postgresql://app:s3cret@db.example/jobs")


def test_json_log_lines_carry_extra_fields() -> None:
    record = logging.makeLogRecord(
        {"name": "pgq", "levelno": 20, "levelname": "INFO", "msg": "job %s", "args": ("x",)}
    )
    record.job_id = "abc"
    out = json.loads(JsonFormatter().format(record))
    assert out["msg"] == "job x" and out["level"] == "info" and out["job_id"] == "abc"


def test_connect_errors_are_told_apart() -> None:
    import psycopg

    cases = {
        'FATAL:  password authentication failed for user "app"': "authentication failed",
        'FATAL:  database "nope" does not exist': "database does not exist",
        'could not translate host name "nohost" to address': "unknown host",
        "connection refused": "server not reachable",
    }
    for text, kind in cases.items():
        assert describe_connect_error(psycopg.OperationalError(text)).startswith(kind), text
