"""The CLI's failures: fast, one line, the right exit code, and nothing written.

An admin command against a database that is down says so at once (the supervisor's start-up
wait is for `run`); an app that fails to import says where; a malformed DSN never shows its
password; absurd input (60,000-deep JSON, a lone surrogate, a delay of 1e12 s) is exit 2.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from pgq_supervisor.db import Conn
from tests.integration.test_admin_cli import cli, fails
from tests.support.db import count_rows
from tests.support.processes import APP, ROOT, Supervisor, run_cli
from tests.support.waiting import wait_for

FAST_ENOUGH = 3.0  # seconds, the whole command: interpreter start-up, imports, the attempt
ADMIN = [
    ["status"],
    ["depth"],
    ["jobs", "--state", "failed"],
    ["enqueue", "t", "{}"],
    ["workers"],
    ["pause", "t"],
]


def _timed(args: list[str], dsn: str) -> tuple[float, str]:
    started = time.monotonic()
    result = run_cli(args, dsn, timeout=60)
    took = time.monotonic() - started
    return took, fails(result, 1, r"cannot connect to .*: server not reachable")


@pytest.mark.parametrize("args", ADMIN, ids=lambda a: a[0])
def test_an_admin_command_against_a_refused_port_fails_at_once(dsn: str, args: list[str]) -> None:
    refused = make_conninfo(dsn, host="127.0.0.1", port="1")  # nothing listens there
    took, line = _timed(args, refused)
    assert took < FAST_ENOUGH, f"{args[0]} took {took:.1f} s to fail: {line}"


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port whose server takes the connection and never answers (a host that hangs)."""
    with socket.create_server(("127.0.0.1", 0), backlog=8) as server:
        yield server.getsockname()[1]


def test_an_admin_command_against_a_silent_server_gives_up_after_its_timeout(
    dsn: str, silent_server: int
) -> None:
    silent = make_conninfo(dsn, host="127.0.0.1", port=str(silent_server))
    started = time.monotonic()
    result = run_cli(["status"], silent, timeout=60)
    took = time.monotonic() - started
    fails(result, 1, r"cannot connect to .*: server not reachable: .*timeout")
    # libpq's connect_timeout of 2 s (its least), plus the interpreter's start-up
    assert 2.0 <= took < 2.0 + FAST_ENOUGH, took


def test_run_still_waits_for_the_database_at_start_up(dsn: str) -> None:
    refused = make_conninfo(dsn, host="127.0.0.1", port="1")
    started = time.monotonic()
    result = run_cli(["run", "--app", APP, "--connect-timeout", "2"], refused, timeout=60)
    took = time.monotonic() - started
    waiting, _ = result.stderr.splitlines()  # the wait said at once, then its one error
    assert "waiting for the database at 127.0.0.1:1" in waiting
    fails(_last_line(result), 1, "server not reachable")
    assert took >= 1.5, f"run gave up after {took:.1f} s: it retries up to connect_timeout"


