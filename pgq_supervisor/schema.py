"""Migration runner: numbered, forward-only SQL files applied under an advisory lock.

Migrations live in `schema/NNNN_name.sql` at the top of the source tree and ship inside the
wheel as `pgq_supervisor/schema/`. Each runs with `search_path` set to the target schema, so
the files hold no schema name; identifiers are composed with psycopg.sql. Only the version
numbers are recorded (no checksum): an applied file is never read again.

`migrate`, `pending` and `applied_versions` are plans (db/plans.py): `migrate(conn, schema)`
runs sync, `await migrate.run_async(aconn, schema)` async.

Adding a migration: the next free number; names unqualified, functions with `SET search_path
FROM CURRENT`; never change what a released file does (databases that applied it keep the
old one; only the version number is recorded, so a comment may be corrected). Then run
`scripts/dump-schema` and commit the regenerated `schema/current.sql` with it:
tests/integration/test_schema_dump.py fails until then.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import LiteralString

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow, tuple_row

from pgq_supervisor.db import wrapped
from pgq_supervisor.db.plans import Plan, Twin, atomic, execute, fetch, fetch_one, savepoint
from pgq_supervisor.errors import MigrationLocked, PgqError

log = logging.getLogger(__name__)

_FILE_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")
# Any constant shared by every pgq_supervisor process: concurrent migrate calls queue on it.
_LOCK_KEY = 0x70677173  # "pgqs"
# how long migrate() waits for that lock by default (the setting migrate_lock_timeout)
DEFAULT_LOCK_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    path: Path


def migrations_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "schema", here.parent / "schema"):
        if candidate.is_dir():
            return candidate
    raise PgqError(f"migrations not found next to {here}")


def available() -> list[Migration]:
    found = []
    for path in sorted(migrations_dir().iterdir()):
        m = _FILE_RE.match(path.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), path))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise PgqError(f"migration numbers must run 1..N without gaps, found {versions}")
    return found


@Twin
def applied_versions(schema: str) -> Plan[list[int]]:
    # a cursor of tuples: a caller's connection may have another row factory (dict_row)
    with wrapped():
        exists = yield from fetch_one(
            "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'schema_version'",
            (schema,),
            tuple_row,
        )
        if exists is None:
            return []
        rows = yield from fetch(
            sql.SQL("SELECT version FROM {}.schema_version ORDER BY version").format(
                sql.Identifier(schema)
            ),
            None,
            tuple_row,
        )
    return [int(r[0]) for r in rows]


@Twin
def pending(schema: str) -> Plan[list[Migration]]:
    """The migrations `schema` has not applied yet (read only: any role that may read the
    schema's `schema_version` may ask)."""
    current = set((yield from applied_versions.plan(schema)))
    return [m for m in available() if m.version not in current]


@Twin
def migrate(schema: str, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> Plan[list[int]]:
    """Bring `schema` up to the newest migration. Returns the versions applied now.

    With nothing to apply it only reads (`schema_version`): a role without DDL rights, such as
    a worker's, may call it. Else it is safe to call from many processes at once: they
    serialise on an advisory lock and the later ones find nothing to do. A session holding
    that lock longer than `lock_timeout` seconds (0: do not wait) makes it raise
    MigrationLocked naming the holder; it logs one WARNING naming the holder when it starts
    to wait. Everything happens in one `atomic` block (its own transaction on an autocommit
    connection, else a savepoint in the caller's, which commits it and holds the lock until
    then): a failing migration leaves the database as it was.
    """
    if not (yield from atomic(pending.plan(schema))):
        return []
    return (yield from atomic(_apply(schema, lock_timeout)))


def _apply(schema: str, lock_timeout: float) -> Plan[list[int]]:
    ident = sql.Identifier(schema)
    done: list[int] = []
    yield from _take_lock(lock_timeout)
    yield from execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
    yield from execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.schema_version ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(ident)
    )
    current = set((yield from applied_versions.plan(schema)))
    # In the caller's transaction a SET LOCAL outlives the savepoint: put its path back after.
    row = yield from fetch_one("SELECT current_setting('search_path')", None, tuple_row)
    callers_path = None if row is None else str(row[0])
    # pg_temp named last: functions capture this path (SET search_path FROM CURRENT), and one
    # that runs as its owner must not resolve a name to its caller's temporary table
    yield from execute(sql.SQL("SET LOCAL search_path TO {}, pg_catalog, pg_temp").format(ident))
    for mig in available():
        if mig.version in current:
            continue
        # Our own packaged file, never input.
        text: LiteralString = mig.path.read_text(encoding="utf-8")
        yield from execute(text)
        yield from execute(
            sql.SQL("INSERT INTO {}.schema_version (version, name) VALUES (%s, %s)").format(ident),
            (mig.version, mig.name),
        )
        done.append(mig.version)
    yield from execute("SELECT set_config('search_path', %s, true)", (callers_path,))
    return done


# the sessions holding the migration lock (in this database), for the lines that name them
_HOLDERS = """
SELECT l.pid, coalesce(a.usename, '?'), coalesce(a.application_name, '')
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = (%(key)s::bigint >> 32)::oid AND l.objid = (%(key)s::bigint & 4294967295)::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY l.pid
"""


def _holders() -> Plan[str]:
    """Who holds the migration lock: `pid 123 (user app, application_name 'psql')`."""
    rows = yield from fetch(_HOLDERS, {"key": _LOCK_KEY}, tuple_row)
    if not rows:
        return "another session (gone since)"
    return ", ".join(
        f"pid {pid} (user {user}, application_name {app!r})" for pid, user, app in rows
    )


def _take_lock(timeout: float) -> Plan[None]:
    """The migration lock, for this transaction: at once if free, else waited for up to
    `timeout` seconds (said once, naming the holder), else MigrationLocked."""
    row = yield from fetch_one("SELECT pg_try_advisory_xact_lock(%s)", (_LOCK_KEY,), tuple_row)
    if row is not None and row[0]:
        return
    holder = yield from _holders()
    if timeout > 0:
        log.warning(
            "waiting up to %g s (migrate_lock_timeout) for the migration lock, held by %s",
            timeout,
            holder,
        )
        before = yield from fetch_one("SELECT current_setting('lock_timeout')", None, tuple_row)
        try:
            # a savepoint: a timeout leaves the block usable
            yield from savepoint(_wait_for_lock(timeout, None if before is None else before[0]))
            return
        except psycopg.errors.LockNotAvailable:
            holder = yield from _holders()
    raise MigrationLocked(
        f"the migration lock is held by {holder}: waited {timeout:g} s for it"
        " (migrate_lock_timeout, migrate --lock-timeout); nothing applied"
    )


def _wait_for_lock(timeout: float, callers_timeout: object) -> Plan[None]:
    yield from execute(
        "SELECT set_config('lock_timeout', %s, true)", (f"{max(1, round(timeout * 1000))}ms",)
    )
    yield from execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
    # the savepoint's release keeps the lock (it is the transaction's) and the setting: the
    # caller's own lock_timeout back
    yield from execute(
        "SELECT set_config('lock_timeout', %s, true)",
        (None if callers_timeout is None else str(callers_timeout),),
    )


def drop(conn: psycopg.Connection[TupleRow], schema: str) -> None:
    """Drop `schema` and everything in it (the pytest plugin's per-test schemas)."""
    with wrapped():
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
