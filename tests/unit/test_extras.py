"""The optional extras of pyproject.toml bring what their doors import (issue 36: the
`sqlalchemy` extra lacked greenlet, so the documented AsyncSession door failed to import)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _extra(name: str) -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    return [Requirement(r) for r in project["optional-dependencies"][name]]


def brings_greenlet(requirements: list[Requirement]) -> bool:
    """greenlet itself, or SQLAlchemy's asyncio extra, which requires it."""
    return any(
        r.name == "greenlet" or (r.name.lower() == "sqlalchemy" and "asyncio" in r.extras)
        for r in requirements
    )


def test_the_sqlalchemy_extra_brings_greenlet_for_async_sessions() -> None:
    assert brings_greenlet(_extra("sqlalchemy"))
    assert brings_greenlet(_extra("dev"))  # the suite tests that door with what users get


def test_a_plain_sqlalchemy_requirement_does_not_count() -> None:
    assert not brings_greenlet([Requirement("sqlalchemy>=2"), Requirement("fastapi")])
    assert brings_greenlet([Requirement("SQLAlchemy[asyncio]>=2")])
