"""The statements of sql/queries.sql against the types of the db package: parameters by name,
and the parts succeed_and_claim shares with succeed and claim."""

from __future__ import annotations

import re
from typing import get_type_hints

from pgq_supervisor import sql
from pgq_supervisor.db import params, rows, web_rows

PARAMS = {**params.PARAMS, **web_rows.PARAMS}


def _text(name: str) -> str:
    return sql.query(name, "pgq").as_string(None)


def test_every_statement_has_a_parameter_type() -> None:
    assert set(PARAMS) == sql.query_names()


# enqueue and enqueue_unique share their row type; the plain insert has no unique_key
UNUSED: dict[str, set[str]] = {}  # statements that take a field of their type without using it


def test_parameter_types_name_exactly_the_placeholders() -> None:
    for name, typed in PARAMS.items():
        placeholders = set(re.findall(r"%\((\w+)\)s", _text(name)))
        assert placeholders == set(get_type_hints(typed)) - UNUSED.get(name, set()), name


def test_every_row_type_is_for_a_statement() -> None:
    assert set(rows.ROWS) | set(web_rows.ROWS) <= sql.query_names()


def _without_comments(text: str) -> str:
    lines = [line.split("--", 1)[0].rstrip() for line in text.splitlines()]
    return re.sub(r"\s+", " ", "\n".join(lines)).strip()


def _cte(text: str, name: str) -> str:
    """The body of `name AS (...)`, parentheses matched."""
    start = text.index(f"{name} AS (") + len(f"{name} AS (")
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip()
    raise AssertionError(f"unbalanced CTE {name}")


def test_succeed_and_claim_runs_the_very_updates_of_succeed_and_claim() -> None:
    both = _without_comments(_text("succeed_and_claim"))
    succeed = _without_comments(_text("succeed"))
    claim = _without_comments(_text("claim"))
    for cte in ("gone", "updated", "done", "sent"):
        assert _cte(both, cte) == _cte(succeed, cte), cte
    # the claim, but for the always-true filter that runs the completion before claim_pick
    pick = "%(lease)s::uuid))::uuid[])"
    after_done = "%(lease)s::uuid) WHERE (SELECT count(*) FROM done) >= 0)::uuid[])"
    assert _cte(both, "claimed") == _cte(claim, "claimed").replace(pick, after_done)
    # and both give the batch the same order
    order = "ORDER BY c.priority DESC, c.turn, c.created_at, c.id"
    assert claim.endswith(order) and f"FROM claimed c) c {order}) c" in both
