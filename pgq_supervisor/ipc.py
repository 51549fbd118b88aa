"""What the supervisor and a child tell each other.

Two channels per child:
- a duplex pipe for rare messages (wake, stop, ready, idle, outcome reports), pickled;
- a 64-byte shared-memory slot the child rewrites at every job start and end, so the hot path
  costs no system call; the supervisor reads it when it judges a timeout or reaps a death.
"""

from __future__ import annotations

import ctypes
import struct
import uuid
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
    started: float  # time.monotonic() in the child; CLOCK_MONOTONIC is system-wide
    timeout: float | None
    attempt: int


# seq, job id, started, timeout (0 = none), attempt
_LAYOUT = struct.Struct("<Q16sddi")


class JobSlot:
    """The job a child is running, in shared memory. A sequence lock keeps reads untorn:
    the writer makes `seq` odd while it writes; readers retry until they see one even value
    on both sides of their copy."""

    def __init__(self, raw: Array[ctypes.c_char] | None = None) -> None:
        self._attach(raw if raw is not None else RawArray(ctypes.c_char, 64))

    def _attach(self, raw: Array[ctypes.c_char]) -> None:
        self.raw = raw
        self._view = memoryview(raw).cast("B")
        self._seq = 0

    # Pickled for the spawned child as the shared array itself (multiprocessing passes its fd).
    def __getstate__(self) -> object:
        return self.raw

    def __setstate__(self, raw: Array[ctypes.c_char]) -> None:
        self._attach(raw)

    def _write(self, job: bytes, started: float, timeout: float, attempt: int) -> None:
        self._seq += 1
        struct.pack_into("<Q", self._view, 0, self._seq)
        _LAYOUT.pack_into(self._view, 0, self._seq, job, started, timeout, attempt)
        self._seq += 1
        struct.pack_into("<Q", self._view, 0, self._seq)

    def set(self, job_id: JobId, started: float, timeout: float | None, attempt: int) -> None:
        self._write(job_id.bytes, started, timeout or 0.0, attempt)

    def clear(self) -> None:
        self._write(b"\0" * 16, 0.0, 0.0, 0)

    def read(self) -> SlotView | None:
        for _ in range(1000):
            before = struct.unpack_from("<Q", self._view, 0)[0]
            if before % 2:
                continue
            _, job, started, timeout, attempt = _LAYOUT.unpack_from(self._view, 0)
            if struct.unpack_from("<Q", self._view, 0)[0] == before:
                if job == b"\0" * 16:
                    return None
                return SlotView(JobId(uuid.UUID(bytes=job)), started, timeout or None, attempt)
        return None
