"""The supervisor's periodic INFO summary of what its children did.

Per-job start and success lines are DEBUG: at tens of thousands of jobs per second, two log
lines per job cost about a third of the throughput. Retries stay WARNING and failures ERROR,
each with id, type, attempt and error. What a person watching the default log wants in between
is this: every `interval` seconds, one line per supervisor with the jobs ended since the last
line, their rate, and counts per type and outcome. A workflow's sleep, wait or step retry ends
its run but not its job: those are counted apart, as workflow pauses. Nothing is logged while
nothing happens.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from pgq_supervisor.display import per_second, plural
from pgq_supervisor.jobs import OutcomeKind

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ActivityResult:
    ended: int
    seconds: float
    line: str | None  # what was logged, None when nothing ended


class ActivitySummary:
    def __init__(self, interval: float, now: float) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.interval = interval
        self._since = now
        self._counts: Counter[tuple[str, str]] = Counter()

    def record(self, ended: Iterable[tuple[str, str, int]]) -> None:
        """Attempts ended as children report them (ipc.Report.ended): (type, kind, count)."""
        for type_, kind, n in ended:
            self._counts[(type_, kind)] += n

    def due(self, now: float) -> bool:
        return now - self._since >= self.interval

    def run_once(self, now: float) -> ActivityResult:
        """Log the summary of the period that ends now and start the next one."""
        seconds = max(now - self._since, 1e-9)
        counts, self._counts, self._since = self._counts, Counter(), now
        paused = {t: n for (t, kind), n in counts.items() if kind == OutcomeKind.SUSPENDED}
        ended = sum(counts.values()) - sum(paused.values())
        if not ended and not paused:
            return ActivityResult(0, seconds, None)
        per_type: dict[str, list[str]] = {}
        for (type_, kind), n in sorted(counts.items()):
            if kind != OutcomeKind.SUSPENDED:
                per_type.setdefault(type_, []).append(f"{n:,} {kind}")
        if ended:
            rate = per_second(ended, seconds)
            detail = "; ".join(f"{t}: {', '.join(parts)}" for t, parts in per_type.items())
            line = f"{plural(ended, 'job')} ended in {seconds:.0f} s"
            line += (f" ({rate})" if rate else "") + f": {detail}"
        else:
            line = f"no job ended in {seconds:.0f} s"
        if paused:
            line += (
                f"; {plural(sum(paused.values()), 'workflow pause')} (a sleep, a wait or a"
                f" step's retry): {', '.join(f'{t}: {n}' for t, n in sorted(paused.items()))}"
            )
        log.info("%s", line)
        return ActivityResult(ended, seconds, line)
