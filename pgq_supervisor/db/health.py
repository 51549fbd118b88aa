"""What vacuum can and cannot do, read from the server's views (the health_* statements): who
holds the xmin horizon back, and the job table's dead tuples, size and last vacuums. `doctor`
(admin/doctor.py), the supervisor's vacuum gauges and the dashboard's banner read it."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.params import NoParams, OlderThanParams, SchemaNameParams
from pgq_supervisor.db.rows import NamedRow


@dataclasses.dataclass(frozen=True, slots=True)
class Backend:
    """A session whose transaction holds the horizon, or a backend holding an xmin outside
    any transaction (a walsender's hot_standby_feedback: `transaction_age` None); `query`: its
    last, cut at 200 chars."""

    pid: int
    user_name: str
    application_name: str
    state: str
    backend_type: str  # pg_stat_activity's: client backend, walsender, ...
    transaction_age: float | None  # seconds; None: not in a transaction
    xmin_age: int  # transactions
    query: str


@dataclasses.dataclass(frozen=True, slots=True)
class Slot:
    name: str
    slot_type: str  # physical | logical
    active: bool
    xmin_age: int | None
    catalog_xmin_age: int | None
    retained_bytes: float | None  # WAL kept for it (None: it reserves none yet)


@dataclasses.dataclass(frozen=True, slots=True)
class Prepared:
    gid: str
    owner: str
    database: str
    age: float  # seconds since PREPARE TRANSACTION
    xmin_age: int


@dataclasses.dataclass(frozen=True, slots=True)
class JobTable:
    """Counts are the statistics collector's estimates."""

    live_tuples: int
    dead_tuples: int
    total_bytes: int  # with indexes and TOAST
    table_bytes: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    autovacuum_count: int
    options: list[str]  # the settings its partitions are made with (ALTER TABLE ... SET (...))
    partitions: int  # schema/0029: job is range-partitioned by id; the figures are their sums


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    name: str
    value: str


@dataclasses.dataclass(frozen=True, slots=True)
class Health:
    backends: list[Backend]
    slots: list[Slot]
    prepared: list[Prepared]
    table: JobTable | None  # None: the schema has no job table
    settings: list[Setting]


BACKEND = NamedRow(Backend)
SLOT = NamedRow(Slot)
PREPARED = NamedRow(Prepared)
JOB_TABLE = NamedRow(JobTable)
SETTING = NamedRow(Setting)


def read_health(conn: Conn, schema: str, *, older_than: float) -> Health:
    """Everything at once; `older_than`: the transaction age (seconds) from which a session
    counts as holding the horizon. Raises DatabaseError."""
    none: NoParams = {}
    age: OlderThanParams = {"older_than": older_than}
    named: SchemaNameParams = {"schema": schema}
    with wrapped():
        with cursor(conn, BACKEND) as cur:
            backends = cur.execute(statement("health_backends", schema), age).fetchall()
        with cursor(conn, SLOT) as cur:
            slots = cur.execute(statement("health_slots", schema), none).fetchall()
        with cursor(conn, PREPARED) as cur:
            prepared = cur.execute(statement("health_prepared", schema), none).fetchall()
        with cursor(conn, JOB_TABLE) as cur:
            table = cur.execute(statement("health_table", schema), named).fetchone()
        with cursor(conn, SETTING) as cur:
            settings = cur.execute(statement("health_settings", schema), none).fetchall()
    return Health(backends, slots, prepared, table, settings)
