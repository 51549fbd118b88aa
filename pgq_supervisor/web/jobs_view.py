"""The Jobs page: its filters and search from the query string, its rows, and the actions on
one job or on the jobs selected in the list. No HTTP here: app.py calls these in Starlette's
thread pool.

The search box reads, in this order:
    a job id (a UUID)            opens that job (or that bundle)
    payload.a.b = VALUE          jobs whose payload holds VALUE at a.b (VALUE read as JSON:
                                 42, true, null, "text"; anything else as text), newest first
    anything else                jobs with that unique_key
A payload search has an index only where `dashboard-indexes --payload` made one; without it,
it reads the table newest first until a page matches, for at most SEARCH_TIME_LIMIT seconds.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pgq_supervisor import db, ids
from pgq_supervisor.db.web_rows import JobListed
from pgq_supervisor.errors import JobNotFound, PgqError
from pgq_supervisor.jobs import JobId, JobState, JsonValue, check_type_name

Data = dict[str, object]
SEARCH_TIME_LIMIT = 5.0  # seconds a payload search may read for
MAX_BULK = 500  # job ids one bulk action takes
MAX_SEARCH_DEPTH = 100  # levels of a payload search's value (json.loads' own limit is ~1000)
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_PAYLOAD_RE = re.compile(r"^payload((?:\.[A-Za-z0-9_\-]+)+)\s*=\s*(.*)$", re.DOTALL)


def _moment(text: str, what: str) -> datetime | None:
    """An ISO date-time from a form (datetime-local has no zone: UTC)."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"invalid {what}: {text[:40]!r} is not a date and time") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _refuse_constant(name: str) -> JsonValue:
    raise _NoJson(f"{name} has no JSON form")


class _NoJson(ValueError):
    """A search value json.loads would take but PostgreSQL's jsonb would not."""


def _storable(value: JsonValue, search: str) -> None:
    """ValueError (a line naming the search) unless jsonb can hold `value`: no NUL nor lone
    surrogate in a string or key, no infinite number, at most MAX_SEARCH_DEPTH levels."""
    todo: list[tuple[JsonValue, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_SEARCH_DEPTH:
            raise ValueError(f"invalid search: {search[:60]!r} is nested too deep")
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"invalid search: {search[:60]!r}: a number out of range")
        if isinstance(item, str):
            check_search_text(item, search)
        elif isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values())
            for key in item:
                check_search_text(key, search)


def check_search_text(text: str, search: str) -> None:
    """ValueError (a line) when `text` holds what PostgreSQL cannot take in text: a NUL, or a
    lone surrogate (it has no UTF-8)."""
    if "\x00" in text:
        raise ValueError(f"invalid search: {search[:60]!r} holds a NUL character")
    if _SURROGATE_RE.search(text):
        raise ValueError(f"invalid search: {search[:60]!r} holds a lone surrogate")


def payload_filter(search: str) -> str | None:
    """`payload.a.b = VALUE` as the JSON object a matching payload contains ({"a": {"b":
    VALUE}}), as text; None when the search is not of that form. ValueError (a line) for a
    value jsonb cannot hold: a NUL or lone surrogate (as `"\\u0000"`), NaN, Infinity, 1e999."""
    found = _PAYLOAD_RE.match(search.strip())
    if found is None:
        return None
    path, raw = found.group(1).strip(".").split("."), found.group(2).strip()
    if not raw:
        raise ValueError(f"invalid search: {search[:60]!r} has no value after '='")
    try:
        value: JsonValue = json.loads(raw, parse_constant=_refuse_constant)
    except _NoJson as exc:
        raise ValueError(f"invalid search: {search[:60]!r}: {exc}") from None
    except RecursionError:
        raise ValueError(f"invalid search: {search[:60]!r} is nested too deep") from None
    except ValueError:
        value = raw  # a bare word: text
    _storable(value, search)
    for key in reversed(path):
        value = {key: value}
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class JobsQuery:
    """The jobs page's filters and keyset, from its query string."""

    state: JobState | None = None
    type: str | None = None
    search: str = ""
    since: datetime | None = None
    until: datetime | None = None
    before: tuple[datetime, JobId] | None = None
    raw: Mapping[str, str] = field(default_factory=dict)

    @property
    def job_id(self) -> JobId | None:
        """The search, when it reads as a job id."""
        try:
            return ids.job_id(self.search) if self.search else None
        except ValueError:
            return None

    @property
    def payload(self) -> str | None:
        """The search as a payload filter (JSON text), when it reads as one."""
        return payload_filter(self.search) if self.search else None

    @property
    def unique_key(self) -> str | None:
        if not self.search or self.job_id is not None or self.payload is not None:
            return None
        return self.search

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> JobsQuery:
        """Raises ValueError naming the bad parameter."""
        raw = {k: params.get(k, "") for k in ("state", "type", "q", "since", "until")}
        state = None
        if raw["state"]:
            try:
                state = JobState(raw["state"])
            except ValueError:
                raise ValueError(f"invalid state: {raw['state'][:40]!r}") from None
        type_ = check_type_name(raw["type"]) if raw["type"] else None
        check_search_text(raw["q"], raw["q"])  # a unique key is text too
        before = None
        if params.get("before"):
            at, _, id_text = params["before"].partition(",")
            try:
                before = (datetime.fromisoformat(at), ids.job_id(id_text))
            except ValueError:
                raise ValueError("invalid before: not a page of this list") from None
        query = cls(
            state=state,
            type=type_,
            search=raw["q"].strip(),
            since=_moment(raw["since"], "since"),
            until=_moment(raw["until"], "until"),
            before=before,
            raw=raw,
        )
        _ = query.payload  # a malformed payload search fails here, with the others
        return query


