"""Administrative CLI commands (status, depth, jobs, retry, cancel, purge)."""

from __future__ import annotations

import argparse
from typing import TypeVar

COMMANDS: tuple[str, ...] = ()

Parser = TypeVar("Parser", bound=argparse.ArgumentParser)


def add_commands(sub: argparse._SubParsersAction[Parser], common: Parser) -> None:
    """Register the admin subcommands; each sets `handler(args, settings) -> exit code`."""
