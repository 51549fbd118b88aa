"""An app whose schedule is invalid: importing it raises ConfigError (the CLI exits 2)."""

from __future__ import annotations

import pgq_supervisor as pgq

registry = pgq.Registry()


@registry.periodic("broken", cron="0 25 * * *")
@registry.handler("tick")
def tick(payload: object) -> None: ...
