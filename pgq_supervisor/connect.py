"""How a command reaches its database: the configured DSN or the embedded server, checked.

Shared by the `run`/`migrate`/`enqueue` commands (cli.py) and the admin commands (admin/), and
by the public `pgq.connect()` / `pgq.connect_async()`, which reach the same database.
"""

from __future__ import annotations

import logging

import psycopg

from pgq_supervisor import db
from pgq_supervisor import schema as migrations
from pgq_supervisor.errors import SchemaNotMigrated
from pgq_supervisor.settings import Settings, load_settings

log = logging.getLogger(__name__)


def resolve_dsn(settings: Settings) -> tuple[str, bool]:
    """The configured DSN, or an embedded server's (second value True)."""
    if settings.dsn:
        return settings.dsn, False
    from pgq_supervisor.embedded import project_data_dir, start_embedded

    data_dir = project_data_dir()
    dsn = start_embedded(data_dir)
    log.info("no PGQ_DSN set: using the embedded PostgreSQL in %s", data_dir)
    return dsn, True


def _target(dsn: str | None) -> tuple[str, str, bool]:
    """(DSN, schema, embedded) for connect()/connect_async()."""
    settings = load_settings(dsn=dsn)
    found, embedded = resolve_dsn(settings)
    return found, settings.db_schema, embedded


def _migrate_embedded(dsn: str, schema: str) -> None:
    """Migrate the embedded server's schema, as the CLI does on it (a no-op once it is)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrations.migrate(conn, schema)


def connect(dsn: str | None = None, *, autocommit: bool = False) -> db.Conn:
    """A connection to the queue's database: `dsn`, else PGQ_DSN (and the other PGQ_*
    settings, as the CLI reads them), else the embedded server the supervisor and the CLI use
    when no DSN is set (the `embedded` extra; started on first use, its data in the project's
    `.pgq/pgdata`: see docs/guide.md), whose schema it migrates as they do. A plain psycopg
    connection: use it as any other, and close it (or `with pgq.connect() as conn:`)."""
    found, schema, embedded = _target(dsn)
    if embedded:
        _migrate_embedded(found, schema)
    conn: db.Conn = psycopg.connect(found, autocommit=autocommit)
    return conn


async def connect_async(dsn: str | None = None, *, autocommit: bool = False) -> db.AsyncConn:
    """connect() for asyncio: an `AsyncConnection` to the same database."""
    found, schema, embedded = _target(dsn)
    if embedded:  # the migrations are synchronous code: a moment, once per server start
        _migrate_embedded(found, schema)
    conn: db.AsyncConn = await psycopg.AsyncConnection.connect(found, autocommit=autocommit)
    return conn


# An admin command's one attempt, for a host that does not answer (libpq's least value)
FAIL_FAST_TIMEOUT = 2


def open_db(
    settings: Settings, *, migrate: bool = False, wait: bool = False
) -> tuple[str, db.Conn]:
    """Connect (autocommit) and check the schema is migrated.

    `wait`: retry a database not reachable yet for up to connect_timeout, as a process that
    starts beside it does (`run`, `dashboard`, `demo`: SPEC §6). Without it, one attempt that
    gives up after FAIL_FAST_TIMEOUT seconds: an admin command or `enqueue` run by a person or
    a script should say at once that the database is down, not after 15 s.

    Raises DatabaseUnavailable when the server cannot be reached, SchemaNotMigrated when the schema
    is behind (the embedded server, or `migrate=True`, migrates it instead).
    """
    dsn, embedded = resolve_dsn(settings)
    wait = wait or embedded  # a server this process has just started may still be coming up
    conn = db.connect_at_startup(
        dsn,
        settings.connect_timeout if wait else 0,
        prepare_threshold=settings.prepare_threshold,
        attempt_timeout=5 if wait else FAIL_FAST_TIMEOUT,
    )
    try:
        if migrate or embedded:
            migrations.migrate(conn, settings.db_schema, lock_timeout=settings.migrate_lock_timeout)
        else:
            have = migrations.applied_versions(conn, settings.db_schema)
            want = len(migrations.available())
            if len(have) < want:
                raise SchemaNotMigrated(
                    f"schema {settings.db_schema!r} is at version {len(have)}, need {want}:"
                    " run `python -m pgq_supervisor migrate` first"
                )
    except BaseException:
        conn.close()
        raise
    return dsn, conn
