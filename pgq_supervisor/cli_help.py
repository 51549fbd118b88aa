"""What the CLI's `--help` says: the commands in groups, and every flag's default.

`pgq-supervisor --help` lists the commands by what they do (COMMAND_GROUPS) rather than in one
flat list; each command's `--help` gives every flag its default, a setting's from `Settings`
(the flags of `run`, `--schema`, `--log-level`, ...) and an argparse default as argparse holds
it. docs/reference.md's CLI tables (tests/support/reference.py) print the same texts.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Iterable
from typing import TypeVar

from pydantic_core import PydanticUndefined

from pgq_supervisor.settings import Settings

# every command, once: a test keeps them so (a command added elsewhere lands in "other")
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "run and serve": ("run", "demo", "dashboard", "embedded"),
    "inspect": ("status", "depth", "jobs", "show", "workers", "schedules", "doctor"),
    "change": ("enqueue", "retry", "cancel", "purge", "pause", "resume"),
    "schema": ("migrate", "schema-dump", "dashboard-indexes", "partition"),
}
# flag -> setting, for `run`; values are validated by Settings, not argparse
RUN_FLAGS = {
    "--app": "app",
    "--listen-dsn": "listen_dsn",
    "--prepare-threshold": "prepare_threshold",
    "--procs": "procs",
    "--types": "types",
    "--heartbeat-interval": "heartbeat_interval",
    "--dead-after": "dead_after",
    "--poll-interval": "poll_interval",
    "--rescue-interval": "rescue_interval",
    "--shutdown-timeout": "shutdown_timeout",
    "--connect-timeout": "connect_timeout",
    "--connection-budget": "connection_budget",
    "--connection-headroom": "connection_headroom",
    "--max-jobs-per-child": "max_jobs_per_child",
    "--max-memory-per-child": "max_memory_per_child",
    "--claim-batch": "claim_batch",
    "--concurrency": "concurrency",
    "--child-pool-size": "child_pool_size",
    "--release-unstarted-after": "release_unstarted_after",
    "--metrics-port": "metrics_port",
    "--metrics-host": "metrics_host",
    "--retain-succeeded": "retain_succeeded",
    "--retain-failed": "retain_failed",
    "--partition-interval": "partition_interval",
    "--summary-interval": "summary_interval",
    "--max-payload-bytes": "max_payload_bytes",
}

Parser = TypeVar("Parser", bound=argparse.ArgumentParser)
NAME_WIDTH = 19
WIDTH = 79


def _says_default(text: str) -> bool:
    """Whether a help text says its default already (`unset = ...`, `default: ...`)."""
    return "default" in text.lower() or "unset" in text.lower()


def setting_help(name: str) -> str:
    """The help of the flag of setting `name`: its description and its default."""
    field = Settings.model_fields[name]
    text = field.description or ""
    if field.default_factory is not None or _says_default(text):
        return text
    value = field.default
    if value is None or value is PydanticUndefined:
        return f"{text} (default: unset)"
    if isinstance(value, float):  # seconds; whole days as the durations are written (7d)
        days = value / 86_400
        shown = f"{days:g}d" if days >= 1 and days.is_integer() else f"{value:g}"
    else:
        shown = str(value)
    return f"{text} (default: {shown})"


def argument_default(action: argparse.Action) -> str | None:
    """An argparse default worth saying in the help, or None (none, a switch's False, or one
    the help says already)."""
    default = action.default  # by identity: 0 is a default to say, False (a switch) is not
    if default is None or default is False or default == argparse.SUPPRESS or action.nargs == 0:
        return None
    if action.help in (None, argparse.SUPPRESS) or _says_default(action.help):
        return None
    return str(action.default)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (the grouped command list); a flag's default said
    after its help."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        if text is None or argument_default(action) is None:
            return text
        return f"{text} (default: %(default)s)"


def grouped_commands(helps: Iterable[tuple[str, str]]) -> str:
    """The commands (name, help) in COMMAND_GROUPS' groups and order, one line each."""
    by_name = dict(helps)
    grouped = {n for names in COMMAND_GROUPS.values() for n in names}
    groups = [*COMMAND_GROUPS.items(), ("other", tuple(n for n in by_name if n not in grouped))]
    lines = ["commands:"]
    for title, names in groups:
        present = [n for n in names if n in by_name]
        if not present:
            continue
        lines.append(f"  {title}:")
        for name in present:
            lead = f"    {name:<{NAME_WIDTH}} "
            wrapped = textwrap.wrap(
                by_name[name], WIDTH, initial_indent=lead, subsequent_indent=" " * len(lead)
            )
            lines += wrapped or [lead.rstrip()]
    lines.append("")
    lines.append("`COMMAND --help` shows its flags and their defaults.")
    return "\n".join(lines)


def command_helps(sub: argparse._SubParsersAction[Parser]) -> list[tuple[str, str]]:
    """(name, help) of each command added to `sub`, in the order they were added."""
    return [(a.dest, a.help or "") for a in sub._choices_actions]
