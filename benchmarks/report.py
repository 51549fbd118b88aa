"""Figures, their targets (issue 5), the table and the JSON file."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Json = None | bool | int | float | str | list["Json"] | dict[str, "Json"]


@dataclass(frozen=True, slots=True)
class Target:
    op: Literal[">=", "<="]
    value: float

    def met(self, x: float) -> bool:
        return x >= self.value if self.op == ">=" else x <= self.value

    def __str__(self) -> str:
        return f"{'≥' if self.op == '>=' else '≤'} {self.value:g}"

    def to_json(self) -> dict[str, Json]:
        return {"op": self.op, "value": self.value}


@dataclass
class Measure:
    """One figure: a value per run, reported as their median."""

    key: str
    label: str
    unit: str  # "jobs/s", "ms", "MiB"; ratios use "x"
    target: Target | None = None
    values: list[float] = field(default_factory=list)
    details: list[dict[str, Json]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one per failed run, or why none ran

    def add(self, value: float, details: dict[str, Json] | None = None) -> None:
        self.values.append(value)
        self.details.append(details or {})

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    def to_json(self) -> dict[str, Json]:
        return {
            "label": self.label,
            "unit": self.unit,
            "median": self.median,
            "values": list(self.values),
            "target": None if self.target is None else self.target.to_json(),
            "met": None
            if self.target is None or self.median is None
            else self.target.met(self.median),
            "errors": list(self.errors),
            "details": list(self.details),
        }


@dataclass(frozen=True, slots=True)
class Ratio:
    """median(num) / median(den); with several `num` keys the best of them is the numerator."""

    label: str
    num: tuple[str, ...]
    den: str
    target: Target | None = None


@dataclass
class Results:
    measures: dict[str, Measure] = field(default_factory=dict)
    ratios: list[Ratio] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def measure(self, key: str, label: str, unit: str, target: Target | None = None) -> Measure:
        if key not in self.measures:
            self.measures[key] = Measure(key, label, unit, target)
        return self.measures[key]

    def ratio_value(self, r: Ratio) -> tuple[float | None, str]:
        """The ratio and which numerator it used ("" when it cannot be computed)."""
        nums = [(self.measures[k].median, k) for k in r.num if k in self.measures]
        nums_known = [(v, k) for v, k in nums if v is not None]
        den = self.measures.get(r.den)
        if not nums_known or den is None or not den.median:
            return None, ""
        value, key = max(nums_known)
        return value / den.median, key

    def to_json(self) -> dict[str, Json]:
        ratios: list[Json] = []
        for r in self.ratios:
            if r.den not in self.measures:
                continue  # its group did not run
            value, used = self.ratio_value(r)
            ratios.append(
                {
                    "label": r.label,
                    "numerator": used or list(r.num),
                    "denominator": r.den,
                    "value": value,
                    "target": None if r.target is None else r.target.to_json(),
                    "met": None if r.target is None or value is None else r.target.met(value),
                }
            )
        return {
            "measures": {k: m.to_json() for k, m in self.measures.items()},
            "ratios": ratios,
            "notes": list(self.notes),
        }


def fmt(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "-"
    if unit in ("jobs/s", "B/job", "tuples"):
        return f"{value:,.0f}"
    if unit == "x":
        return f"{value:.2f}"
    if unit == "ms":
        return f"{value:.2f}" if value < 100 else f"{value:,.0f}"
    return f"{value:,.1f}"


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    median: str
    unit: str
    runs: str
    verdict: str
    is_ratio: bool = False


def rows(results: Results, order: Sequence[str | Ratio]) -> list[Row]:
    """Each measure in `order` that was taken (or failed), and each computable ratio."""
    out: list[Row] = []
    for item in order:
        if isinstance(item, Ratio):
            value, used = results.ratio_value(item)
            if value is None:
                continue
            label = item.label
            if len(item.num) > 1 and used:
                label += f" (best: {results.measures[used].label.rsplit(', ', 1)[-1]})"
            out.append(Row(label, fmt(value, "x"), "x", "", _verdict(item.target, value), True))
            continue
        m = results.measures.get(item)
        if m is None:
            continue
        if m.errors and not m.values:
            out.append(Row(m.label, "n/a", "", "", f"not measured: {m.errors[0]}"))
            continue
        runs = " / ".join(fmt(v, m.unit) for v in m.values)
        if m.errors:
            runs += f" + {len(m.errors)} failed (see JSON)"
        out.append(Row(m.label, fmt(m.median, m.unit), m.unit, runs, _verdict(m.target, m.median)))
    return out


def table(results: Results, order: Sequence[str | Ratio]) -> str:
    """A plain-text table; each ratio sits right under the figures it compares."""
    head = Row("measure", "median", "unit", "runs", "target")
    body = rows(results, order)
    cells = [
        (("  " if r.is_ratio else "") + r.label, r.median, r.unit, r.runs, r.verdict)
        for r in [head, *body]
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = []
    for i, c in enumerate(cells):
        line = "  ".join(
            [
                c[0].ljust(widths[0]),
                c[1].rjust(widths[1]),
                c[2].ljust(widths[2]),
                c[3].ljust(widths[3]),
                c[4],
            ]
        )
        lines.append(line.rstrip())
        if i == 0:
            lines.append("-" * max(len(x) for x in lines))
    return "\n".join(lines)


def markdown(results: Results, order: Sequence[str | Ratio]) -> str:
    """The same table in markdown, for the README's Performance section."""
    out = ["| measure | median | runs | target |", "|---|---:|---|---|"]
    for r in rows(results, order):
        label = f"↳ {r.label}" if r.is_ratio else r.label
        median = f"{r.median}x" if r.is_ratio else f"{r.median} {r.unit}".strip()
        out.append(f"| {label} | {median} | {r.runs} | {r.verdict} |")
    return "\n".join(out)


def _verdict(target: Target | None, value: float | None) -> str:
    if target is None:
        return ""
    if value is None:
        return str(target)
    return f"{target}  {'ok' if target.met(value) else 'MISSED'}"


def write_json(path: Path, document: dict[str, Json]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
