"""The `claim-floor` service: while vacuum's horizon is held back, claims of the served types
start past the dead prefix of job_claim_idx (schema/0022 says how and why that is safe).

Every second it asks how long the oldest snapshot of another session has been held. Past
HELD_AFTER seconds it walks each served type's claim order from the type's floor and records
the new floor (a few milliseconds: the walk reads what was claimed since the last one); once
the horizon moves on, it drops the floors, and claims walk from the start again (vacuum can
clean that prefix now). While a session it may not read or a prepared transaction is in the
database, it keeps no floor (schema/0022 says why). Every supervisor runs it; a type another
walked in the last half second is skipped."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pgq_supervisor import db

log = logging.getLogger(__name__)

LOOK_EVERY = 1.0
# A snapshot held this long: at 1,500 jobs/s, 7,500 dead entries, a few ms added to each claim.
HELD_AFTER = 5.0


@dataclass(frozen=True, slots=True)
class FloorResult:
    held: float  # seconds the oldest snapshot has been held
    walked: int  # types whose floor was walked; -1: none may have one (a writer unseen)


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
        self.blind = False  # the last walk found a writer it could not see

    def run_once(self, conn: db.Conn) -> FloorResult:
        held = db.horizon_held(conn, self.schema)
        if held < self.held_after:
            if self.on or not self.cleared:
                db.clear_floors(conn, self.schema, self.types)
                if self.on:
                    log.info("vacuum's horizon moved on: claims walk from the start again")
            self.on = False
            self.cleared = True
            return FloorResult(held, 0)
        walked = db.refresh_floors(conn, self.schema, self.types, full=False)
        if walked < 0:
            if not self.blind:
                log.info(
                    "a snapshot has been held %.0f s, but a session of another role or a"
                    " prepared transaction may be writing jobs unseen: claims walk from the"
                    " start (grant the role pg_read_all_stats to let them skip what vacuum"
                    " cannot remove)",
                    held,
                )
            self.blind = True
            self.on = False
            return FloorResult(held, walked)
        self.blind = False
        if not self.on:
            log.info(
                "a snapshot has been held %.0f s: vacuum cannot remove claimed jobs' entries,"
                " so claims of %s start past them (claim floors, schema/0022)",
                held,
                ", ".join(self.types),
            )
        self.on = True
        return FloorResult(held, walked)
