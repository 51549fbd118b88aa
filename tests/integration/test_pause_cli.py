"""`pause TYPE`, `resume TYPE` and the paused types in `status`, through the real CLI."""

from __future__ import annotations

import pytest

import pgq_supervisor as pgq
from pgq_supervisor.db import Conn
from tests.integration.test_admin_cli import cli, fails, ok, ok_json
from tests.support.db import claim


def test_pause_and_resume_from_the_cli(dsn: str, conn: Conn) -> None:
    pgq.enqueue(conn, "mail", {})
    out = ok(cli(dsn, "pause", "mail", "--reason", "smtp down"))
    assert out.startswith("paused mail")
    assert claim(conn, ["mail"]) == []

    doc = ok_json(cli(dsn, "pause", "mail", "--json"))
    assert (doc["type"], doc["paused"], doc["changed"]) == ("mail", True, False)
    assert "already paused" in ok(cli(dsn, "pause", "mail"))

    status = ok_json(cli(dsn, "status", "--json"))
    (paused,) = status["paused"]
    assert (paused["type"], paused["reason"]) == ("mail", "smtp down")
    assert paused["paused_by"].endswith("(cli)")
    text = ok(cli(dsn, "status"))
    assert "paused: mail since" in text and "smtp down" in text

    doc = ok_json(cli(dsn, "resume", "mail", "--json"))
    assert (doc["type"], doc["paused"], doc["changed"]) == ("mail", False, True)
    assert "was not paused" in ok(cli(dsn, "resume", "mail"))
    assert ok_json(cli(dsn, "status", "--json"))["paused"] == []
    assert len(claim(conn, ["mail"])) == 1


def test_status_of_an_empty_queue_shows_paused_types(dsn: str, conn: Conn) -> None:
    pgq.pause(conn, "idle")
    first, second = ok(cli(dsn, "status")).splitlines()
    assert first == "no jobs"
    assert second.startswith("paused: idle since ")


@pytest.mark.parametrize("command", ["pause", "resume"])
@pytest.mark.parametrize("bad", ["has space", "x" * 101, ""])
def test_an_invalid_type_name_is_exit_2(dsn: str, command: str, bad: str) -> None:
    fails(cli(dsn, command, bad), 2, "invalid job type")


@pytest.mark.parametrize("command", ["pause", "resume"])
def test_a_missing_type_is_exit_2(dsn: str, command: str) -> None:
    result = cli(dsn, command)
    assert result.returncode == 2 and "type" in result.stderr
