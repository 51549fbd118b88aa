"""The code blocks of README.md and docs/*.md, run as a reader would run them.

The convention (written in docs/testing.md):
- the blocks of one file run in order, in one fresh temporary directory (the cwd, also on
  PYTHONPATH), with one fresh migrated database whose DSN is in `PGQ_DSN`;
- ```python blocks run as standalone scripts with the venv's python; ```sh and ```bash blocks
  with `bash -euo pipefail`, the venv's bin first on PATH;
- `<!-- file: NAME -->` on the line right before a fence writes the block to NAME instead;
- `<!-- not-run: WHY -->` on the line right before a fence skips it, and WHY is required;
- ```text blocks (sample output) are never run;
- any other block (another language, or none) must carry one of the two marks.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
Kind = Literal["python", "shell", "file", "not-run", "text"]
RUN_LANGS: dict[str, Kind] = {"python": "python", "sh": "shell", "bash": "shell"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<lang>[^`\s]*)[^`]*$")
MARK = re.compile(r"^\s*<!--\s*(?P<kind>file|not-run)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")
BLOCK_TIMEOUT = 120.0  # seconds: far beyond what any block takes on a loaded two-core machine


class DocError(Exception):
    """A block that breaks the convention, or one that failed: the message names file:line."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    kind: Kind
    code: str
    arg: str = ""  # the file name of `file`, the reason of `not-run`

    @property
    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def doc_files() -> list[Path]:
    """README.md and every docs/*.md, the files whose blocks the suite runs; docs/_*.md are
    drafts waiting to be folded into a page, not run."""
    pages = [p for p in sorted((ROOT / "docs").glob("*.md")) if not p.name.startswith("_")]
    return [ROOT / "README.md", *pages]


def parse(path: Path) -> list[Block]:
    """Every fenced block of `path`, classified; DocError for one that breaks the convention."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, ticks, lang = opening["indent"], opening["ticks"], opening["lang"].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(ticks) and lines[i].strip().strip("`") == ""
        ):
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        if i == len(lines):
            raise DocError(f"{_shown(path)}:{start + 1}: a code block that is never closed")
        i += 1
        mark = MARK.match(lines[start - 1]) if start > 0 else None
        blocks.append(_classify(path, start + 1, lang, "\n".join(body) + "\n", mark))
    return blocks


def _classify(path: Path, line: int, lang: str, code: str, mark: re.Match[str] | None) -> Block:
    where = f"{_shown(path)}:{line}"
    if mark is not None:
        kind, arg = mark["kind"], (mark["arg"] or "").strip()
        if kind == "not-run":
            if not arg:
                raise DocError(f"{where}: <!-- not-run: WHY --> needs its reason")
            return Block(path, line, lang, "not-run", code, arg)
        if not arg or "/" in arg or arg.startswith("."):
            raise DocError(f"{where}: <!-- file: NAME --> needs a plain file name, got {arg!r}")
        return Block(path, line, lang, "file", code, arg)
    if lang == "text":
        return Block(path, line, lang, "text", code)
    if lang in RUN_LANGS:
        return Block(path, line, lang, RUN_LANGS[lang], code)
    shown = f"```{lang}" if lang else "a ``` block without a language"
    raise DocError(
        f"{where}: {shown} is neither run nor marked: use ```python, ```sh or ```text, or put"
        " <!-- file: NAME --> or <!-- not-run: WHY --> on the line before it"
    )


def _env(workdir: Path, dsn: str | None) -> dict[str, str]:
    """`dsn` None: no PGQ_DSN, as on a machine with nothing set up; the embedded server's
    data then goes in the work directory, not in a project or the user's home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQ_")}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(workdir)
    if dsn is None:
        env["PGQ_EMBEDDED_DIR"] = str(workdir / ".pgq" / "pgdata")
    else:
        env["PGQ_DSN"] = dsn
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_block(block: Block, workdir: Path, dsn: str | None, grace: float = 10.0) -> str:
    """Run one block in `workdir`; its output, or DocError naming file:line with the output.
    Each run is its own process group, killed after the block: a block that fails half-way
    leaves no supervisor behind. A process of the block still alive `grace` seconds after it
    ended fails it."""
    if block.kind == "file":
        (workdir / block.arg).write_text(block.code, encoding="utf-8")
        return ""
    if block.kind in ("not-run", "text"):
        return ""
    if block.kind == "python":
        script = workdir / f"_doc_{block.path.stem}_{block.line}.py"
        script.write_text(block.code, encoding="utf-8")
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    # output to a file, not a pipe: a background process a block forgot to stop would hold a
    # pipe open, and reading it would wait for that process rather than the block
    log = workdir / f"_doc_{block.path.stem}_{block.line}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            argv, cwd=workdir, env=_env(workdir, dsn), stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=BLOCK_TIMEOUT)
            failed = f"exited {code}" if code else ""
            if not failed and _group_alive(proc.pid, grace):
                failed = "ended but left processes running (a block stops what it starts)"
        except subprocess.TimeoutExpired:
            failed = f"was still running after {BLOCK_TIMEOUT:g} s"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text(errors="replace")
    if failed:
        raise DocError(f"{block.where}: the ```{block.lang} block {failed}; its output:\n{text}")
    return text


def _group_alive(pgid: int, grace: float) -> bool:
    """Whether processes of the group outlive `grace` seconds (a supervisor's fork server
    exits a moment after the supervisor that stopped it)."""
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)  # polling the group with a deadline


def run_file(path: Path, workdir: Path, dsn: str, grace: float = 10.0) -> list[tuple[Block, str]]:
    """Every block of `path` in order, in `workdir` against `dsn`: each block and its output."""
    return [(block, run_block(block, workdir, dsn, grace)) for block in parse(path)]
