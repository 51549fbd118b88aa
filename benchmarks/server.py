"""The PostgreSQL server under test and the scratch databases the harness makes on it."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.abc import Params
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow

import pgq_supervisor as pgq
from pgq_supervisor.db import partitions as db_partitions

LOCAL_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=2"
SCHEMA = "pgq"


@dataclass(frozen=True, slots=True)
class Server:
    dsn: str  # of a database we may connect to for CREATE/DROP DATABASE
    origin: str  # "given", "local" or "embedded"

    def info(self) -> dict[str, str]:
        """Version and the settings that decide the figures (durability, memory)."""
        names = (
            "server_version",
            "fsync",
            "synchronous_commit",
            "shared_buffers",
            "max_connections",
        )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            out = {n: scalar(conn, sql.SQL("SHOW {}").format(sql.Identifier(n))) for n in names}
        params = conninfo_to_dict(self.dsn)
        params.pop("password", None)
        out["dsn"] = " ".join(f"{k}={v}" for k, v in params.items())
        out["origin"] = self.origin
        return out


def scalar(
    conn: psycopg.Connection[TupleRow], query: sql.SQL | sql.Composed, params: Params | None = None
) -> str:
    """The first column of the first row, as text ("" if there is no row)."""
    row = conn.execute(query, params).fetchone()
    return "" if row is None or row[0] is None else str(row[0])


def find_server(dsn: str | None) -> Server:
    """The given DSN, else PostgreSQL on 127.0.0.1:5432 if it answers, else an embedded server
    (started for this process, stopped when it exits)."""
    if dsn:
        return Server(dsn, "given")
    try:
        psycopg.connect(LOCAL_DSN).close()
        return Server(LOCAL_DSN, "local")
    except psycopg.OperationalError:
        pass
    from pgq_supervisor.embedded import start_embedded

    # a short root: the server's socket path must stay under 108 bytes
    root = Path(tempfile.mkdtemp(prefix="pgqb"))
    # registered first, so it runs after the server's own exit hook has stopped it
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return Server(start_embedded(root / "pgdata"), "embedded")


def db_dsn(server: Server, dbname: str) -> str:
    return make_conninfo(server.dsn, dbname=dbname)


class Scratch:
    """Scratch databases named bench_<run id>_<purpose>, all dropped by close()."""

    def __init__(self, server: Server, *, partitioned: bool = False) -> None:
        self.server = server
        self.run_id = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.created: list[str] = []
        self.partitioned = partitioned

    def create(self, purpose: str, *, migrate: bool = False) -> str:
        """Create an empty database (with our schema if `migrate`); returns its DSN."""
        name = f"bench_{self.run_id}_{purpose}"
        with psycopg.connect(self.server.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.created.append(name)
        dsn = db_dsn(self.server, name)
        if migrate:
            with psycopg.connect(dsn, autocommit=True) as conn:
                pgq.migrate(conn, schema=SCHEMA)
                if self.partitioned:  # --partitioned: the opt-in layout (schema/0029)
                    db_partitions.convert(conn, SCHEMA, interval=86400.0, lock_timeout=10.0)
        return dsn

    def close(self) -> None:
        with psycopg.connect(self.server.dsn, autocommit=True) as admin:
            while self.created:
                name = self.created.pop()
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def settle(dsn: str, tables: list[str]) -> None:
    """VACUUM ANALYZE the freshly filled tables and CHECKPOINT, so every system starts a timed
    run with fresh statistics, no dead tuples and no checkpoint pending. The table names are
    ours (qualified identifiers), never input."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in tables:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(*table.split("."))))
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")


class StartGate:
    """A starting line for the workers of a timed drain.

    While the gate is closed the harness holds `table` in EXCLUSIVE mode: plain reads go on,
    but every claim (FOR UPDATE / UPDATE) waits for the lock, so the workers boot at their own
    pace and then queue up. `open()` releases them all at once and returns the database clock
    at that moment, which is where the timed drain starts. Without it, children still booting
    would share the two cores with the first claims and the figure would time the boot.
    """

    def __init__(self, dsn: str, table: str, application_name: str) -> None:
        self.dsn = dsn
        self.table = table
        self.application_name = application_name
        self.conn = psycopg.connect(dsn)
        self.watch = psycopg.connect(dsn, autocommit=True)
        self.conn.execute(
            sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(sql.Identifier(*table.split(".")))
        )

    def waiting(self) -> int:
        """Worker sessions (by application_name) waiting for the gate's lock."""
        query = sql.SQL(
            "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND l.locktype = 'relation' AND l.relation = {}::regclass"
            # pg_locks spans every database, and copies of one template share table oids
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND a.application_name = {}"
        ).format(sql.Literal(self.table), sql.Literal(self.application_name))
        return int(scalar(self.watch, query) or 0)

    def open(self) -> float:
        """Release the waiting workers; returns the database clock (epoch seconds) at release."""
        at = float(scalar(self.conn, sql.SQL("SELECT extract(epoch FROM clock_timestamp())")))
        self.conn.commit()
        return at

    def close(self) -> None:
        self.conn.close()
        self.watch.close()
