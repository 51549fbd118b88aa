"""Types enqueued that no live supervisor serves, warned about once each (issue 36): a type
misspelt at enqueue ("gret" for "greet") would otherwise wait forever in silence.

The supervisor hears the type of every job that becomes ready (pgq_job_available) or is
delayed (pgq_job_due), one notification per type and statement, also of types it does not
serve. Such a type is a candidate; once it has been one for `grace` seconds, the `unserved`
timer reads the supervisor table (a few rows, no job is read) and, if no live supervisor
(seen within `stale_after` seconds: jobs.stale_after of the heartbeat interval) serves it,
logs one WARNING naming it (and a served type close to it). A type another supervisor
serves is dropped; heard again later, it is looked at again. Jobs enqueued before
this supervisor started are not heard: `status` and `show` name those.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import get_close_matches

from pgq_supervisor import db
from pgq_supervisor.coverage import is_stale

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class UnservedResult:
    warned: tuple[str, ...]  # the types warned about by this run
    looked: bool  # whether the supervisor table was read


class UnservedWatch:
    def __init__(
        self, schema: str, served: Sequence[str], *, grace: float, stale_after: float
    ) -> None:
        self.schema = schema
        self.served = frozenset(served)
        self.grace = grace
        self.stale_after = stale_after
        self.heard_at: dict[str, float] = {}
        self.warned: set[str] = set()

    def heard(self, type_: str, now: float) -> None:
        """A job of `type_` became ready or was delayed (pgq_job_available, pgq_job_due)."""
        if type_ not in self.served and type_ not in self.warned:
            self.heard_at.setdefault(type_, now)

    def run_once(self, conn: db.Conn, now: float) -> UnservedResult:
        """Warn about the candidates of `grace` seconds and more that no live supervisor
        serves. Raises DatabaseError (the candidates are kept for the next run)."""
        due = sorted(t for t, at in self.heard_at.items() if now - at >= self.grace)
        if not due:
            return UnservedResult((), looked=False)
        supervisors = db.list_supervisors(conn, self.schema)
        live = [r for r in supervisors if not is_stale(r, self.stale_after)]
        elsewhere = {t for r in live for t in r.types}
        warned = []
        for type_ in due:
            del self.heard_at[type_]
            if type_ in elsewhere:
                continue
            like = get_close_matches(type_, sorted(elsewhere | self.served), n=1)
            log.warning(
                "jobs of type %r are enqueued but no live supervisor serves it%s",
                type_,
                f" (did you mean {like[0]!r}?)" if like else "",
            )
            self.warned.add(type_)
            warned.append(type_)
        return UnservedResult(tuple(warned), looked=True)
