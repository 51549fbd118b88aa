"""What the supervisor and a child tell each other.

Two channels per child:
- a duplex pipe for rare messages (wake, stop, ready, idle, outcome reports), pickled;
- a shared-memory slot of 64 bytes per job in flight (one, or `concurrency`), that the child
  rewrites at every job start and end, so the hot path costs no system call; the supervisor
  reads it when it judges a timeout or reaps a death. It
  names the job's type too (an index into the child's types), so a death's retry backoff needs
  no query; how many claimed jobs the child holds but has not started; and one more byte says
  the supervisor is killing the child (`mark_kill`): a SIGTERM sent then is a kill, any other a
  stop (signals.ChildSignals); another, set by the child, that its heartbeat gave up its jobs
  (`mark_heartbeat_lost`): the supervisor then stops it and releases them.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import struct
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.sharedctypes import RawArray
from typing import TYPE_CHECKING, Final

from pgq_supervisor import db
from pgq_supervisor.jobs import JobId, OutcomeKind

if TYPE_CHECKING:
    from ctypes import Array


# ---- supervisor -> child ----
@dataclass(frozen=True, slots=True)
class Wake:
    """Claim now. `sent_at` (time.monotonic) lets the child measure wake latency."""

    sent_at: float


@dataclass(frozen=True, slots=True)
class Stop:
    """Finish the job in hand, release the rest of the batch, exit 0."""


@dataclass(frozen=True, slots=True)
class CancelJob:
    """A child with many jobs in flight: the job was cancelled in the database; cancel its
    task (an async job) rather than being killed."""

    job_id: JobId


@dataclass(frozen=True, slots=True)
class RunAlone:
    """Jobs released from a death of a child that held several: whichever child claims one
    runs it with nothing else in flight (see verdicts.py). The ids travel as 16 bytes each, so
    a thousand fit well inside a pipe's buffer (a child still booting is not reading yet)."""

    packed: bytes

    @classmethod
    def of(cls, ids: Sequence[JobId]) -> RunAlone:
        return cls(b"".join(i.bytes for i in ids))

    def job_ids(self) -> list[JobId]:
        p = self.packed
        return [JobId(uuid.UUID(bytes=p[i : i + 16])) for i in range(0, len(p), 16)]


RUN_ALONE_KEEP = 10_000  # the most jobs a RunAloneSet remembers


class RunAloneSet:
    """The jobs known to have to run alone, in the order they were named: the supervisor's
    (what it tells a child it spawns) and each in-flight child's (what its claims obey). A
    job named once is remembered until it has run alone (`discard`) or, past `keep`, the
    oldest are forgotten: such a job may then run beside others once more, and its next shared
    death names it again."""

    def __init__(self, keep: int = RUN_ALONE_KEEP) -> None:
        self.keep = keep
        self._ids: dict[JobId, None] = {}  # ordered: the oldest first

    def add(self, ids: Iterable[JobId]) -> None:
        for job_id in ids:
            self._ids.pop(job_id, None)  # named again: the newest
            self._ids[job_id] = None
        while len(self._ids) > self.keep:
            del self._ids[next(iter(self._ids))]

    def discard(self, job_id: JobId) -> None:
        self._ids.pop(job_id, None)

    def latest(self, n: int) -> list[JobId]:
        """The `n` named last, oldest first."""
        return list(self._ids)[-n:] if n > 0 else []

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._ids

    def __iter__(self) -> Iterator[JobId]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)


# ---- child -> supervisor ----
@dataclass(frozen=True, slots=True)
class Ready:
    pid: int


@dataclass(frozen=True, slots=True)
class Idle:
    """The last claim found nothing; wake me when there is work."""


# The upper bounds of pgq_job_duration_seconds (supervisor/metrics.py): a child sorts its
# jobs' run times into them itself, so a report is a few counts whatever the number of jobs.
DURATION_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800)


