"""The code blocks of a README section, for tests that run them as written."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(heading: str, lang: str) -> list[str]:
    """The ```lang blocks of the README section titled `heading` (any level), up to the next
    heading (a `#` line outside a code block)."""
    found: list[str] = []
    inside, fence, current = False, None, list[str]()
    for line in README.read_text(encoding="utf-8").splitlines(keepends=True):
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
