"""How many jobs an async child keeps in flight at the defaults (issue 40, item 3).

A child whose handlers are all `async def`, with no `concurrency` given, does not run one job
at a time: it starts at START jobs in flight and, every EVERY seconds, looks at what the last
window did. While the jobs wait (the child's CPU time was under LOW of the wall time) and the
limit was what held it back (it had as many in flight as allowed, and its last claim found as
many jobs as it asked for: there is more work), the limit doubles, up to `most` (the child's
slot entries: ipc.ChildSpec.adaptive, ADAPTIVE_MOST). When the child's CPU is the bottleneck
(over HIGH: more jobs in flight would only wait for the event loop), it shrinks by a quarter,
down to 1. An explicit `concurrency` is a fixed limit instead (this class is not used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from pgq_supervisor.registry import Registry
from pgq_supervisor.settings import Settings

START: Final = 32
EVERY: Final = 0.05  # seconds of a window
LOW: Final = 0.7  # CPU share under which more jobs in flight may help
HIGH: Final = 0.9  # CPU share over which fewer would do as well
# the most jobs in flight an adaptive child grows to (its slot's entries, 64 bytes each): about
# what pgqueuer runs uncapped with 50 ms jobs on 2 cores (benchmarks --only io --peers)
ADAPTIVE_MOST: Final = 1000


def adaptive_in_flight(settings: Settings, registry: Registry, types: Sequence[str]) -> int:
    """ADAPTIVE_MOST for children whose handlers are all `async def` when no `concurrency` was
    given (flag, PGQ_CONCURRENCY or .env): their jobs in flight adapt to the work. Else 0, a
    fixed concurrency: a child that also serves a sync handler runs one job at a time, in
    priority order, as before (a CPU-bound handler gains nothing beside others in threads)."""
    if "concurrency" in settings.model_fields_set:
        return 0
    handlers = [registry.handlers.get(t) for t in types]
    if not handlers or any(h is None or not h.is_async for h in handlers):
        return 0
    return ADAPTIVE_MOST


class InFlightLimit:
    def __init__(
        self, most: int, clock: Callable[[], float], cpu: Callable[[], float], start: int = START
    ) -> None:
        self.most = most
        self.limit = max(1, min(start, most))
        self._clock = clock
        self._cpu = cpu
        self._since = clock()
        self._cpu_since = cpu()
        self._peak = 0  # most jobs in flight seen in the window
        self._more = False  # a claim of the window found all it asked for

    def claimed(self, asked: int, got: int, held: int) -> None:
        """A claim asked for `asked` jobs and got `got`; the child now holds `held`."""
        if got >= asked:
            self._more = True
        self._peak = max(self._peak, held)

    def tick(self, in_flight: int) -> int:
        """Note the jobs in flight now; at the end of a window, adapt. Returns the limit."""
        self._peak = max(self._peak, in_flight)
        now = self._clock()
        elapsed = now - self._since
        if elapsed < EVERY:
            return self.limit
        cpu = self._cpu()
        share = (cpu - self._cpu_since) / elapsed
        if share > HIGH:
            self.limit = max(1, self.limit * 3 // 4)
        elif share < LOW and self._more and self._peak >= self.limit:
            self.limit = min(self.most, self.limit * 2)
        self._since, self._cpu_since, self._peak, self._more = now, cpu, in_flight, False
        return self.limit
