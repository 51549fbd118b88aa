"""`--help` as a newcomer reads it (issue 36): the commands in groups, every flag's default."""

from __future__ import annotations

import argparse
import re

import pytest

from pgq_supervisor import admin
from pgq_supervisor.cli import COMMANDS, RUN_FLAGS, build_parser
from pgq_supervisor.cli_help import COMMAND_GROUPS
from tests.support.processes import run_cli


def _help(*args: str) -> str:
    result = run_cli([*args, "--help"])
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout


def _flag_helps(text: str) -> dict[str, str]:
    """Each flag of a `--help` with its help text, its wrapped lines joined."""
    helps: dict[str, str] = {}
    flag = None
    for line in text.split("options:", 1)[1].splitlines():
        if match := re.match(r"^  (-[-\w]+)(?:, --[-\w]+)?(?: \S+)?(?:\s{2,}(.*))?$", line):
            flag = match.group(1)
            helps[flag] = match.group(2) or ""
        elif flag is not None and line.startswith(" " * 10):
            helps[flag] = f"{helps[flag]} {line.strip()}".strip()
    return helps


def test_the_commands_are_listed_in_groups() -> None:
    text = _help()
    assert text.startswith("usage: pgq-supervisor [COMMAND] [FLAGS]")
    listed = text.split("commands:\n", 1)[1]
    titles = re.findall(r"^  (\S[^:]*):$", listed, re.M)
    assert titles == list(COMMAND_GROUPS)  # run and serve, inspect, change, schema
    where: dict[str, str] = {}
    title = ""
    for line in listed.splitlines():
        if m := re.match(r"^  (\S[^:]*):$", line):
            title = m.group(1)
        elif m := re.match(r"^    (\S+)\s", line):
            assert m.group(1) not in where, f"{m.group(1)} listed twice"
            where[m.group(1)] = title
    assert sorted(where) == sorted(COMMANDS)  # every command, once: no "other" group
    assert (where["run"], where["status"], where["show"], where["retry"], where["migrate"]) == (
        "run and serve", "inspect", "inspect", "change", "schema",
    )  # fmt: skip
    assert "{run,migrate," not in text  # not argparse's flat list


def test_run_help_gives_every_flag_its_default() -> None:
    helps = _flag_helps(_help("run"))
    assert set(RUN_FLAGS) <= set(helps)
    for flag in [*RUN_FLAGS, "--schema", "--log-level", "--log-format"]:
        said = helps[flag].lower()
        assert "default" in said or "unset" in said, (flag, helps[flag])
    assert helps["--poll-interval"].endswith("(default: 2)")
    assert helps["--claim-batch"].endswith("(default: 200)")
    assert helps["--connection-budget"].endswith("(default: shrink)")
    assert helps["--retain-failed"].endswith("(default: 7d)")
    assert helps["--schema"].endswith("(default: pgq)")
    assert helps["--log-level"].endswith("(default: info)")


def test_a_command_help_gives_its_argparse_defaults() -> None:
    helps = _flag_helps(_help("jobs"))
    assert helps["--state"].endswith("(default: failed)")
    assert helps["--limit"].endswith("(default: 20)")
    assert _flag_helps(_help("enqueue"))["--priority"].endswith("(default: 0)")
    assert _flag_helps(_help("dashboard"))["--host"].endswith("(default: 127.0.0.1)")


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("name", [*admin.COMMANDS, "run", "migrate", "enqueue", "demo",
                                  "dashboard", "embedded"])  # fmt: skip
def test_every_default_is_in_its_command_help(name: str) -> None:
    """Every flag whose default is not "nothing" (None, a switch off) says it."""
    parser = _commands()[name]
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        default = action.default
        if default is None or default is False or default == argparse.SUPPRESS:
            continue
        assert f"default: {default}" in text or "default" in str(action.help), (name, action)
