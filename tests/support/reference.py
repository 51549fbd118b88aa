"""The generated tables of docs/reference.md: settings (the pydantic Settings fields), CLI
commands and flags (the argparse parser) and metrics (the supervisor's Prometheus registry).

`python -m tests.support.reference` (what scripts/gen-reference runs) rewrites the text between
each pair of marker comments; tests/docs/test_reference.py fails when the file differs from
what it would write. Everything is read from the code, so a new setting, command, flag or
metric needs no hand edit here: give it a description, a help= or a documentation string.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase
from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from pgq_supervisor.cli import build_parser
from pgq_supervisor.cli_help import COMMAND_GROUPS, argument_default
from pgq_supervisor.settings import Settings
from pgq_supervisor.supervisor.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference.md"
MARKS = re.compile(
    r"(<!-- generated: (?P<name>[a-z]+) \(scripts/gen-reference\) -->\n)"
    r".*?"
    r"(<!-- end generated: (?P=name) -->)",
    flags=re.S,
)


def _cell(text: str) -> str:
    """Text fit for one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        a.option_strings[0] if a.option_strings else a.dest: a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction)
    }


def _run_flags() -> dict[str, str]:
    """Setting name -> the `run` flag that sets it."""
    for name, _, sub in _subcommands(build_parser()):
        if name == "run":
            return {a.dest: a.option_strings[0] for a in sub._actions if a.option_strings}
    return {}


def _env_name(name: str, field: FieldInfo) -> tuple[str, str]:
    """(the setting's name for people, its environment variable)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        choices = [c for c in alias.choices if isinstance(c, str)]
        env = next((c for c in choices if c.startswith("PGQ_")), f"PGQ_{name.upper()}")
        shown = next((c for c in choices if not c.startswith("PGQ_")), name)
        return shown, env
    return name, f"PGQ_{name.upper()}"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "computed at start"
    value = field.default
    if value is PydanticUndefined or value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def settings_table() -> str:
    flags = _run_flags()
    rows = [
        "| setting | environment | flag of `run` | default | description |",
        "|---|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        shown, env = _env_name(name, field)
        flag = f"`{flags[name]}`" if name in flags else "—"
        description = _cell(field.description or "")
        rows.append(f"| `{shown}` | `{env}` | {flag} | {_default(field)} | {description} |")
    return "\n".join(rows) + "\n"


def _argument(action: argparse.Action) -> str:
    metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    if not action.option_strings:
        return f"`{metavar.upper()}`"
    flag = ", ".join(action.option_strings)
    return f"`{flag} {metavar}`" if action.nargs != 0 else f"`{flag}`"


def _help(action: argparse.Action, settings_help: dict[str, str]) -> str:
    text = action.help if action.help not in (None, argparse.SUPPRESS) else ""
    text = text or settings_help.get(action.dest, "")
    text = text.replace("%(default)s", str(action.default)).replace("%%", "%")
    if (default := argument_default(action)) is not None:  # as --help says it
        text += f" (default: {default})"
    if action.choices is not None and "|" not in text:
        text = (text + "; " if text else "") + "one of " + ", ".join(map(str, action.choices))
    return _cell(text)


def cli_tables() -> str:
    settings_help = {n: f.description or "" for n, f in Settings.model_fields.items()}
    # in the groups of `--help`
    order = [name for names in COMMAND_GROUPS.values() for name in names]
    commands = sorted(_subcommands(build_parser()), key=lambda c: order.index(c[0]))
    group = {name: title for title, names in COMMAND_GROUPS.items() for name in names}
    per_command = [_flags(sub) for _, _, sub in commands]
    common = set.intersection(*(set(f) for f in per_command)) if per_command else set()
    out = ["Every command takes these flags:", "", "| flag | help |", "|---|---|"]
    first = per_command[0] if per_command else {}
    for key in sorted(common, key=list(first).index):
        out.append(f"| {_argument(first[key])} | {_help(first[key], settings_help)} |")
    out += ["", "| group | command | what it does |", "|---|---|---|"]
    out += [
        f"| {group[name]} | [`{name}`](#{name}) | {_cell(text)} |" for name, text, _ in commands
    ]
    for (name, text, _), flags in zip(commands, per_command, strict=True):
        out += ["", f"### {name}", "", _cell(text) or "—", ""]
        own = [a for key, a in flags.items() if key not in common]
        if not own:
            out.append("No flags of its own.")
            continue
        out += ["| argument | help |", "|---|---|"]
        out += [f"| {_argument(a)} | {_help(a, settings_help)} |" for a in own]
    return "\n".join(out) + "\n"


def metrics_table() -> str:
    registry = Metrics().registry
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for collector in registry._collector_to_names:
        if isinstance(collector, MetricWrapperBase):
            kind, doc = collector._type, collector._documentation
            name = collector._name + ("_total" if kind == "counter" else "")
            names: tuple[str, ...] = collector._labelnames
        else:  # a custom collector (e.g. the job durations the children report in buckets)
            for family in collector.collect():
                kind, doc, name = family.type, family.documentation, family.name
                names = tuple(getattr(family, "_labelnames", ()))
                break
            else:
                continue
        labels = ", ".join(f"`{label}`" for label in names)
        rows.append(f"| `{name}` | {kind} | {labels} | {_cell(doc)} |")
    return "\n".join(rows) + "\n"


TABLES: dict[str, Callable[[], str]] = {
    "settings": settings_table,
    "cli": cli_tables,
    "metrics": metrics_table,
}


def render(text: str) -> str:
    """`text` (docs/reference.md) with every generated part rewritten from the code."""
    seen: set[str] = set()

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"docs/reference.md names an unknown generated table {name!r}")
        seen.add(name)
        return f"{match[1]}{TABLES[name]()}{match[3]}"

    out = MARKS.sub(fill, text)
    if missing := set(TABLES) - seen:
        raise ValueError(f"docs/reference.md lacks the markers of {sorted(missing)}")
    return out


def main() -> int:
    current = REFERENCE.read_text(encoding="utf-8")
    fresh = render(current)
    if fresh != current:
        REFERENCE.write_text(fresh, encoding="utf-8")
        print(f"wrote {REFERENCE.relative_to(ROOT)}")
    else:
        print(f"{REFERENCE.relative_to(ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