def empty_jobs(error: str, types: Sequence[str] = ()) -> Data:
    return {
        "rows": [], "next": None, "filters": {}, "error": error, "states": list(JobState),
        "paged": False, "types": list(types), "now": datetime.now(UTC),
    }  # fmt: skip


def jobs(conn: db.Conn, schema: str, query: JobsQuery, limit: int) -> Data:
    types = db.type_names(conn, schema)
    try:
        rows: list[JobListed] = db.jobs_page(
            conn,
            schema,
            state=query.state,
            type_=query.type,
            unique_key=query.unique_key,
            payload=query.payload,
            since=query.since,
            until=query.until,
            before=query.before,
            limit=limit + 1,
            time_limit=SEARCH_TIME_LIMIT if query.payload is not None else None,
        )
    except db.SearchTimedOut as exc:
        return empty_jobs(
            f"{exc} without filling a page: narrow it (a type, a state, a time range), or"
            " create its index (python -m pgq_supervisor dashboard-indexes --payload)",
            types,
        ) | {"filters": query.raw}
    more = len(rows) > limit
    rows = rows[:limit]
    next_page = None
    if more:
        last = rows[-1]
        next_page = {**{k: v for k, v in query.raw.items() if v}}
        next_page["before"] = f"{last.created_at.isoformat()},{last.id}"
    return {
        "rows": rows,
        "next": next_page,
        "filters": query.raw,
        "error": None,
        "states": list(JobState),
        "paged": query.before is not None,
        "types": sorted({*types, *([query.type] if query.type else [])}),
        "now": db.db_now(conn, schema),
    }


def job_action(conn: db.Conn, schema: str, action: str, job_id: JobId) -> tuple[bool, str]:
    """Run `action` on one job; (done, what to tell the user)."""
    if action == "retry":
        refused = db.reset(conn, schema, job_id, force=False)
        if refused is not None:
            return False, f"not retried: job {job_id} is {refused.value}, not finished"
        return True, f"job {job_id} is pending again"
    if action == "cancel":
        result = db.cancel(conn, schema, job_id)
        if not result.cancelled:
            return False, f"not cancelled: job {job_id} is {result.state.value} already"
        if result.state is JobState.RUNNING:
            return True, f"job {job_id} cancelled; its worker is being stopped"
        return True, f"job {job_id} cancelled"
    if action == "delete":
        if db.delete_job(conn, schema, job_id):
            return True, f"job {job_id} deleted"
        db.get_job(conn, schema, job_id)  # JobNotFound when it is unknown
        return False, f"not deleted: job {job_id} is not finished (cancel it first)"
    raise ValueError(f"unknown job action {action!r}")


_DONE = {"retry": "retried", "cancel": "cancelled", "delete": "deleted"}


def bulk_action(
    conn: db.Conn, schema: str, action: str, job_ids: Sequence[JobId]
) -> tuple[bool, str]:
    """Run `action` on each job, each in a savepoint of the caller's transaction: a job the
    action does not fit (a running job to delete, one gone meanwhile) is skipped and counted."""
    done = 0
    skipped: list[str] = []
    for job_id in job_ids:
        try:
            with conn.transaction():
                ok, why = job_action(conn, schema, action, job_id)
        except JobNotFound:
            ok, why = False, f"job {job_id} not found"
        except PgqError as exc:
            ok, why = False, str(exc)
        if ok:
            done += 1
        else:
            skipped.append(why)
    message = f"{done} job{'s' if done != 1 else ''} {_DONE[action]}"
    if skipped:
        message += f", {len(skipped)} skipped ({skipped[0]}{', ...' if len(skipped) > 1 else ''})"
    return done > 0, message


def parse_ids(values: Sequence[str]) -> list[JobId]:
    """The selected jobs' ids (ValueError naming a bad one, or too many)."""
    if len(values) > MAX_BULK:
        raise ValueError(f"too many jobs selected: {len(values)} (at most {MAX_BULK})")
    out: list[JobId] = []
    for v in values:
        try:
            out.append(ids.job_id(v))
        except ValueError:
            raise ValueError(f"not a job id: {v[:40]!r}") from None
    return out
