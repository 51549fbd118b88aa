"""The `claim-floor` service: while vacuum's horizon is held back, claims of the served types
start past the dead prefix of job_claim_idx (schema/0022 says how and why that is safe).

Every second it asks how long the oldest snapshot of another session has been held. Past
HELD_AFTER seconds it walks each served type's claim order from the type's floor (from the
start of the index every FULL_EVERY seconds) and records the new floor; once the horizon moves
on, it drops the floors, and claims walk from the start again (vacuum can clean that prefix
now). Every supervisor runs it; a type another walked in the last half second is skipped."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pgq_supervisor import db

log = logging.getLogger(__name__)

LOOK_EVERY = 1.0
# A snapshot held this long: at 1,500 jobs/s, 7,500 dead entries, a few ms added to each claim.
HELD_AFTER = 5.0
# The walk from the start of the index, for what the floor cannot account for (see schema/0022).
FULL_EVERY = 60.0


@dataclass(frozen=True, slots=True)
class FloorResult:
    held: float  # seconds the oldest snapshot has been held
    walked: int  # types whose floor was walked
    full: bool


class ClaimFloors:
    def __init__(
        self, schema: str, types: Sequence[str], *, held_after: float = HELD_AFTER
    ) -> None:
        if not types:
            raise ValueError("ClaimFloors needs at least one type")
        self.schema = schema
        self.held_after = held_after
        self.types = sorted(set(types))
        self.on = False
        self.cleared = False  # a dead supervisor's floors are dropped at the first look
        self.full_at = float("-inf")

    def run_once(self, conn: db.Conn, now: float) -> FloorResult:
        held = db.horizon_held(conn, self.schema)
        if held < self.held_after:
            if self.on or not self.cleared:
                db.clear_floors(conn, self.schema, self.types)
                if self.on:
                    log.info("vacuum's horizon moved on: claims walk from the start again")
            self.on = False
            self.cleared = True
            return FloorResult(held, 0, False)
        full = now - self.full_at >= FULL_EVERY
        walked = db.refresh_floors(conn, self.schema, self.types, full=full)
        if full:
            self.full_at = now
        if not self.on:
            log.info(
                "a snapshot has been held %.0f s: vacuum cannot remove claimed jobs' entries,"
                " so claims of %s start past them (claim floors, schema/0022)",
                held,
                ", ".join(self.types),
            )
        self.on = True
        return FloorResult(held, walked, full)
