"""What a child's death means (supervisor/verdicts.py): one table of dead children, each with
the verdict `judge` must reach. Pure: no process, no pipe, no database."""

from __future__ import annotations

import logging
import random
import signal
import uuid
from dataclasses import dataclass

import pytest

from pgq_supervisor.errors import ExitCode
from pgq_supervisor.ipc import BootFailed, SlotView
from pgq_supervisor.jobs import AttemptKind, JobId
from pgq_supervisor.registry import Registry
from pgq_supervisor.supervisor.children import CANCELLED, HEARTBEAT_LOST, SHUTDOWN
from pgq_supervisor.supervisor.verdicts import Charge, DeadChild, judge

SIGKILL, SIGTERM = -signal.SIGKILL, -signal.SIGTERM
BOOT = BootFailed("cannot connect", app_error=False)


def _registry() -> Registry:
    registry = Registry()

    @registry.handler("t", retry=lambda attempt, rng: 10.0 * attempt)
    def t(payload: dict[str, int]) -> None:
        return None

    return registry


def _view(n: int, attempt: int = 1) -> SlotView:
    return SlotView(JobId(uuid.UUID(int=n)), 0.0, 5.0, attempt, "t")


A, B, C = _view(1), _view(2, attempt=2), _view(3)


@dataclass(frozen=True)
class Case:
    """A dead child and what its verdict must say (charge: (job, kind, error, delay))."""

    dead: DeadChild
    charge: tuple[SlotView, AttemptKind, str, float] | None = None
    cancelled: SlotView | None = None
    released: tuple[SlotView, ...] = ()
    run_alone: tuple[SlotView, ...] = ()
    clean: bool = False
    crash: bool = True
    respawn: bool = True
    logs: tuple[tuple[int, str], ...] = ()  # (level, a part of the message)


def _dead(
    in_hand: tuple[SlotView, ...],
    exitcode: int,
    *,
    kill_reason: str | None = None,
    kill_job: JobId | None = None,
    leaving: bool = False,
    boot_failure: BootFailed | None = None,
    stopping: bool = False,
    wanted: bool = True,
) -> DeadChild:
    return DeadChild(
        index=0, pid=4242, worker_id="w", in_hand=in_hand, exitcode=exitcode,
        kill_reason=kill_reason, kill_job=kill_job, leaving=leaving, boot_failure=boot_failure,
        stopping=stopping, wanted=wanted,
    )  # fmt: skip


