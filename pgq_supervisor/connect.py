"""How a command reaches its database: the configured DSN or the embedded server, checked.

Shared by the `run`/`migrate`/`enqueue` commands (cli.py) and the admin commands (admin.py).
"""

from __future__ import annotations

import logging

from pgq_supervisor import db
from pgq_supervisor import schema as migrations
from pgq_supervisor.errors import PgqError
from pgq_supervisor.settings import Settings

log = logging.getLogger(__name__)


def resolve_dsn(settings: Settings) -> tuple[str, bool]:
    """The configured DSN, or an embedded server's (second value True)."""
    if settings.dsn:
        return settings.dsn, False
    from pgq_supervisor.embedded import DEFAULT_DATA_DIR, start_embedded

    dsn = start_embedded(DEFAULT_DATA_DIR)
    log.info("no PGQ_DSN set: using the embedded PostgreSQL in %s", DEFAULT_DATA_DIR)
    return dsn, True


def open_db(settings: Settings, *, migrate: bool = False) -> tuple[str, db.Conn]:
    """Connect (autocommit, waiting up to connect_timeout) and check the schema is migrated.

    Raises DatabaseUnavailable when the server cannot be reached, PgqError when the schema
    is behind (the embedded server, or `migrate=True`, migrates it instead).
    """
    dsn, embedded = resolve_dsn(settings)
    conn = db.connect_at_startup(
        dsn, settings.connect_timeout, prepare_threshold=settings.prepare_threshold
    )
    try:
        if migrate or embedded:
            migrations.migrate(conn, settings.db_schema)
        else:
            have = migrations.applied_versions(conn, settings.db_schema)
            want = len(migrations.available())
            if len(have) < want:
                raise PgqError(
                    f"schema {settings.db_schema!r} is at version {len(have)}, need {want}:"
                    " run `python -m pgq_supervisor migrate` first"
                )
    except BaseException:
        conn.close()
        raise
    return dsn, conn
