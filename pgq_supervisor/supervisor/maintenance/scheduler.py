"""The supervisor's periodic-jobs service: enqueue the due ticks of the schedules it serves.

Each run reads where its schedules stand (with the database's clock), enqueues the due ticks
(see periodic.py for which), and returns the seconds until the next tick, so its timer wakes
at that tick rather than polling. Every supervisor serving a type runs its schedules; the
enqueue statement lets each tick through once (db/schedules.py). Schedules not in the running
registry are never read here, so a schedule removed from the code stops firing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pgq_supervisor import db
from pgq_supervisor.db.rows import ScheduleState
from pgq_supervisor.jobs import JobId
from pgq_supervisor.periodic import Schedule

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SchedulerRun:
    enqueued: tuple[JobId, ...]
    next_in: float | None  # seconds until the earliest next tick (None: no schedules)


class Scheduler:
    def __init__(self, schema: str, schedules: Sequence[Schedule]) -> None:
        self.schema = schema
        self.schedules = {s.name: s for s in schedules}
        self.declared = False  # this process declared its schedules (once per start)

    def run_once(self, conn: db.Conn) -> SchedulerRun:
        """One round on an autocommit connection. Raises DatabaseError."""
        if not self.schedules:
            return SchedulerRun((), None)
        states = self._states(conn)
        enqueued: list[JobId] = []
        next_in: float | None = None
        for state in states:
            schedule = self.schedules[state.name]
            if state.paused:  # from the dashboard: its ticks pass unenqueued until resumed
                wait = (schedule.next_tick(state.now) - state.now).total_seconds()
                next_in = wait if next_in is None else min(next_in, wait)
                continue
            after = state.last_tick or state.created_at
            due = schedule.due_ticks(after, state.now)
            if due and schedule.next_tick(after) < due[0]:
                log.info(
                    "periodic %s: missed ticks from %s to before %s skipped (catch_up=%d)",
                    schedule.name, schedule.next_tick(after), due[0], schedule.catch_up,
                )  # fmt: skip
            for tick in due:
                job_id = db.enqueue_tick(conn, self.schema, schedule, tick)
                if job_id is not None:
                    enqueued.append(job_id)
                    log.debug("periodic %s: tick %s is job %s", schedule.name, tick, job_id)
            wait = (schedule.next_tick(max([after, state.now, *due])) - state.now).total_seconds()
            next_in = wait if next_in is None else min(next_in, wait)
        return SchedulerRun(tuple(enqueued), next_in)

    def _states(self, conn: db.Conn) -> list[ScheduleState]:
        if self.declared:
            states = db.schedule_states(conn, self.schema, list(self.schedules))
            if len(states) == len(self.schedules):
                return states
        # first run, or a row was deleted (e.g. by hand): declare again
        states = db.declare_schedules(conn, self.schema, list(self.schedules.values()))
        self.declared = True
        return states