WARN, INFO = logging.WARNING, logging.INFO
TIMEOUT = "timeout after 5 s"
CASES = {
    "killed for a timeout": Case(
        _dead((A,), SIGTERM, kill_reason=TIMEOUT, kill_job=A.job_id, leaving=True),
        charge=(A, AttemptKind.TIMEOUT, TIMEOUT, 10.0),
        logs=((WARN, "child 0 (pid 4242) died: SIGTERM"),),
    ),
    "killed for a timeout of one of several: the others go back": Case(
        _dead((A, B, C), SIGKILL, kill_reason=TIMEOUT, kill_job=B.job_id, leaving=True),
        charge=(B, AttemptKind.TIMEOUT, TIMEOUT, 20.0),
        released=(A, C),
        logs=((WARN, "died: SIGKILL"),),
    ),
    "killed for a timeout, but the job ended first: nothing charged": Case(
        _dead((A,), SIGTERM, kill_reason=TIMEOUT, kill_job=C.job_id, leaving=True),
        released=(A,),
        logs=((WARN, "died: SIGTERM"),),
    ),
    "stopped for a cancel: no attempt, no crash, no warning": Case(
        _dead((A, B), SIGTERM, kill_reason=CANCELLED, kill_job=A.job_id, leaving=True),
        cancelled=A,
        released=(B,),
        crash=False,
        logs=((INFO, f"job cancelled id={A.job_id} type=t attempt=1 worker=w: child 0 stopped"),),
    ),
    "killed at the shutdown deadline: released": Case(
        _dead((A,), SIGKILL, kill_reason=SHUTDOWN, leaving=True, stopping=True),
        released=(A,),
        respawn=False,
        logs=((WARN, "died: SIGKILL"),),
    ),
    "killed for shutdown holding several: released, none runs alone": Case(
        _dead((A, B), SIGKILL, kill_reason=SHUTDOWN, leaving=True, stopping=True),
        released=(A, B),
        respawn=False,
        logs=((WARN, "died: SIGKILL"),),
    ),
    "stopped because its heartbeat lost the database: released, no attempt (issue 27)": Case(
        _dead((A,), SIGTERM, kill_reason=HEARTBEAT_LOST, leaving=True),
        released=(A,),
        logs=((WARN, "died: SIGTERM"),),
    ),
    "the same holding several: all go back, none runs alone": Case(
        _dead((A, B), SIGKILL, kill_reason=HEARTBEAT_LOST, leaving=True),
        released=(A, B),
        logs=((WARN, "died: SIGKILL"),),
    ),
    "SIGKILL holding one job: a worker death": Case(
        _dead((B,), SIGKILL),
        charge=(B, AttemptKind.WORKER_DEATH, "worker died: SIGKILL", 20.0),
        logs=((WARN, "child 0 (pid 4242) died: SIGKILL"),),
    ),
    "SIGKILL holding several: none charged, each runs alone": Case(
        _dead((A, B, C), SIGKILL),
        released=(A, B, C),
        run_alone=(A, B, C),
        logs=(
            (WARN, "died: SIGKILL"),
            (WARN, "child 0 died (SIGKILL) holding 3 jobs: none is charged; each runs alone"),
        ),
    ),
    "an exit code holding nothing: a crash, nothing charged": Case(
        _dead((), 1),
        logs=((WARN, "died: exit code 1"),),
    ),
    "exit 0 unasked, holding a job: a worker death": Case(
        _dead((A,), 0),
        charge=(A, AttemptKind.WORKER_DEATH, "worker died: exit code 0", 10.0),
        logs=((WARN, "died: exit code 0"),),
    ),
    "retired (Retiring, exit 0): clean, replaced at once": Case(
        _dead((), 0, leaving=True),
        clean=True,
        crash=False,
        logs=((INFO, "child 0 (pid 4242) stopped: exit code 0"),),
    ),
    "retired with a job left in its slot: no death, it goes back": Case(
        _dead((A,), 0, leaving=True),
        released=(A,),
        clean=True,
        crash=False,
        logs=((INFO, "stopped: exit code 0"),),
    ),
    "a boot failure: counted, a crash": Case(
        _dead((), ExitCode.CHILD_BOOT_FAILURE, boot_failure=BOOT),
        logs=((WARN, "died: boot failure"),),
    ),
    "stopped during shutdown: clean, not respawned": Case(
        _dead((), 0, leaving=True, stopping=True),
        clean=True,
        crash=False,
        respawn=False,
        logs=((INFO, "stopped: exit code 0"),),
    ),
    "died by itself during shutdown: charged, not respawned": Case(
        _dead((A,), SIGKILL, leaving=True, stopping=True),
        charge=(A, AttemptKind.WORKER_DEATH, "worker died: SIGKILL", 10.0),
        respawn=False,
        logs=((WARN, "died: SIGKILL"),),
    ),
    "stopped by SIGTTOU (its index beyond the target): not respawned": Case(
        _dead((), 0, leaving=True, wanted=False),
        clean=True,
        crash=False,
        respawn=False,
        logs=((INFO, "stopped: exit code 0"),),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_verdict_on_a_death(case: Case) -> None:
    verdict = judge(case.dead, _registry(), random.Random(1))
    expected = None if case.charge is None else Charge(*case.charge)
    assert verdict.charge == expected
    assert verdict.cancelled == case.cancelled
    assert verdict.released == tuple(v.job_id for v in case.released)
    assert verdict.run_alone == tuple(v.job_id for v in case.run_alone)
    assert (verdict.clean, verdict.crash, verdict.respawn) == (
        case.clean,
        case.crash,
        case.respawn,
    )
    assert verdict.boot_failure is case.dead.boot_failure
    assert len(verdict.logs) == len(case.logs), verdict.logs
    for line, (level, part) in zip(verdict.logs, case.logs, strict=True):
        assert line.level == level and part in line.message, line


def test_a_job_of_a_type_unknown_to_the_slot_retries_at_once() -> None:
    unknown = SlotView(JobId(uuid.UUID(int=9)), 0.0, None, 3, None)
    verdict = judge(_dead((unknown,), SIGKILL), _registry(), random.Random(1))
    assert verdict.charge == Charge(unknown, AttemptKind.WORKER_DEATH, "worker died: SIGKILL", 0.0)
