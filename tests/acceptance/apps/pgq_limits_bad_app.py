"""An app whose handler declares global_concurrency=0: importing it raises ConfigError (the CLI
exits 2)."""

from __future__ import annotations

import pgq_supervisor as pgq

registry = pgq.Registry()


@registry.handler("limited", global_concurrency=0)
def limited(payload: object) -> None: ...
