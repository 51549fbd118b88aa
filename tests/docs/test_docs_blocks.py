"""Every ```python and ```sh block of README.md and docs/*.md runs as written (the convention is
in tests/support/docblocks.py and docs/testing.md): one test per file, its blocks in order, in
one temporary directory against one fresh migrated database."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.docblocks import ROOT, DocError, doc_files, parse, run_block, run_file


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_blocks_of_a_doc_run_as_written(
    path: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    try:
        runs = any(block.kind in ("python", "shell") for block in parse(path))
        # a fresh database only for a page with something to run (it costs a second or two)
        dsn = str(request.getfixturevalue("dsn")) if runs else "dbname=unused"
        run_file(path, tmp_path, dsn)
    except DocError as exc:
        pytest.fail(str(exc), pytrace=False)


def test_the_readme_hello_world_runs_with_nothing_set_up(tmp_path: Path) -> None:
    """Zero setup: the hello world's blocks as written, with no PGQ_DSN (the embedded server,
    started on first use by the CLI, the supervisor and pgq.connect())."""
    readme = ROOT / "README.md"
    lines = readme.read_text(encoding="utf-8").splitlines()
    start = lines.index("## Hello world") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("## ")) + 1
    blocks = [b for b in parse(readme) if start < b.line < end]
    assert [b.kind for b in blocks] == ["not-run", "file", "file", "shell"]
    try:
        outputs = [run_block(block, tmp_path, None) for block in blocks]
    except DocError as exc:
        pytest.fail(str(exc), pytrace=False)
    assert "hello, world" in outputs[-1]
    assert (tmp_path / ".pgq" / "pgdata" / "PG_VERSION").exists()


def _doc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_block_in_another_language_must_be_marked(tmp_path: Path) -> None:
    doc = _doc(tmp_path, "intro\n\n```yaml\na: 1\n```\n")
    with pytest.raises(DocError, match=r"page.md:3: ```yaml is neither run nor marked"):
        parse(doc)


def test_a_block_without_a_language_must_be_marked(tmp_path: Path) -> None:
    with pytest.raises(DocError, match=r"page.md:1: a ``` block without a language"):
        parse(_doc(tmp_path, "```\nx\n```\n"))


def test_not_run_needs_its_reason(tmp_path: Path) -> None:
    for mark in ("<!-- not-run -->", "<!-- not-run: -->"):
        with pytest.raises(DocError, match=r"page.md:2: <!-- not-run: WHY --> needs its reason"):
            parse(_doc(tmp_path, f"{mark}\n```sh\nkubectl apply -k .\n```\n"))


def test_marks_and_kinds(tmp_path: Path) -> None:
    doc = _doc(
        tmp_path,
        "<!-- file: app.py -->\n```python\nX = 1\n```\n"
        "<!-- not-run: needs Kubernetes -->\n```yaml\nkind: Pod\n```\n"
        "```text\noutput\n```\n```sh\necho hi\n```\n```bash\necho hi\n```\n```python\npass\n```\n",
    )
    kinds = [(b.line, b.kind, b.arg) for b in parse(doc)]
    assert kinds == [
        (2, "file", "app.py"),
        (6, "not-run", "needs Kubernetes"),
        (9, "text", ""),
        (12, "shell", ""),
        (15, "shell", ""),
        (18, "python", ""),
    ]


def test_a_failing_block_names_its_file_line_and_output(tmp_path: Path) -> None:
    doc = _doc(
        tmp_path,
        "<!-- file: app.py -->\n```python\nGREETING = 'hi'\n```\n\n"
        "```python\nimport app, os\nprint(app.GREETING, os.environ['PGQ_DSN'])\n```\n\n"
        "```sh\necho before\nfalse\necho after\n```\n",
    )
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(DocError) as failed:
        run_file(doc, work, "dbname=x")
    message = str(failed.value)
    assert message.startswith(f"{doc}:11: the ```sh block exited 1; its output:\nbefore\n")
    assert "after" not in message
    assert (work / "app.py").read_text() == "GREETING = 'hi'\n"


def test_a_block_that_leaves_a_process_running_fails(tmp_path: Path) -> None:
    doc = _doc(tmp_path, "```sh\nsleep 300 &\necho started\n```\n")
    with pytest.raises(DocError, match=r"page.md:1: .* left processes running"):
        run_file(doc, tmp_path, "dbname=x", grace=0.5)