def _last_line(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """`result` with only its last stderr line, for `fails` (the lines before are logs)."""
    return subprocess.CompletedProcess(
        result.args, result.returncode, result.stdout, result.stderr.splitlines()[-1]
    )


def test_run_says_at_once_that_it_waits_for_the_database(dsn: str) -> None:
    """Issue 36: not 15 s of silence, then one line: a line naming the host and port (never the
    password) while it still waits, then its one error line as before."""
    refused = make_conninfo(dsn, host="127.0.0.1", port="1", password="s3cret-pw")
    sup = Supervisor(refused, APP, "--connect-timeout", "8")
    try:
        line = wait_for(
            "the supervisor's waiting line",
            lambda: next((ln for ln in sup.log().splitlines() if "waiting for" in ln), None),
            timeout=6,  # well inside the 8 s it waits: said at the start, not at the end
        )
        assert sup.proc.poll() is None, sup.log()
        assert re.search(
            r"WARNING .*waiting for the database at 127\.0\.0\.1:1 \(server not reachable\):"
            r" retrying for up to 8 s$",
            line,
        ), line
        assert sup.wait(timeout=30) == 1
        lines = sup.log().splitlines()
        assert len(lines) == 2 and lines[0] == line, lines
        assert (
            lines[1].startswith("error: cannot connect to ") and "server not reachable" in lines[1]
        )
        assert "s3cret-pw" not in sup.log()
    finally:
        sup.close()


# ---- the app ----


@pytest.fixture
def apps(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH with modules that fail to import in different ways."""
    (tmp_path / "raises_app.py").write_text("import pgq_supervisor\n\nx = 1 / 0\n")
    (tmp_path / "syntax_app.py").write_text("import pgq_supervisor\ndef f(:\n    pass\n")
    (tmp_path / "nested_app.py").write_text("import broken_helper\n")
    (tmp_path / "broken_helper.py").write_text('import os\n\nraise RuntimeError("no config")\n')
    return {"PYTHONPATH": f"{tmp_path}:{ROOT / 'tests' / 'acceptance' / 'apps'}"}


@pytest.mark.parametrize(
    ("module", "shown"),
    [
        ("raises_app", r"ZeroDivisionError: division by zero \(\S+/raises_app\.py:3\)$"),
        ("syntax_app", r"SyntaxError: invalid syntax \(\S+/syntax_app\.py:2\)$"),
        ("nested_app", r"RuntimeError: no config \(\S+/broken_helper\.py:3\)$"),
    ],
)
def test_an_app_that_fails_to_import_says_what_and_where(
    dsn: str, apps: dict[str, str], module: str, shown: str
) -> None:
    result = run_cli(["run", "--app", f"{module}:registry"], dsn, env=apps)
    fails(result, 3, rf"^error: cannot import app module '{module}': {shown}")
    # the whole traceback at debug level, then the same one line
    debug = run_cli(["run", "--app", f"{module}:registry", "--log-level", "debug"], dsn, env=apps)
    assert debug.returncode == 3
    assert "Traceback (most recent call last)" in debug.stderr
    last = debug.stderr.splitlines()[-1]
    assert last.startswith(f"error: cannot import app module '{module}'"), last


@pytest.mark.parametrize(
    ("target", "hint"),
    [
        ("pgq_test_app:regsitry", " (did you mean 'registry'?)"),
        ("pgq_test_app:Registry", " (did you mean 'registry'?)"),  # a Registry comes first
        ("pgq_test_app:zzzz", ""),  # nothing close: no guess
    ],
)
def test_a_mistyped_app_attribute_says_did_you_mean(dsn: str, target: str, hint: str) -> None:
    """Issue 36: `--app hello:regsitry` names the attribute it probably meant."""
    attr = target.partition(":")[2]
    result = run_cli(["run", "--app", target], dsn)
    line = fails(result, 3, f"has no attribute '{attr}'")
    assert line == f"error: app module 'pgq_test_app' has no attribute '{attr}'{hint}"


@pytest.mark.parametrize(
    ("word", "said"),
    [
        ("stauts", "unknown command 'stauts', did you mean status? (see --help)"),
        ("shwo", "unknown command 'shwo', did you mean show? (see --help)"),
        ("migrat", "unknown command 'migrat', did you mean migrate? (see --help)"),
        ("xyzzy", "unknown command 'xyzzy' (commands: run, migrate, enqueue, "),
        # a DSN given where a command goes: named, its password not shown
        ("postgresql://u:s3cret@h/db", "unknown command '***' (commands: run, "),
    ],
)
def test_a_mistyped_command_says_did_you_mean(word: str, said: str) -> None:
    """Issue 36: `run` is the default command, but a word that is no command is not taken for
    an argument of `run` ("unrecognized arguments: stauts")."""
    result = run_cli([word, "--json"])
    line = fails(result, 2, "unknown command")
    assert line.startswith(f"error: {said}"), line
    assert "s3cret" not in result.stderr


def test_flags_alone_still_run_the_default_command(dsn: str) -> None:
    result = run_cli(["--procs", "0", "--app", APP], dsn)
    fails(result, 2, "invalid setting procs")


@pytest.mark.parametrize("target", ["pgq_test_app", "pgq_test_app:", ":registry"])
def test_an_app_without_module_and_attribute_is_bad_usage(dsn: str, target: str) -> None:
    result = run_cli(["run", "--app", target], dsn)
    fails(
        result,
        2,
        rf"invalid setting app: must look like 'package\.module:registry', got '{target}'",
    )


# ---- a malformed DSN ----

MALFORMED = [
    pytest.param("postgresql://app:secret%zz@127.0.0.1/jobs", id="url"),
    pytest.param("host=127.0.0.1 user=app password=my secret dbname=jobs", id="key-value"),
]


@pytest.mark.parametrize("bad", MALFORMED)
@pytest.mark.parametrize("given", ["flag", "env"])
@pytest.mark.parametrize("command", [["status"], ["run", "--app", APP], ["dashboard"]])
def test_a_malformed_dsn_is_one_line_that_hides_its_password(
    bad: str, given: str, command: list[str]
) -> None:
    if given == "flag":
        result = run_cli([*command, "--dsn", bad])
    else:
        result = run_cli(command, env={"PGQ_DSN": bad})
    line = fails(result, 2, r"^error: invalid setting dsn: ")
    assert "secret" not in line and "***" in line, line


# ---- absurd input ----


def _deep_json(depth: int) -> str:
    return '{"a": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["enqueue", "t", _deep_json(60_000)], r"payload is nested too deeply"),
        (["enqueue", "t", '{"text": "\\ud800"}'], r"payload contains a lone surrogate \(\\ud800\)"),
        (["enqueue", "t", '{"\\udfff": 1}'], r"payload contains a lone surrogate \(\\udfff\)"),
        (["enqueue", "t", "{}", "--start-in", "1e12"], r"invalid duration '1e12': must be from 0"),
        (["enqueue", "t", "{}", "--start-in", "1e9d"], r"invalid duration '1e9d'"),
        (["enqueue", "t", "{}", "--start-in", "inf"], r"invalid duration 'inf'"),
        (["enqueue", "t", "{}", "--start-in", "1e400"], r"invalid duration '1e400'"),
        (["enqueue", "t", "{}", "--start-in", "nan"], r"invalid duration 'nan'"),
        (["purge", "--older-than", "1e12"], r"invalid duration '1e12'"),
        # Python's int conversion limit (4300 digits): a ValueError, not a JSONDecodeError
        (["enqueue", "t", '{"a": ' + "9" * 5000 + "}"], r"an integer of more than 4300 digits"),
        (
            ["enqueue", "t", '{"s": "' + "x" * 93 + '"}', "--max-payload-bytes", "100"],
            r"^error: payload is 101 bytes of JSON, over the 100-byte cap \(PGQ_MAX_PAYLOAD_BYTES"
            r"\)$",
        ),
        (["enqueue", "t", "{}", "--max-payload-bytes", "0"], r"invalid setting max_payload_bytes"),
    ],
    ids=[
        *("deep", "high-surrogate", "low-surrogate", "1e12", "1e9d", "inf", "1e400", "nan"),
        *("purge", "5000-digits", "over-the-cap", "cap-0"),
    ],
)
def test_absurd_input_is_one_line_exit_2_and_nothing_written(
    dsn: str, conn: Conn, args: list[str], pattern: str
) -> None:
    fails(cli(dsn, *args), 2, pattern)
    assert count_rows(conn) == 0


def test_the_cap_comes_from_the_environment_too(dsn: str, conn: Conn) -> None:
    big = '{"s": "' + "x" * 2000 + '"}'
    result = run_cli(["enqueue", "t", big], dsn, env={"PGQ_MAX_PAYLOAD_BYTES": "1000"})
    fails(result, 2, r"payload is 2008 bytes of JSON, over the 1000-byte cap")
    assert count_rows(conn) == 0


# Python keeps a byte that is not UTF-8 as a lone surrogate (\udcff for 0xff): the child gets
# the raw byte back (subprocess encodes arguments with surrogateescape)
@pytest.mark.parametrize(
    "args",
    [
        ["status", "\udcff"],
        ["\udcff"],
        ["enqueue", "t", '{"a": "\udcff"}'],
        ["jobs", "--type", "\udcc3("],
        ["run", "--app", "\udcff"],
    ],
    ids=["status", "alone", "payload", "flag-value", "run"],
)
def test_a_non_utf8_argument_is_one_line_exit_2(dsn: str, conn: Conn, args: list[str]) -> None:
    fails(run_cli(args, dsn), 2, r"^error: argument \d+ is not valid UTF-8: .*\\x[a-f0-9]{2}")
    assert count_rows(conn) == 0


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("--poll-interval", "inf", "finite number"),
        ("--shutdown-timeout", "nan", "finite number"),
        ("--heartbeat-interval", "1e12", "less than or equal to"),
    ],
)
def test_absurd_durations_of_run_are_bad_usage(dsn: str, flag: str, value: str, why: str) -> None:
    result = run_cli(["run", "--app", APP, flag, value], dsn)
    fails(result, 2, rf"invalid setting {flag[2:].replace('-', '_')}: .*{why}")
