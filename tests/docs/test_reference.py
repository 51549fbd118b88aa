"""docs/reference.md's settings, CLI and metrics tables are what scripts/gen-reference writes
from the code: a setting, command, flag or metric added without rerunning it fails here."""

from __future__ import annotations

import difflib
import inspect
import re

import pytest

import pgq_supervisor as pgq
from tests.support.reference import REFERENCE, render


def test_the_reference_tables_match_the_code() -> None:
    current = REFERENCE.read_text(encoding="utf-8")
    fresh = render(current)
    if fresh != current:
        diff = "".join(
            difflib.unified_diff(
                current.splitlines(keepends=True),
                fresh.splitlines(keepends=True),
                "docs/reference.md",
                "what scripts/gen-reference writes",
                n=0,
            )
        )
        pytest.fail(f"docs/reference.md is stale: run scripts/gen-reference\n{diff}", pytrace=False)


def test_a_table_without_its_markers_is_an_error() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    cut = text.replace("<!-- end generated: metrics -->", "")
    with pytest.raises(ValueError, match=r"lacks the markers of \['metrics'\]"):
        render(cut)


def test_every_public_function_is_in_the_reference() -> None:
    """Each function `import pgq_supervisor as pgq` offers (a sync call, its async twin) is
    named in docs/reference.md's text."""
    text = REFERENCE.read_text(encoding="utf-8")
    functions = [n for n in pgq.__all__ if inspect.isfunction(getattr(pgq, n))]
    missing = [n for n in functions if not re.search(rf"\b{n}\b", text)]
    assert functions and missing == [], f"docs/reference.md does not name {missing}"
