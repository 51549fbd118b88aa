"""Handlers the benchmark supervisor runs (`--app benchmarks.apps:registry`).

Each handler is the smallest thing its measure needs; what a handler reports comes back in the
job's `result` (stored by the queue) or, for the crash probe, in a file, because a SIGKILLed
child never gets to write a result.
"""

from __future__ import annotations

import asyncio
import os
import time

import pydantic

import pgq_supervisor as pgq

NOOP = "bench_noop"
WAKE = "bench_wake"
SPIN = "bench_spin"
CRASH = "bench_crash"
BUSY = "bench_busy"
NAP = "bench_nap"

registry = pgq.Registry()
# The I/O-bound jobs of the `io` group: registries of their own, so that the async handler
# does not put every other benchmark's children on the event loop (a child serving an async
# handler runs inflight.py's loop, even at concurrency 1); the async one alone in its own, as
# an all-async application is (its children adapt their jobs in flight: worker/adaptive.py).
IO_APP = "benchmarks.apps:io_registry"
IO_THREADS_APP = "benchmarks.apps:io_threads_registry"
ASLEEP = "bench_asleep"
TSLEEP = "bench_tsleep"
io_registry = pgq.Registry()
io_threads_registry = pgq.Registry()


@registry.handler(NOOP)
def noop(payload: object) -> None:
    """Does nothing: the drain measures the queue's own cost per job."""


# The limits group: the same no-op type under a global concurrency limit. A registry of its own
# (`--app benchmarks.apps:limited`): a supervisor serving a limited type claims every type it
# serves through the limited path, which would tax the other groups' drains.
LIMIT = 1000
limited = pgq.Registry()


@limited.handler(NOOP, global_concurrency=LIMIT)
def noop_limited(payload: object) -> None:
    """Does nothing, under global_concurrency=LIMIT."""


@registry.handler(WAKE)
def wake(payload: object) -> dict[str, float]:
    """Reports the wall-clock time at which the handler started."""
    return {"t": time.time()}


class SpinPayload(pydantic.BaseModel):
    loops: int


@registry.handler(SPIN)
def spin_handler(payload: SpinPayload) -> dict[str, float]:
    """Pure-Python CPU work, about 20 ms with the calibrated loop count; reports its duration."""
    start = time.perf_counter()
    spin(payload.loops)
    return {"s": time.perf_counter() - start}


class SleepPayload(pydantic.BaseModel):
    seconds: float


@registry.handler(NAP)
def nap(payload: SleepPayload) -> None:
    """Sleeps `seconds` (0: returns at once): the hol group's one slow job among fast ones."""
    if payload.seconds > 0:
        time.sleep(payload.seconds)


@registry.handler(BUSY)
def busy(payload: object) -> None:
    """CPU-bound forever, no timeout: only a cancel (or a kill) ends it."""
    while True:
        pass


class CrashPayload(pydantic.BaseModel):
    log: str
    sleep: float = 120.0


# No backoff: the measure is the queue's reaction to a death, not a retry delay.
@registry.handler(CRASH, max_retry_count=50, retry=pgq.RetryPolicy(base=0, cap=0))
def crash_probe(payload: CrashPayload, job: pgq.Job) -> None:
    """Appends "attempt pid time" to the log file, then sleeps until it is killed."""
    line = f"{job.attempt} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(payload.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write on an O_APPEND file: lines never interleave
    finally:
        os.close(fd)
    time.sleep(payload.sleep)


def spin(loops: int) -> int:
    """The CPU-bound work: a plain Python loop that holds the GIL throughout."""
    x = 0
    for i in range(loops):
        x = (x + i * i) % 1_000_003
    return x


def calibrate_spin(seconds: float, rounds: int = 5) -> int:
    """The loop count for which spin() takes about `seconds` of CPU on this machine.

    Timed with process CPU time, not the wall clock: other load on the machine would
    otherwise make the loop look slower during calibration and the jobs come out short once
    it is gone. Takes the fastest round.
    """
    probe = 200_000
    spin(probe // 10)  # warm up
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        spin(probe)
        best = min(best, (time.process_time() - start) / probe)
    return max(1, round(seconds / best))


@io_registry.handler(ASLEEP)
async def asleep(payload: SleepPayload) -> None:
    """Waits on I/O the asyncio way: an HTTP call, say."""
    await asyncio.sleep(payload.seconds)


@io_threads_registry.handler(TSLEEP)
def tsleep(payload: SleepPayload) -> None:
    """Waits on I/O the blocking way (a sync client library): runs in the child's threads."""
    time.sleep(payload.seconds)


# The `due` benchmark (benchmarks/due.py): delayed jobs of every kind, and the no-op backlog
# beside which they come due. A registry of its own: its workflow type is not served by the
# other groups' supervisors.
DUE_APP = "benchmarks.apps:due_registry"
DUE_DELAY = 0.5  # the backoff, snooze and sleep of every delayed job: seconds
DUE_RETRY = "bench_due_retry"
DUE_SNOOZE = "bench_due_snooze"
DUE_SLEEP = "bench_due_sleep"
DUE_LATER = "bench_due_later"
due_registry = pgq.Registry()


@due_registry.handler(NOOP)
def due_noop(payload: object) -> None:
    """The backlog's jobs: the drain beside which the delayed ones come due."""


@due_registry.handler(DUE_RETRY, max_retry_count=1, retry=lambda attempt, rng: DUE_DELAY)
def due_retry(payload: object, job: pgq.Job) -> None:
    """Fails its first attempt: its retry is due DUE_DELAY later."""
    if job.attempt == 1:
        raise RuntimeError("the first attempt fails")


class UntilPayload(pydantic.BaseModel):
    until: float


@due_registry.handler(DUE_SNOOZE, max_retry_count=0)
def due_snooze(payload: UntilPayload) -> None:
    """Snoozes DUE_DELAY at a time while the wall clock is before `until`."""
    if time.time() < payload.until:
        raise pgq.Snooze(DUE_DELAY)


@due_registry.workflow(DUE_SLEEP)
def due_sleep(ctx: pgq.WorkflowContext, payload: object) -> None:
    """A workflow that sleeps DUE_DELAY once."""
    ctx.sleep("nap", DUE_DELAY)


@due_registry.handler(DUE_LATER)
def due_later(payload: object) -> None:
    """Enqueued with a start_at DUE_DELAY ahead."""