@dataclass(frozen=True, slots=True)
class Report:
    """What a child's jobs came to since its last report, summed (`Report.of`): attempts ended
    per (type, kind); per type, its run times counted per DURATION_BUCKETS bound (the first
    bound >= the time; one count more for +Inf) and their sum. Summed in the child: one entry
    per job made a drain's reports hundreds of kilobytes a second, pickled by the child,
    unpickled and observed one by one by the supervisor, which then took a tenth of the CPU."""

    ended: tuple[tuple[str, OutcomeKind, int], ...]
    durations: tuple[tuple[str, tuple[int, ...], float], ...] = ()
    wake_latencies: tuple[float, ...] = ()
    steps: tuple[tuple[str, str, str, int], ...] = ()  # workflow rows written (tally.py)

    @classmethod
    def of(
        cls,
        outcomes: Iterable[tuple[str, OutcomeKind, float]],
        wake_latencies: Sequence[float],
        steps: tuple[tuple[str, str, str, int], ...] = (),
    ) -> Report:
        """The report of these outcomes, (type, kind, seconds) each, and workflow steps."""
        ended: dict[tuple[str, OutcomeKind], int] = {}
        durations: dict[str, tuple[list[int], list[float]]] = {}
        for type_, kind, seconds in outcomes:
            ended[type_, kind] = ended.get((type_, kind), 0) + 1
            entry = durations.get(type_)
            if entry is None:
                entry = durations[type_] = ([0] * (len(DURATION_BUCKETS) + 1), [0.0])
            entry[0][bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
            entry[1][0] += seconds
        return cls(
            tuple((t, k, n) for (t, k), n in ended.items()),
            tuple((t, tuple(counts), total[0]) for t, (counts, total) in durations.items()),
            tuple(wake_latencies),
            steps,
        )

    @property
    def jobs(self) -> int:
        """Attempts ended."""
        return sum(n for _, _, n in self.ended)


@dataclass(frozen=True, slots=True)
class Retiring:
    """The child leaves after this batch (max_jobs_per_child, max_memory_per_child, a SIGTERM)."""

    reason: str


@dataclass(frozen=True, slots=True)
class BootFailed:
    """The child could not start. `app_error`: importing the app failed."""

    error: str
    app_error: bool


ToChild = Wake | Stop | CancelJob | RunAlone
FromChild = Ready | Idle | Report | Retiring | BootFailed


@dataclass(frozen=True, slots=True)
class SlotView:
    job_id: JobId
    # time.monotonic() in the child. CLOCK_MONOTONIC is system-wide, so the supervisor compares
    # it with its own clock, which must be time.monotonic() outside tests.
    started: float
    timeout: float | None
    attempt: int
    job_type: str | None  # None only if the child ran a type the slot was not told of
    # seconds past the timeout the child gets to cancel the job itself (an async job); 0: the
    # supervisor stops the child at the timeout (a sync job cannot be interrupted)
    grace: float = 0.0


# seq, job id, started, timeout (0 = none), grace, attempt, type index (-1 = unknown)
_LAYOUT = struct.Struct("<Q16sdddii")
_ENTRY = 64
# After entry 0's layout, outside its sequence lock: how many claimed jobs the child holds but
# has not started. One aligned 4-byte store, written at every job start and read for display
# only, so it needs no lock of its own.
_HELD = struct.Struct("<i")
_HELD_AT = _LAYOUT.size
_NO_JOB = b"\0" * 16


class JobSlot:
    """The jobs a child is running, in shared memory: one 64-byte entry per job it may hold at
    once (`capacity`, the child's concurrency). A sequence lock per entry keeps reads untorn:
    the writer makes `seq` odd while it writes; readers retry until they see one even value
    on both sides of their copy. `types` are the child's job types: the slot stores a type as
    its index, looked up in a dict built once. A separate byte is the kill mark."""

    def __init__(
        self,
        types: Sequence[str] = (),
        raw: Array[ctypes.c_char] | None = None,
        *,
        capacity: int = 1,
    ) -> None:
        self._attach(
            raw if raw is not None else RawArray(ctypes.c_char, _ENTRY * capacity),
            tuple(types),
            RawArray(ctypes.c_char, 2),  # the kill mark, the heartbeat-lost mark
        )

    def _attach(
        self, raw: Array[ctypes.c_char], types: tuple[str, ...], kill: Array[ctypes.c_char]
    ) -> None:
        self.raw = raw
        self.types = types
        self._kill = kill
        self._index = {t: i for i, t in enumerate(types)}
        self._view = memoryview(raw).cast("B")
        self.capacity = max(1, len(raw) // _ENTRY)
        self._seqs = [0] * self.capacity
        # set_held(n): the child holds n claimed jobs it has not started. Called at every job
        # start, so a bound pack_into rather than a method (half the cost)
        self.set_held: Callable[[int], None] = functools.partial(
            _HELD.pack_into, self._view, _HELD_AT
        )

    # Pickled for the spawned child as the shared arrays themselves (multiprocessing passes
    # their fd).
    def __getstate__(self) -> object:
        return (self.raw, self.types, self._kill)

    def __setstate__(
        self, state: tuple[Array[ctypes.c_char], tuple[str, ...], Array[ctypes.c_char]]
    ) -> None:
        self._attach(*state)

    def mark_kill(self) -> None:
        """The supervisor is about to SIGTERM the child to kill it (a timeout, a cancel): the
        child's handler reads this to tell that SIGTERM from a stop. Never cleared: a child
        killed stays killed."""
        self._kill[0] = b"\x01"

    @property
    def kill_marked(self) -> bool:
        return self._kill[0] != b"\x00"

    def mark_heartbeat_lost(self) -> None:
        """The child's heartbeat could not reach the database for a safe part of dead_after:
        the supervisor must stop the child and release its jobs before they are rescued (an
        attempt charged, the work running on to be thrown away). Never cleared."""
        self._kill[1] = b"\x01"

    @property
    def heartbeat_lost(self) -> bool:
        return self._kill[1] != b"\x00"

    def _write(
        self,
        entry: int,
        job: bytes,
        started: float,
        timeout: float,
        grace: float,
        attempt: int,
        type_: int,
    ) -> None:
        off = entry * _ENTRY
        seq = self._seqs[entry] + 1
        struct.pack_into("<Q", self._view, off, seq)
        _LAYOUT.pack_into(self._view, off, seq, job, started, timeout, grace, attempt, type_)
        self._seqs[entry] = seq = seq + 1
        struct.pack_into("<Q", self._view, off, seq)

    def set(
        self,
        job_id: JobId,
        started: float,
        timeout: float | None,
        attempt: int,
        job_type: str,
        *,
        entry: int = 0,
        grace: float = 0.0,
    ) -> None:
        """The child starts a job (`started` by its time.monotonic()) in `entry`."""
        self._write(
            entry,
            job_id.bytes,
            started,
            timeout or 0.0,
            grace,
            attempt,
            self._index.get(job_type, -1),
        )

    def held(self) -> int:
        """How many claimed jobs the child holds but has not started (as it last said)."""
        return int(_HELD.unpack_from(self._view, _HELD_AT)[0])

    def clear(self, entry: int = 0) -> None:
        self._write(entry, _NO_JOB, 0.0, 0.0, 0.0, 0, -1)

    def read(self, entry: int = 0) -> SlotView | None:
        off = entry * _ENTRY
        for _ in range(1000):
            before = struct.unpack_from("<Q", self._view, off)[0]
            if before % 2:
                continue
            _, job, started, timeout, grace, attempt, type_ = _LAYOUT.unpack_from(self._view, off)
            if struct.unpack_from("<Q", self._view, off)[0] == before:
                if job == _NO_JOB:
                    return None
                job_type = self.types[type_] if 0 <= type_ < len(self.types) else None
                return SlotView(
                    JobId(uuid.UUID(bytes=job)),
                    started,
                    timeout or None,
                    attempt,
                    job_type,
                    grace,
                )
        return None

    def read_all(self) -> list[SlotView]:
        """Every job in the slot, entry by entry."""
        if self.capacity == 1:
            view = self.read()
            return [] if view is None else [view]
        return [v for i in range(self.capacity) if (v := self.read(i)) is not None]


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """Everything a spawned child needs; plain data, pickled to the new interpreter."""

    index: int
    worker_id: str
    app: str
    dsn: str
    schema: str
    types: tuple[str, ...]
    heartbeat_interval: float
    claim_batch: int
    max_jobs: int | None
    max_memory_mb: int | None
    log_level: str
    log_format: str
    connect_timeout: float = 30.0
    # the rescuer takes a job whose heartbeat is this old: the child gives its jobs up sooner
    dead_after: float = 30.0
    synchronous_commit: bool = False
    prepare_threshold: int | None = db.PREPARE_THRESHOLD
    concurrency: int = 1  # most jobs in flight at once (1: the Worker of worker/sync.py)
    # > 0: the jobs in flight adapt up to this many (worker/adaptive.py): an all-async child
    # with no concurrency given; its slot has this many entries
    adaptive: int = 0
    pool_size: int | None = None  # most connections of each pool for `conn` handlers
    # claimed jobs not started go back once they have waited this long behind a running job
    release_unstarted_after: float = 0.25

    @property
    def slots(self) -> int:
        """The most jobs the child may hold in flight: its slot's entries."""
        return max(self.concurrency, self.adaptive)
