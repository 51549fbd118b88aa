"""Periodic schedules for process tests: two every-second schedules of one no-op handler, one
catching up the 3 most recent missed ticks. (The issue asks for a tick every 2 s; 1 s keeps
the tests short with the same checks.)"""

from __future__ import annotations

from datetime import timedelta

import pgq_supervisor as pgq

registry = pgq.Registry()
CATCH_UP = 3


@registry.periodic("every-second", every=timedelta(seconds=1), payload={"from": "decorator"})
@registry.handler("tick")
def tick(payload: dict[str, str]) -> None:
    """Nothing to do: the job itself, its tick and its count are what the tests read."""


registry.periodic(
    "every-second-x3", every=timedelta(seconds=1), type="tick", payload={}, catch_up=CATCH_UP
)
