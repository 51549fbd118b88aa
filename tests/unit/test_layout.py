"""The package's layout holds (issue 21): no import cycle among pgq_supervisor's modules,
and no module longer than MAX_LINES but the few listed, each with why.

An import is an edge wherever it is (module level or inside a function: a lazy import only
hides a cycle until the function runs), except under `if TYPE_CHECKING:`. Importing a.b.c
also runs the __init__ of every package above it that the importer is not itself inside.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pgq_supervisor

PACKAGE = Path(pgq_supervisor.__file__).parent
MAX_LINES = 450
# Over MAX_LINES, and why; an entry whose module has become short fails the last test.
LONG_MODULES: dict[str, str] = {}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield from _runtime_imports(ast.Module(body=[stmt], type_ignores=[]))
        else:
            yield from _runtime_imports(child)


def import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules of `sources` it imports; `sources` maps each dotted name to its
    source and whether it is a package's __init__."""
    graph: dict[str, set[str]] = {}
    for module, (text, is_package) in sources.items():
        package = module if is_package else module.rpartition(".")[0]
        edges: set[str] = set()
        for node in _runtime_imports(ast.parse(text)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base
                    for a in node.names
                ]
            for target in targets:
                while target and target not in sources:
                    target = target.rpartition(".")[0]
                parents = target.split(".")
                for i in range(1, len(parents) + 1):
                    above = ".".join(parents[:i])
                    inside = module == above or module.startswith(above + ".")
                    if above in sources and (above == target or not inside):
                        edges.add(above)
        edges.discard(module)
        graph[module] = edges
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_sources() -> dict[str, tuple[str, bool]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        out[name] = (path.read_text(), is_package)
    return out


def line_counts() -> dict[str, int]:
    return {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_import_cycle_in_the_package() -> None:
    found = cycles(import_graph(package_sources()))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_a_function_level_import_makes_a_cycle_and_type_checking_does_not() -> None:
    lazy = {
        "p": ("", True),
        "p.a": ("import p.b\n", False),
        "p.b": ("def f():\n    from p.a import x\n", False),
    }
    assert cycles(import_graph(lazy)) == [["p.a", "p.b"]]
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n"
    typing_only = {**lazy, "p.b": (guarded, False)}
    assert cycles(import_graph(typing_only)) == []


def test_a_cycle_through_a_package_init_is_seen() -> None:
    sources = {
        "p": ("", True),
        "p.q": ("from p.q.loop import Loop\n", True),
        "p.q.loop": ("from p.r import helper\n", False),
        "p.r": ("from p.q.part import X\n", False),  # runs p.q's __init__ first
        "p.q.part": ("X = 1\n", False),
    }
    assert cycles(import_graph(sources)) == [["p.q", "p.q.loop", "p.r"]]


def test_modules_are_short() -> None:
    long = {
        name: n for name, n in line_counts().items() if n > MAX_LINES and name not in LONG_MODULES
    }
    assert not long, f"over {MAX_LINES} lines (split them, or list them with a reason): {long}"


def test_every_long_module_exception_is_still_needed() -> None:
    counts = line_counts()
    stale = [name for name in LONG_MODULES if counts.get(name, 0) <= MAX_LINES]
    assert not stale, f"not over {MAX_LINES} lines (or gone), drop from LONG_MODULES: {stale}"
