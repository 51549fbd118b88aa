"""This supervisor's row in the supervisor table (schema/0010), which the Workers page and
`workers` read: upserted every heartbeat_interval (a timer), deleted on a clean exit."""

from __future__ import annotations

import logging
import os
import random
import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from pgq_supervisor import db
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.jobs import JsonValue
from pgq_supervisor.supervisor.children import Child
from pgq_supervisor.supervisor.maintenance import ControlConnection

log = logging.getLogger(__name__)


class Registration:
    def __init__(self, control: ControlConnection, schema: str, rng: random.Random) -> None:
        self.control = control
        self.schema = schema
        self.host = socket.gethostname()
        self.started_at = datetime.now(UTC)
        # its children's worker ids start with it and a colon: what a rescuer matches when
        # this supervisor's lock is freed (queries.sql, rescue_orphans)
        self.id = f"{self.host}:{os.getpid()}:{rng.getrandbits(32):08x}"

    def register(
        self,
        procs: int,
        types: Sequence[str],
        children: Mapping[int, Child],
        *,
        locked_on: str | None = None,
    ) -> None:
        """Upsert the row, with what each child's describe() says; `locked_on`: the server
        epoch this supervisor holds its session lock in (schema/0016). Raises DatabaseError."""
        described: list[JsonValue] = [c.describe() for _, c in sorted(children.items())]
        self.control.run(
            lambda conn: db.register_supervisor(
                conn, self.schema, id=self.id, host=self.host, pid=os.getpid(), procs=procs,
                types=types, started_at=self.started_at, children=described, locked_on=locked_on,
            )
        )  # fmt: skip

    def unregister(self) -> None:
        try:
            self.control.run(lambda conn: db.unregister_supervisor(conn, self.schema, self.id))
        except DatabaseError as exc:
            # the row goes stale, and another supervisor's upsert deletes it after an hour
            log.warning("could not unregister this supervisor: %s", exc)
