"""The code blocks of a section of the README or of docs/*.md, for tests that run them as
written beyond what the docs runner (tests/docs/) checks."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def doc_texts() -> list[str]:
    """README.md and every docs/*.md (drafts docs/_*.md too), each as text."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [p.read_text(encoding="utf-8") for p in paths]


def blocks(heading: str, lang: str) -> list[str]:
    """The ```lang blocks of the section titled `heading` (any level, in any of the docs), up
    to the next heading (a `#` line outside a code block)."""
    found: list[str] = []
    for text in doc_texts():
        inside, fence, current = False, None, list[str]()
        for line in text.splitlines(keepends=True):
            if fence is None and line.startswith("#"):
                inside = line.lstrip("#").strip() == heading
            elif line.startswith("```"):
                if fence is None:
                    fence, current = line[3:].strip(), []
                else:
                    if inside and fence == lang:
                        found.append("".join(current))
                    fence = None
            elif fence is not None:
                current.append(line)
    return found
