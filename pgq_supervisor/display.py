"""What the admin CLI (admin/), the dashboard (web/) and the logs show, in the same words: a
count of things and a rate, a progress value as a table cell, a supervisor's children as
stored, a workflow's steps."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from pgq_supervisor.db.rows import SupervisorRecord
from pgq_supervisor.jobs import JobRecord, JobState, JsonValue
from pgq_supervisor.steps import StepView

PROGRESS_WIDTH = 24


def plural(n: int, word: str, words: str | None = None) -> str:
    """`1 job`, `2 jobs`, `0 jobs`; `words` when the plural is not `word` + s (`children`)."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def per_second(n: int, seconds: float, unit: str = "") -> str | None:
    """`n` things in `seconds` as a rate (`3/s`, `0.5/s`, `1,204 jobs/s` with a `unit`), or
    None when nothing was measured: nothing counted, or no time to count it in."""
    if n <= 0 or seconds <= 0:
        return None
    rate = n / seconds
    shown = f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"
    return f"{shown} {unit}/s" if unit else f"{shown}/s"


def progress_cell(value: JsonValue) -> str:
    """42% for a fraction (alone, or an object's "fraction"), else compact JSON, cut short."""
    if value is None:
        return "-"
    fraction = value.get("fraction") if isinstance(value, dict) else value
    if isinstance(fraction, int | float) and not isinstance(fraction, bool):
        return f"{fraction * 100:.0f}%"
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= PROGRESS_WIDTH else text[: PROGRESS_WIDTH - 3] + "..."


# The most characters of a payload or a result `show` prints and the job page shows; the rest
# is cut (with its size, and `show --full` or the page's link for the whole). The payload cap
# (PGQ_MAX_PAYLOAD_BYTES, 1 MiB) is 16 times this.
SHOWN_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class Shown:
    """A payload's or a result's JSON text as shown: all of it, or its first SHOWN_CHARS
    characters and the whole's size in bytes (UTF-8)."""

    text: str
    size: int
    cut: bool

    def note(self) -> str:
        """What a cut value says after its start."""
        return f"cut at {len(self.text)} characters: {self.size} bytes of JSON in all"


def shown(text: str, size: int | None = None, limit: int = SHOWN_CHARS) -> Shown:
    """`text` as shown: its first `limit` characters. `size`: the whole's bytes when `text`
    is only its start (the whole's own size otherwise)."""
    head = text[:limit]
    if size is None:
        size = _utf8_bytes(text)
        return Shown(head, size, len(head) < len(text))
    return Shown(head, size, _utf8_bytes(head) < size)


def _utf8_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def children_of(record: SupervisorRecord) -> list[dict[str, JsonValue]]:
    """Its children as stored, each a JSON object (anything else is skipped)."""
    listed = record.children if isinstance(record.children, list) else []
    return [c for c in listed if isinstance(c, dict)]


def count_of(value: JsonValue) -> int:
    """A count as a child's stored JSON holds it (anything but an int is 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class NotStarted:
    """A running job its worker held without running it, when its supervisor last wrote."""

    host: str
    pid: int  # the supervisor's
    child: int  # the child's index
    seen_ago: float  # seconds, by the database's clock
    running: tuple[str, ...]  # the ids of the jobs the child ran then

    def text(self) -> str:
        now = ", ".join(self.running) or "nothing"
        return (
            f"claimed, not started {self.seen_ago:.0f} s ago: child {self.child} of {self.host}"
            f" pid {self.pid} was running {now} (started_at is the claim's time)"
        )

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "host": self.host,
            "pid": self.pid,
            "child": self.child,
            "seen_ago": round(self.seen_ago, 3),
            "running": list(self.running),
        }


def not_started(records: Sequence[SupervisorRecord], job: JobRecord) -> NotStarted | None:
    """Was `job` (running in the database: claimed) held but not started by its child when
    the child's supervisor last wrote its row? None if not, or if that row cannot tell (the
    child is not listed, or the row is older than the claim)."""
    if job.state is not JobState.RUNNING or job.worker_id is None or job.started_at is None:
        return None
    for record in records:
        if record.seen_at < job.started_at:
            continue  # written before the claim: it knows nothing of this job
        for c in children_of(record):
            if c.get("worker_id") != job.worker_id:
                continue
            ids = c.get("job_ids")
            running = [str(i) for i in ids] if isinstance(ids, list) else []
            if not running and c.get("job_id"):
                running = [str(c.get("job_id"))]
            if count_of(c.get("held")) == 0 or str(job.id) in running:
                return None
            return NotStarted(
                record.host, record.pid, count_of(c.get("index")), record.seen_ago, tuple(running)
            )
    return None


@dataclass(frozen=True, slots=True)
class StepLine:
    """One workflow step as `show` and the dashboard's job page list it."""

    seq: int
    kind: str
    name: str
    state: str
    detail: str  # its result, its error, or until when it sleeps or waits
    took: str  # how long its function ran (its last try), or "-"


def _short(value: JsonValue, width: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def step_line(step: StepView) -> StepLine:
    """A step in the words both views use."""
    until = step.wake_at.isoformat(timespec="seconds") if step.wake_at is not None else None
    match step.state:
        case "succeeded":
            detail = "-" if step.kind in ("sleep", "patch") else _short(step.result)
        case "retrying":
            detail = f"try {step.tries} failed: {step.error}; again at {until}"
        case "failed":
            detail = f"failed after {plural(step.tries, 'try', 'tries')}: {step.error}"
        case "sleeping":
            detail = f"sleeps until {until}"
        case "waiting":
            detail = f"waits for signal {step.name!r}" + (f" until {until}" if until else "")
        case _:
            detail = step.error or step.state
    took = "-" if step.duration is None else f"{step.duration * 1000:.1f} ms"
    return StepLine(step.seq + 1, step.kind, step.name, step.state, detail, took)


def current_pause(steps: Sequence[StepView]) -> str | None:
    """What a workflow is paused on now (its last step sleeping, waiting or retrying)."""
    if not steps or steps[-1].state not in ("sleeping", "waiting", "retrying"):
        return None
    return step_line(steps[-1]).detail


def held_back(record: JobRecord) -> str | None:
    """Why a pending job is not claimable yet, when one of the job options holds it back."""
    if record.state is not JobState.PENDING:
        return None
    last = record.attempts[-1] if record.attempts else None
    if isinstance(last, dict) and last.get("kind") == "snoozed":
        return f"snoozed (snooze {record.snoozes}) until {record.start_at.isoformat()}"
    if record.debounce_key is not None and record.waiting_on > 0:
        behind = ", ".join(str(d) for d in record.depends_on or ())
        return f"debounced (key {record.debounce_key!r}): waits behind running job {behind}"
    if record.ordered_key is not None and record.waiting_on > 0 and not record.depends_on:
        return f"ordered (key {record.ordered_key!r}): waits for the earlier jobs of its key"
    return None
