"""Pending work no live supervisor serves, said aloud by `status` (issue 36): a type misspelt
at enqueue ("gret" for "greet") is otherwise ordinary pending work that waits forever in
silence. Judged from the supervisor table (schema/0010): each live supervisor lists the types
it serves; a row not refreshed within `stale_after` seconds (jobs.stale_after: three missed
heartbeats) is stale and serves nothing. `status`,
`show` and `doctor` print these lines, the dashboard shows them and the supervisor's
pgq_unserved_jobs gauge counts them (read_coverage reads them); `wait` asks its own query."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pgq_supervisor import db
from pgq_supervisor.db.rows import SupervisorRecord
from pgq_supervisor.jobs import JobState, JsonValue
from pgq_supervisor.vacuum import Finding


def is_stale(record: SupervisorRecord, stale_after: float) -> bool:
    """Not refreshed within `stale_after` seconds (jobs.stale_after of the heartbeat interval,
    its upsert interval): it serves nothing (`workers` marks it STALE)."""
    return record.seen_ago > stale_after


@dataclass(frozen=True, slots=True)
class Unserved:
    """A type with pending jobs that no live supervisor serves; `like`: a served type it is
    close to (a likely typo), if any."""

    type: str
    pending: int
    like: str | None


@dataclass(frozen=True, slots=True)
class Coverage:
    """What the live supervisors serve, and the pending types left out. `live` counts them."""

    live: int
    served: tuple[str, ...]
    unserved: tuple[Unserved, ...]

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "live_supervisors": self.live,
            "served": list(self.served),
            "unserved": [
                {"type": u.type, "pending": u.pending, "did_you_mean": u.like}
                for u in self.unserved
            ],
        }

    def served_text(self) -> str:
        """The served types on one line (the first MAX_NAMED of them), for the reader to
        compare a misspelt type with."""
        names = ", ".join(self.served[:MAX_NAMED])
        more = len(self.served) - MAX_NAMED
        live = f"{self.live} live supervisor{_s(self.live)}"
        return f"{names}{f' and {more} more' if more > 0 else ''} ({live})"

    def lines(self) -> list[str]:
        """For `status`: nothing when every pending type is served."""
        if not self.unserved:
            return []
        if not self.live:
            n = sum(u.pending for u in self.unserved)
            waits = "waits" if n == 1 else "wait"
            return [f"no live supervisor is registered: {n} pending job{_s(n)} {waits} for one"]
        return [
            *(
                f"unserved: {u.type}: {u.pending} pending job{_s(u.pending)}, no live supervisor"
                f" serves this type" + (f" (did you mean {u.like}?)" if u.like else "")
                for u in self.unserved
            ),
            f"served: {self.served_text()}",
        ]

    def findings(self) -> list[Finding]:
        """For `doctor`: one finding per unserved type (or one when no supervisor is live)."""
        if not self.unserved:
            return []
        if not self.live:
            n = sum(u.pending for u in self.unserved)
            names = ", ".join(repr(u.type) for u in self.unserved[:MAX_NAMED])
            return [
                Finding(
                    what=f"no live supervisor is registered: {n} pending job{_s(n)} of"
                    f" type{_s(len(self.unserved))} {names} wait{'s' if n == 1 else ''} for one",
                    action="start one: python -m pgq_supervisor --app package.module:registry",
                )
            ]
        return [
            Finding(
                what=f"type {u.type!r}: {u.pending} pending job{_s(u.pending)} that no live"
                " supervisor serves"
                + (f" (did you mean {u.like!r}?)" if u.like else "")
                + f"; served: {self.served_text()}",
                action=f"start a supervisor whose app has a handler for {u.type!r}; if the"
                " name is a typo, fix the producer (enqueue through the handler's task"
                " handle) and cancel or purge these jobs",
            )
            for u in self.unserved
        ]


MAX_NAMED = 10  # served types named on one line


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def coverage(
    pending: Mapping[str, int], supervisors: Sequence[SupervisorRecord], stale_after: float
) -> Coverage:
    """`pending`: pending jobs per type (types with none are ignored); `stale_after`: see
    is_stale."""
    live = [r for r in supervisors if not is_stale(r, stale_after)]
    served = sorted({t for r in live for t in r.types})
    unserved = []
    for type_, n in sorted(pending.items()):
        if n > 0 and type_ not in served:
            like = difflib.get_close_matches(type_, served, n=1)
            unserved.append(Unserved(type_, n, like[0] if like else None))
    return Coverage(len(live), tuple(served), tuple(unserved))


def read_coverage(conn: db.Conn, schema: str, stale_after: float) -> Coverage:
    """`coverage` of the queue as it is: its pending jobs per type and its supervisor rows."""
    pending: dict[str, int] = {}
    for s in db.queue_stats(conn, schema):
        if s.state is JobState.PENDING:
            pending[s.type] = pending.get(s.type, 0) + s.count
    return coverage(pending, db.list_supervisors(conn, schema), stale_after)
