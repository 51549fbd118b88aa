"""What a child's death means, decided in one place: `judge` maps what the supervisor knows of
a dead child (its slot's jobs in hand, why it was killed, how it exited, whether the supervisor
is stopping) to a Verdict. The loop acts on it (respawn, backoff, RunAlone, logs); deaths.py
writes it (database statements only). Nothing here does I/O.

The job the death is about is the one the child was killed for (`kill_job`, if still in hand;
if not, it ended first and the death is no job's fault), or else its only job in hand:
- killed for a timeout: that attempt ends as a timeout, the kill's reason as its error;
- killed because that job was cancelled: no attempt ends (the cancel ended the job already, a
  fenced end_attempt would change nothing); the death is no crash and is not logged as one;
- killed for shutdown (the deadline, a second SIGINT, our own exit), or because its heartbeat
  could not reach the database (HEARTBEAT_LOST): not the job's fault, it is released without
  an attempt;
- died by itself (SIGKILL, OOM, a segfault, an exit code): a worker death, `worker died: <how>`;
- retired or stopped (Retiring or Stop, then exit 0): no death at all, nothing is charged and
  the child is replaced at once.
The retry delay of a charged attempt comes from the handler of the slot's type: no query.

A child with many jobs in flight (inflight.py) names them all in its slot. Killed for one of
them, that one is settled as above and the others go back without an attempt. Dead by itself
holding several, nobody can tell which one killed it, so none is charged: all go back, and each
is marked to run alone (`Verdict.run_alone`) before a death counts against it. A job that kills
its child every time so dies alone the next time, and that death is charged as a worker death:
after its attempts it ends `failed`, while its neighbours, run alone once, succeed.

Whatever else the child held (claimed, not started: the slot does not name them) always goes
back without an attempt.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from pgq_supervisor.display import plural
from pgq_supervisor.errors import ExitCode
from pgq_supervisor.ipc import BootFailed, SlotView
from pgq_supervisor.jobs import AttemptKind, JobId
from pgq_supervisor.registry import Registry
from pgq_supervisor.supervisor.children import (
    CANCELLED,
    HEARTBEAT_LOST,
    SHUTDOWN,
    Child,
    describe_exit,
)


@dataclass(frozen=True, slots=True)
class DeadChild:
    """What the supervisor knows of a child that exited."""

    index: int
    pid: int | None
    worker_id: str
    in_hand: tuple[SlotView, ...]  # its slot's jobs at death
    exitcode: int | None  # as multiprocessing decodes it (negative: a signal)
    kill_reason: str | None = None  # SHUTDOWN, CANCELLED, or a timeout's error text
    kill_job: JobId | None = None  # the job the kill was meant for
    leaving: bool = False  # Stop sent, Retiring said, or being killed
    boot_failure: BootFailed | None = None
    stopping: bool = False  # the supervisor is shutting down
    wanted: bool = True  # its index is still within the target number of children

    @classmethod
    def of(cls, child: Child, *, stopping: bool, wanted: bool) -> DeadChild:
        return cls(
            index=child.spec.index, pid=child.pid, worker_id=child.worker_id,
            in_hand=tuple(child.current_jobs()), exitcode=child.proc.exitcode,
            kill_reason=child.kill_reason, kill_job=child.kill_job, leaving=child.leaving,
            boot_failure=child.boot_failure, stopping=stopping, wanted=wanted,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Charge:
    """The attempt a death ends: of `job`, as `kind` (TIMEOUT or WORKER_DEATH)."""

    job: SlotView
    kind: AttemptKind
    error: str
    delay: float  # before the retry, if attempts are left


@dataclass(frozen=True, slots=True)
class LogLine:
    level: int
    message: str


@dataclass(frozen=True, slots=True)
class Verdict:
    how: str  # 'SIGKILL', 'exit code 1', ...
    charge: Charge | None  # the attempt that ends, if one does
    cancelled: SlotView | None  # the job it was stopped for: its cancel ended it, no attempt
    # the jobs in hand that go back without an attempt (so does every job it had claimed and
    # not started, which the slot does not name)
    released: tuple[JobId, ...]
    run_alone: tuple[JobId, ...]  # released from a death that held several: run them alone
    clean: bool  # retired or stopped, and exited 0
    crash: bool  # counts towards the respawn backoff
    respawn: bool
    boot_failure: BootFailed | None  # Respawns backs off, or stops on an app that cannot load
    logs: tuple[LogLine, ...]


def judge(dead: DeadChild, registry: Registry, rng: random.Random) -> Verdict:
    """The meaning of `dead`'s death (see the module docstring). `registry` and `rng` give the
    retry delay of a charged attempt."""
    how = describe_exit(dead.exitcode)
    in_hand = dead.in_hand
    if dead.kill_job is not None:
        target = next((v for v in in_hand if v.job_id == dead.kill_job), None)
    else:
        target = in_hand[0] if len(in_hand) == 1 else None
    reason = dead.kill_reason
    killed = reason is not None or dead.kill_job is not None
    clean = dead.exitcode == ExitCode.OK and dead.leaving
    shared = tuple(v.job_id for v in in_hand) if not killed and len(in_hand) > 1 else ()
    charge = cancelled = None
    if target is not None and reason == CANCELLED:
        cancelled = target
    elif target is not None and reason is not None and reason not in (SHUTDOWN, HEARTBEAT_LOST):
        charge = Charge(target, AttemptKind.TIMEOUT, reason, retry_delay(target, registry, rng))
    elif target is not None and reason is None and not clean:
        error = f"worker died: {how}"
        delay = retry_delay(target, registry, rng)
        charge = Charge(target, AttemptKind.WORKER_DEATH, error, delay)
    charged = {v.job_id for v in (charge.job if charge else None, cancelled) if v is not None}
    logs: list[LogLine] = []
    who = f"child {dead.index} (pid {dead.pid})"
    if clean:
        logs.append(LogLine(logging.INFO, f"{who} stopped: {how}"))
    elif reason != CANCELLED:  # asked for: no warning
        logs.append(LogLine(logging.WARNING, f"{who} died: {how}"))
    if shared:
        logs.append(
            LogLine(
                logging.WARNING,
                f"child {dead.index} died ({how}) holding {plural(len(shared), 'job')}: none is"
                " charged; each runs alone next",
            )
        )
    if cancelled is not None:
        logs.append(
            LogLine(
                logging.INFO,
                f"job cancelled id={cancelled.job_id} type={cancelled.job_type}"
                f" attempt={cancelled.attempt} worker={dead.worker_id}:"
                f" child {dead.index} stopped ({how})",
            )
        )
    return Verdict(
        how=how,
        charge=charge,
        cancelled=cancelled,
        released=tuple(v.job_id for v in in_hand if v.job_id not in charged),
        run_alone=shared,
        clean=clean,
        # a cancel's stop was asked for: no respawn backoff
        crash=not clean and reason != CANCELLED,
        respawn=not dead.stopping and dead.wanted,
        boot_failure=dead.boot_failure,
        logs=tuple(logs),
    )


def retry_delay(job: SlotView, registry: Registry, rng: random.Random) -> float:
    """The retry delay of the job a child died holding, by the handler of its type."""
    if job.job_type is None:
        return 0.0
    return registry.policy(job.job_type).retry_delay(job.attempt, rng)
