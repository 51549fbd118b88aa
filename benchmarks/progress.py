"""Progress of a run: one line per step on stderr, and where each step records a failure."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from benchmarks.report import Measure


@dataclass
class Step:
    label: str
    action: Callable[[], str]  # does the work, records figures, returns what to print
    measures: tuple[Measure, ...]  # where a failure is recorded


class Progress:
    """One line per step on stderr: its number, its label, then its result or failure."""

    def __init__(self, total: int, out: TextIO = sys.stderr) -> None:
        self.total = total
        self.done = 0
        self.out = out
        self.width = len(str(total))

    def run(self, step: Step) -> None:
        self.done += 1
        self.out.write(f"[{self.done:>{self.width}}/{self.total}] {step.label} … ")
        self.out.flush()
        start = time.monotonic()
        load = os.getloadavg()[0]
        counts = [len(m.values) for m in step.measures]
        try:
            text = step.action()
        except KeyboardInterrupt:
            for m in step.measures:
                m.errors.append("interrupted")
            self.out.write("interrupted\n")
            raise
        except Exception as exc:  # one failed step must not lose the rest of the run
            first = (str(exc).strip().splitlines() or [""])[0]
            reason = f"{type(exc).__name__}: {first}"
            for m in step.measures:
                m.errors.append(reason)
            text = f"FAILED: {reason}"
        for m, before in zip(step.measures, counts, strict=True):
            if len(m.values) > before:  # what else ran on the machine meanwhile
                m.details[-1]["load1_at_start"] = round(load, 2)
        self.out.write(f"{text}  ({time.monotonic() - start:.1f} s)\n")
        self.out.flush()
