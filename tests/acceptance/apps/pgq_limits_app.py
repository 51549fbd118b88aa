"""Handlers under concurrency limits, for process tests. An app of its own: a supervisor
serving a limited type claims all its types through the limited path (schema/0008)."""

from __future__ import annotations

import time

import pgq_supervisor as pgq

registry = pgq.Registry()


@registry.handler("limited", global_concurrency=3)
def limited(payload: dict[str, float]) -> None:
    time.sleep(payload["seconds"])  # the job's simulated work


@registry.handler("keyed", key_concurrency=1)
def keyed(payload: dict[str, float]) -> dict[str, float]:
    """Returns when it started and ended by this host's clock: the test checks that no two
    jobs of a key overlapped. started_at and stopped_at cannot show it: they are the claiming
    and the completing transactions' start times, and a claim that waited on the type's lock
    for a completion to commit began before it."""
    start = time.time()
    time.sleep(payload["seconds"])  # the job's simulated work
    return {"start": start, "end": time.time()}


@registry.handler("serial", global_concurrency=1)
def serial(payload: dict[str, float]) -> None:
    time.sleep(payload["seconds"])  # the job's simulated work
