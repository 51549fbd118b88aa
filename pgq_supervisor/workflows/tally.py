"""The workflow calls this process ran (not replayed), for pgq_workflow_steps_total: each row a
context writes counts once by (type, kind, state); a child's report takes the counts
(ipc.Report.steps) and the supervisor adds them up. Threads of the in-flight loop count too,
hence the lock."""

from __future__ import annotations

import threading

StepCount = tuple[str, str, str, int]  # type, kind, state, how many

_lock = threading.Lock()
_counts: dict[tuple[str, str, str], int] = {}


def count(type_: str, kind: str, state: str) -> None:
    key = (type_, kind, state)
    with _lock:
        _counts[key] = _counts.get(key, 0) + 1


def take() -> tuple[StepCount, ...]:
    """The counts since the last take, emptied."""
    with _lock:
        taken = tuple((t, k, s, n) for (t, k, s), n in _counts.items())
        _counts.clear()
    return taken
