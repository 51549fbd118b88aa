"""Handlers for the job-options process tests (docs/job-options.md): snoozing ones, sync
and async. A job that waits for a moment snoozes until it comes, so the test reads from the
database how often it snoozed and when it finally ran."""

from __future__ import annotations

import time

import pgq_supervisor as pgq

registry = pgq.Registry()


@registry.handler("wait_sync", max_retry_count=0)
def wait_sync(payload: dict[str, float]) -> dict[str, float]:
    if time.time() < payload["until"]:
        raise pgq.Snooze(payload.get("every", 0.2))
    return {"ran_at": time.time()}


@registry.handler("wait_async", max_retry_count=0)
async def wait_async(payload: dict[str, float]) -> object:
    if time.time() < payload["until"]:
        return pgq.Snooze(payload.get("every", 0.2))  # returned, not raised: the same
    return {"ran_at": time.time()}


@registry.handler("never_ready", max_snoozes=2)
def never_ready(payload: object) -> None:
    raise pgq.Snooze(0.1)


@registry.handler("reindex")
def reindex(payload: dict[str, float]) -> dict[str, float]:
    """Long enough for a test to debounce while it runs."""
    started = time.time()
    time.sleep(payload.get("seconds", 1.0))  # the job's simulated work
    return {"version": payload["version"], "start": started, "end": time.time()}


@registry.handler("busy")
def busy(payload: object) -> None:
    time.sleep(0.02)  # the job's simulated work


@registry.handler("aged", aging=(0.3, 10))
def aged(payload: object) -> None:
    return None


@registry.handler("unaged")
def unaged(payload: object) -> None:
    return None


@registry.handler("in_order")
def in_order(payload: dict[str, int]) -> dict[str, float]:
    started = time.time()
    time.sleep(0.03)  # the job's simulated work: long enough for runs to overlap if allowed
    return {"start": started, "end": time.time()}


@registry.handler("flaky", max_retry_count=2, retry=lambda attempt, rng: 0.3)
def flaky(payload: object, job: pgq.Job) -> dict[str, float]:
    """Fails its first attempt; its retry is due 0.3 s later (test_due_wake.py)."""
    if job.attempt == 1:
        raise RuntimeError("first attempt fails")
    return {"ran_at": time.time()}


@registry.handler("later")
def later(payload: object) -> dict[str, float]:
    return {"ran_at": time.time()}
