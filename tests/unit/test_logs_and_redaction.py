from __future__ import annotations

import json
import logging
import sys

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgq_supervisor.db import connect, connect_at_startup, describe_connect_error, redact
from pgq_supervisor.errors import ConfigError, DatabaseError
from pgq_supervisor.logs import JsonFormatter
from pgq_supervisor.redaction import HidePasswords, hide_password, mask_dsn, masked_args
from pgq_supervisor.settings import load_settings


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
    cases = {
        'FATAL:  password authentication failed for user "app"': "authentication failed",
        'FATAL:  database "nope" does not exist': "database does not exist",
        'could not translate host name "nohost" to address': "unknown host",
        "connection refused": "server not reachable",
    }
    for text, kind in cases.items():
        assert describe_connect_error(psycopg.OperationalError(text)).startswith(kind), text


# DSNs whose password libpq's parser (or a connect error) quotes back, and the password
LEAKY_DSNS = [
    pytest.param("postgresql://app:secret%zz@127.0.0.1:1/jobs", "secret", id="url-bad-escape"),
    pytest.param("postgresql://app:sec ret@127.0.0.1:1/jobs", "sec ret", id="url-space"),
    pytest.param("postgresql://127.0.0.1:1/jobs?password=secret%zz", "secret", id="url-query"),
    pytest.param("host=127.0.0.1 port=1 password=my secret dbname=jobs", "secret", id="kv-space"),
    pytest.param("host=127.0.0.1 password='secret\\' x", "secret", id="kv-unterminated"),
]


@pytest.mark.parametrize(("dsn", "secret"), LEAKY_DSNS)
def test_a_malformed_dsn_never_shows_its_password(dsn: str, secret: str) -> None:
    for shown in _errors_for(dsn):
        assert secret not in shown and "secret" not in shown, shown
        assert len(shown.splitlines()) == 1, shown
    assert redact(dsn) == "<unparsable dsn>"


def _errors_for(dsn: str) -> list[str]:
    """The error line of each way a DSN is taken in: settings, connect, connect at start-up."""
    out = []
    with pytest.raises(ConfigError, match="invalid setting dsn") as setting:
        load_settings(dsn=dsn)
    out.append(str(setting.value))
    with pytest.raises(ConfigError, match="invalid setting listen_dsn") as setting:
        load_settings(listen_dsn=dsn)
    out.append(str(setting.value))
    with pytest.raises(DatabaseError) as connecting:
        connect(dsn)
    out.append(str(connecting.value))
    with pytest.raises(DatabaseError) as starting:
        connect_at_startup(dsn, 0.1)
    out.append(str(starting.value))
    return out


def test_the_libpq_message_without_masking_did_show_it() -> None:
    """What the masking is for: psycopg's own message quotes the password."""
    with pytest.raises(psycopg.ProgrammingError, match="secret"):
        conninfo_to_dict("postgresql://app:secret%zz@db/jobs")
    with pytest.raises(psycopg.ProgrammingError, match="secret"):
        conninfo_to_dict("host=db password=my secret")


def test_a_password_split_into_another_field_is_masked_there() -> None:
    # libpq splits at the first @: the host becomes "ss@127.0.0.1", which errors quote
    dsn = "postgresql://app:p@ss@127.0.0.1:1/jobs"
    assert conninfo_to_dict(dsn)["host"] == "ss@127.0.0.1"
    assert "ss@" not in redact(dsn) and "host=***" in redact(dsn)
    line = 'could not translate host name "ss@127.0.0.1" to address'
    assert hide_password(line, dsn) == 'could not translate host name "***" to address'


def test_masking_leaves_other_quoted_tokens_alone() -> None:
    dsn = "host=db.example user=app password=hunter2"
    line = 'connection to server at "db.example" (10.0.0.1), port 5432 failed: for user "app"'
    assert hide_password(line, dsn) == line
    assert hide_password('token "hunter2x"', dsn) == 'token "***"'
    assert hide_password("nothing to hide", None) == "nothing to hide"


# ---- process titles and log lines (issue 38) ----

TITLE_DSNS = [
    ("postgresql://app:s3cr%zzet@db/jobs", "postgresql://app:***@db/jobs"),
    ("postgresql://app:pa@ss@db/jobs", "postgresql://app:***@db/jobs"),
    (
        "postgresql://app@db/jobs?ssl=1&password=s3cret",
        "postgresql://app@db/jobs?ssl=1&password=***",
    ),
    (
        "host=db user=app password=my secret dbname=jobs",
        "host=db user=app password=*** dbname=jobs",
    ),
    ("host=db password='it\\'s s3cret' user=app", "host=db password='***' user=app"),
    ("host=db password='unterminated", "host=db password='***"),
    ("host=db user=app dbname=jobs", "host=db user=app dbname=jobs"),
]


@pytest.mark.parametrize(("dsn", "shown"), TITLE_DSNS)
def test_mask_dsn_masks_the_password_as_written_parsed_or_not(dsn: str, shown: str) -> None:
    assert mask_dsn(dsn) == shown


def test_masked_args_masks_a_dsn_flag_in_either_form_or_says_none() -> None:
    dsn = "postgresql://app:s3cret@db/jobs"
    args = ["migrate", "--dsn", dsn, f"--listen-dsn={dsn}", "\udcff"]
    assert masked_args(args, dsn) == [
        "migrate", "--dsn", "postgresql://app:***@db/jobs",
        "--listen-dsn=postgresql://app:***@db/jobs", "\\udcff",
    ]  # fmt: skip
    assert masked_args(["status", "--dsn", "host=db"], "host=db") is None


def test_the_log_filter_masks_messages_and_tracebacks() -> None:
    dsn = "postgresql://app:pw@s3cret-part@127.0.0.1/jobs"
    record = logging.makeLogRecord(
        {"msg": "error connecting: %s", "args": ('host "s3cret-part@127.0.0.1" unknown',)}
    )
    try:
        raise RuntimeError("dsn was postgresql://app:pw@s3cret-part@127.0.0.1/jobs")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert HidePasswords(dsn).filter(record)
    for line in (logging.Formatter().format(record), JsonFormatter().format(record)):
        assert "s3cret" not in line and "***" in line, line
