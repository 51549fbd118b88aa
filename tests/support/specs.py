"""The one way a test builds a child's ChildSpec: the defaults a test child runs with, and
what the test changes."""

from __future__ import annotations

import dataclasses
from typing import Any

from pgq_supervisor.ipc import ChildSpec


def child_spec(dsn: str, **changes: Any) -> ChildSpec:
    """A ChildSpec of child 0 serving type "t" of `tests:registry`, with `changes` applied
    (`types=("a",)`, `concurrency=10`, `app=...`)."""
    spec = ChildSpec(
        index=0,
        worker_id="test/child-0",
        app="tests:registry",
        dsn=dsn,
        schema="pgq",
        types=("t",),
        heartbeat_interval=1.0,
        claim_batch=10,
        max_jobs=None,
        max_memory_mb=None,
        log_level="info",
        log_format="text",
    )
    return dataclasses.replace(spec, **changes)
