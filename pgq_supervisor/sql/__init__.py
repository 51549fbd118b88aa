"""Loads the named statements of queries.sql and binds them to a schema with psycopg.sql."""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import LiteralString

from psycopg import sql

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def _raw_queries() -> dict[str, str]:
    text = resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME_RE.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def query_names() -> frozenset[str]:
    return frozenset(_raw_queries())


@functools.cache
def query(name: str, schema: str) -> sql.Composed:
    """The statement `name` with `{schema}` bound to the quoted identifier `schema`."""
    # The text comes from our own packaged file, never from input: it is a literal in all but name.
    text: LiteralString = _raw_queries()[name]
    return sql.SQL(_strip_comments(text)).format(schema=sql.Identifier(schema))


def _strip_comments(text: LiteralString) -> LiteralString:
    """Leading comment lines of a block: documentation, not part of the statement."""
    lines = text.splitlines()
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    return "\n".join(lines)


@functools.cache
def query_bytes(name: str, schema: str) -> bytes:
    """`query` rendered once: composing the statement on every execution costs microseconds
    that the hot path does not have."""
    return query(name, schema).as_bytes(None)
