"""The `aging` service: raises the priority of the pending jobs of the served types that have
priority aging (Registry.handler(aging=...), pgq_supervisor/aging.py). Every supervisor runs
it; the statement skips rows another holds and re-checks the wait, so a job is raised once per
step however many run it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pgq_supervisor import db
from pgq_supervisor.aging import Aging

# Jobs raised per type and run: a deep backlog is raised over several runs, each statement short.
BATCH = 1000


@dataclass(frozen=True, slots=True)
class AgingResult:
    raised: dict[str, int]  # per type: jobs whose priority rose by one


class Ager:
    def __init__(self, schema: str, agings: Mapping[str, Aging], *, batch: int = BATCH) -> None:
        if not agings:
            raise ValueError("Ager needs at least one type with aging")
        self.schema = schema
        self.agings = dict(agings)
        self.batch = batch

    @property
    def interval(self) -> float:
        """How often to run: twice per shortest step, so a job is raised at most half a step
        late."""
        return min(a.every for a in self.agings.values()) / 2

    def run_once(self, conn: db.Conn) -> AgingResult:
        raised = {}
        for type_, aging in sorted(self.agings.items()):
            raised[type_] = db.age_priorities(
                conn, self.schema, type_, every=aging.every,
                max_priority=aging.max_priority, limit=self.batch,
            )  # fmt: skip
        return AgingResult(raised)
