"""What the supervisor and a child tell each other.

Two channels per child:
- a duplex pipe for rare messages (wake, stop, ready, idle, outcome reports), pickled;
- a 64-byte shared-memory slot the child rewrites at every job start and end, so the hot path
  costs no system call; the supervisor reads it when it judges a timeout or reaps a death. It
  names the job's type too (an index into the child's types), so a death's retry backoff needs
  no query.
"""

from __future__ import annotations

import ctypes
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.sharedctypes import RawArray
from typing import TYPE_CHECKING

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


# ---- child -> supervisor ----
@dataclass(frozen=True, slots=True)
class Ready:
    pid: int


@dataclass(frozen=True, slots=True)
class Idle:
    """The last claim found nothing; wake me when there is work."""


@dataclass(frozen=True, slots=True)
class Report:
    """Outcomes since the last report: (type, kind, seconds)."""

    outcomes: tuple[tuple[str, OutcomeKind, float], ...]
    wake_latencies: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Retiring:
    """The child leaves after this batch (max_jobs_per_child, max_memory_per_child)."""

    reason: str


@dataclass(frozen=True, slots=True)
class BootFailed:
    """The child could not start. `app_error`: importing the app failed."""

    error: str
    app_error: bool


ToChild = Wake | Stop
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


# seq, job id, started, timeout (0 = none), attempt, type index (-1 = unknown)
_LAYOUT = struct.Struct("<Q16sddii")
_NO_JOB = b"\0" * 16


class JobSlot:
    """The job a child is running, in shared memory. A sequence lock keeps reads untorn:
    the writer makes `seq` odd while it writes; readers retry until they see one even value
    on both sides of their copy. `types` are the child's job types: the slot stores a type as
    its index, looked up in a dict built once."""

    def __init__(self, types: Sequence[str] = (), raw: Array[ctypes.c_char] | None = None) -> None:
        self._attach(raw if raw is not None else RawArray(ctypes.c_char, 64), tuple(types))

    def _attach(self, raw: Array[ctypes.c_char], types: tuple[str, ...]) -> None:
        self.raw = raw
        self.types = types
        self._index = {t: i for i, t in enumerate(types)}
        self._view = memoryview(raw).cast("B")
        self._seq = 0

    # Pickled for the spawned child as the shared array itself (multiprocessing passes its fd).
    def __getstate__(self) -> object:
        return (self.raw, self.types)

    def __setstate__(self, state: tuple[Array[ctypes.c_char], tuple[str, ...]]) -> None:
        self._attach(*state)

    def _write(self, job: bytes, started: float, timeout: float, attempt: int, type_: int) -> None:
        self._seq += 1
        struct.pack_into("<Q", self._view, 0, self._seq)
        _LAYOUT.pack_into(self._view, 0, self._seq, job, started, timeout, attempt, type_)
        self._seq += 1
        struct.pack_into("<Q", self._view, 0, self._seq)

    def set(
        self, job_id: JobId, started: float, timeout: float | None, attempt: int, job_type: str
    ) -> None:
        """The child starts a job (`started` by its time.monotonic())."""
        self._write(job_id.bytes, started, timeout or 0.0, attempt, self._index.get(job_type, -1))

    def clear(self) -> None:
        self._write(_NO_JOB, 0.0, 0.0, 0, -1)

    def read(self) -> SlotView | None:
        for _ in range(1000):
            before = struct.unpack_from("<Q", self._view, 0)[0]
            if before % 2:
                continue
            _, job, started, timeout, attempt, type_ = _LAYOUT.unpack_from(self._view, 0)
            if struct.unpack_from("<Q", self._view, 0)[0] == before:
                if job == _NO_JOB:
                    return None
                job_type = self.types[type_] if 0 <= type_ < len(self.types) else None
                return SlotView(
                    JobId(uuid.UUID(bytes=job)), started, timeout or None, attempt, job_type
                )
        return None
