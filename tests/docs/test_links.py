"""Every relative link of README.md and docs/*.md points at a file of the checkout: pages move
(the README became a front door with docs/ pages) and a link left behind is a dead end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.docblocks import ROOT

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def dead_links(page: Path) -> list[str]:
    """The relative link targets of `page` that name no file (web addresses are not checked)."""
    targets = LINK.findall(page.read_text(encoding="utf-8"))
    return [t for t in targets if "://" not in t and not (page.parent / t).exists()]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files(page: Path) -> None:
    assert dead_links(page) == []


def test_a_dead_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x", encoding="utf-8")
    page.write_text("[a](there.md) [b](missing.md#part) [c](https://example.org/x)", "utf-8")
    assert dead_links(page) == ["missing.md"]
