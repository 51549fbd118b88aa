"""Connections: opening them, naming their errors, and turning psycopg's errors into ours;
the transaction of a writing call (`atomic`) and the cursors of every statement (`cursor`)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterator
from typing import LiteralString, TypeVar

import psycopg
from psycopg import conninfo, postgres, sql
from psycopg import errors as pg_errors
from psycopg.abc import Loader
from psycopg.adapt import AdaptersMap
from psycopg.pq import Format, TransactionStatus
from psycopg.rows import AsyncRowFactory, RowFactory, TupleRow
from psycopg.types.json import JsonbLoader, JsonLoader

from pgq_supervisor import sql as queries
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.errors import (
    DatabaseError,
    DatabaseUnavailable,
    InvalidInput,
    SchemaNotMigrated,
)
from pgq_supervisor.redaction import hide_password, redact

Conn = psycopg.Connection[TupleRow]
AsyncConn = psycopg.AsyncConnection[TupleRow]
R = TypeVar("R")

log = logging.getLogger(__name__)

DEFAULT_SCHEMA = "pgq"
# psycopg's own default: a statement is prepared on the server from its fifth use. None turns
# that off, for PgBouncer in transaction mode without max_prepared_statements (before 1.21).
PREPARE_THRESHOLD = 5


def default_schema() -> str:
    return os.environ.get("PGQ_SCHEMA") or DEFAULT_SCHEMA


def statement(name: str, schema: str) -> bytes:
    """The named statement of sql/queries.sql, bound to `schema`, rendered once."""
    return queries.query_bytes(name, schema)


FAILED_TRANSACTION = (
    "the connection's transaction has failed (an earlier statement raised): roll it back"
    " before using it"
)


@contextlib.contextmanager
def wrapped() -> Iterator[None]:
    """Turn psycopg's errors into ours, once, at the database boundary."""
    try:
        yield
    except pg_errors.InFailedSqlTransaction as exc:
        raise DatabaseError(FAILED_TRANSACTION) from exc
    except pg_errors.UniqueViolation as exc:
        raise InvalidInput(f"unique_key conflict: {exc.diag.message_detail or exc}") from exc
    except pg_errors.CheckViolation as exc:
        raise InvalidInput(f"rejected by the database: {exc.diag.message_primary}") from exc
    except psycopg.Error as exc:
        if _schema_missing(exc):
            raise SchemaNotMigrated(f"{_one_line(exc)}: {NOT_MIGRATED}") from exc
        raise DatabaseError(_one_line(exc)) from exc


NOT_MIGRATED = (
    "the queue's schema is missing or older than this code:"
    " run `python -m pgq_supervisor migrate` (or pgq.migrate(conn)) first"
)


def _schema_missing(exc: psycopg.Error) -> bool:
    """Whether a statement of ours failed for want of the schema's objects: its tables, its
    schema, its functions (not an operator: a bad parameter type says that too), its columns
    (a schema older than the code)."""
    if isinstance(exc, pg_errors.UndefinedFunction):
        return (exc.diag.message_primary or "").startswith("function ")
    return isinstance(
        exc, pg_errors.UndefinedTable | pg_errors.InvalidSchemaName | pg_errors.UndefinedColumn
    )


def _one_line(exc: psycopg.Error) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"


def describe_connect_error(exc: psycopg.OperationalError) -> str:
    """One line that tells wrong host, wrong password and missing database apart."""
    text = str(exc).strip()
    low = text.lower()
    if "password authentication failed" in low or "no password supplied" in low:
        kind = "authentication failed (wrong user or password)"
    elif "does not exist" in low and "database" in low:
        kind = "database does not exist"
    elif "role" in low and "does not exist" in low:
        kind = "user does not exist"
    elif any(s in low for s in ("could not translate host", "name or service not known")):
        kind = "unknown host"
    elif any(s in low for s in ("connection refused", "no such file or directory", "timeout")):
        kind = "server not reachable"
    else:
        kind = "cannot connect"
    detail = next((ln for ln in reversed(text.splitlines()) if ln.strip()), text)
    return f"{kind}: {detail.strip()}"


def is_permanent_connect_error(exc: psycopg.OperationalError) -> bool:
    """Wrong password, user or database: retrying will not help."""
    low = str(exc).lower()
    return "authentication failed" in low or "does not exist" in low or "no password" in low


def connect(
    dsn: str,
    *,
    autocommit: bool = True,
    application_name: str = "pgq_supervisor",
    synchronous_commit: bool = True,
    prepare_threshold: int | None = PREPARE_THRESHOLD,
) -> Conn:
    """A connection. `synchronous_commit=False` is for the queue's own bookkeeping only (claims,
    heartbeats, completions): a commit lost in a server crash then means the job runs again,
    never that it is lost. Behind PgBouncer in transaction mode a session SET would leak to
    other clients, so such deployments keep it on (setting `worker_synchronous_commit`)."""
    try:
        conn = psycopg.connect(
            dsn,
            autocommit=autocommit,
            application_name=application_name,
            prepare_threshold=prepare_threshold,
        )
    except psycopg.Error as exc:
        # libpq's message may quote the password, or a piece of it (see redaction)
        raise DatabaseError(hide_password(_one_line(exc), dsn)) from exc
    with wrapped():
        if not synchronous_commit:
            conn.execute(statement("asynchronous_commit", DEFAULT_SCHEMA))
        return conn


def connect_at_startup(
    dsn: str,
    timeout: float,
    *,
    prepare_threshold: int | None = PREPARE_THRESHOLD,
    attempt_timeout: int = 5,
) -> Conn:
    """Connect, retrying a database that is not reachable yet for up to `timeout` seconds
    (0: one attempt), each attempt given `attempt_timeout` seconds (libpq's connect_timeout,
    2 at least) for a host that does not answer.

    Wrong password, unknown user and missing database fail at once: waiting cannot fix them.
    When the first attempt fails and a wait follows, one line is logged at once naming the
    host and port (never the password) and how long it waits, so a process that waits is not
    silent until its error line. Raises DatabaseUnavailable with one line that says which it
    was.
    """
    backoff = Backoff(initial=0.2, maximum=2.0)
    attempts = 0

    def attempt() -> Conn:
        nonlocal attempts
        attempts += 1
        try:
            return psycopg.connect(
                dsn,
                autocommit=True,
                application_name="pgq-supervisor",
                connect_timeout=attempt_timeout,
                prepare_threshold=prepare_threshold,
            )
        except psycopg.OperationalError as exc:
            if attempts == 1 and timeout > 0 and not is_permanent_connect_error(exc):
                kind = describe_connect_error(exc).partition(":")[0]
                log.warning(
                    "waiting for the database at %s (%s): retrying for up to %g s",
                    _host_port(dsn),
                    kind,
                    timeout,
                )
            raise

    try:
        return backoff.retry(
            attempt,
            retry_on=psycopg.OperationalError,
            deadline=backoff.clock() + timeout,
            give_up=lambda exc: (
                isinstance(exc, psycopg.OperationalError) and is_permanent_connect_error(exc)
            ),
        )
    except psycopg.OperationalError as exc:
        why = hide_password(describe_connect_error(exc), dsn)
        raise DatabaseUnavailable(f"cannot connect to {redact(dsn)}: {why}") from exc
    except psycopg.ProgrammingError as exc:  # the DSN does not parse: no use retrying
        raise DatabaseUnavailable(f"invalid dsn: {hide_password(_one_line(exc), dsn)}") from exc


def _host_port(dsn: str) -> str:
    """`host:port` of a DSN (libpq's defaults and $PGHOST/$PGPORT where it names none), for a
    log line: nothing else of it, so no password."""
    try:
        info = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "the configured DSN"
    host = str(info.get("host") or info.get("hostaddr") or os.environ.get("PGHOST") or "")
    port = str(info.get("port") or os.environ.get("PGPORT") or "5432")
    return f"{host or 'the local socket'}:{port}"


def durable_commit(conn: Conn) -> None:
    """Make the open transaction commit synchronously (the session may have it off)."""
    with wrapped():
        conn.execute(statement("durable_commit", DEFAULT_SCHEMA))


async def durable_commit_async(conn: AsyncConn) -> None:
    """`durable_commit` on an async connection."""
    with wrapped():
        await conn.execute(statement("durable_commit", DEFAULT_SCHEMA))


@contextlib.contextmanager
def counting_reads(conn: Conn) -> Iterator[None]:
    """A transaction for the statements that count the queue (metrics, `status`) with no
    JIT compilation, which costs them more than it saves (each statement still reads its own
    snapshot). A SET LOCAL, so it is safe behind a pooler in transaction mode."""
    with wrapped(), conn.transaction():
        conn.execute(statement("no_jit", DEFAULT_SCHEMA))
        yield


def asynchronous_commit_sql() -> bytes:
    """The statement that turns synchronous_commit off for a session (pooled connections)."""
    return statement("asynchronous_commit", DEFAULT_SCHEMA)


def _on_channel(verb: LiteralString, channel: str) -> sql.Composed:
    return sql.SQL(verb + " {}").format(sql.Identifier(channel))


def listen(conn: Conn, channel: str) -> None:
    """LISTEN on `channel` (an identifier, quoted here)."""
    with wrapped():
        conn.execute(_on_channel("LISTEN", channel))


def unlisten(conn: Conn, channel: str) -> None:
    with wrapped():
        conn.execute(_on_channel("UNLISTEN", channel))


async def listen_async(conn: AsyncConn, channel: str) -> None:
    with wrapped():
        await conn.execute(_on_channel("LISTEN", channel))


async def unlisten_async(conn: AsyncConn, channel: str) -> None:
    with wrapped():
        await conn.execute(_on_channel("UNLISTEN", channel))


# ---- the transaction of a writing call ------------------------------------------------------


def _begins_first(conn: Conn | AsyncConn) -> bool:
    """Whether `atomic` must open the connection's implicit transaction before its savepoint.

    Without autocommit and with nothing sent yet (what Django's atomic() and SQLAlchemy's
    Session.begin() look like before their first statement), psycopg's transaction() would be
    the outermost one and COMMIT the caller's transaction: so the implicit transaction is
    begun first (by a statement: psycopg has no call that only begins it) and transaction()
    becomes a savepoint in it."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:  # said before psycopg's savepoint fails on it
        raise DatabaseError(FAILED_TRANSACTION)
    return status == TransactionStatus.IDLE and not conn.autocommit


@contextlib.contextmanager
def atomic(conn: Conn) -> Iterator[None]:
    """All of the block or nothing of it, never committing the caller's transaction: its own
    transaction on an autocommit connection, else a savepoint in the caller's transaction
    (begun first when the connection has sent nothing yet), which an error rolls back to, so
    the caller's transaction stays usable. psycopg's errors become ours."""
    with wrapped():
        if _begins_first(conn):
            conn.execute(statement("begin_implicit", DEFAULT_SCHEMA))
        with conn.transaction():
            yield


@contextlib.asynccontextmanager
async def atomic_async(conn: AsyncConn) -> AsyncIterator[None]:
    """`atomic` on an async connection."""
    with wrapped():
        if _begins_first(conn):
            await conn.execute(statement("begin_implicit", DEFAULT_SCHEMA))
        async with conn.transaction():
            yield


# ---- the cursors of every statement ---------------------------------------------------------


def _our_json_loaders() -> list[tuple[int, type[Loader]]]:
    """psycopg's own json and jsonb loaders (json.loads) of text results (our cursors' format),
    as register_loader stores them (its C implementation swaps in optimised classes):
    comparing against those keeps the common case, psycopg's defaults, two look-ups."""
    ours = AdaptersMap(psycopg.adapters)
    found = []
    for name, loader in (("json", JsonLoader), ("jsonb", JsonbLoader)):
        oid = postgres.types[name].oid
        ours.register_loader(oid, loader)
        stored = ours.get_loader(oid, Format.TEXT)
        assert stored is not None
        found.append((oid, stored))
    return found


# json and jsonb load as Python values whatever the connection registered: Django loads jsonb
# as text, and a payload would come back a str.
_JSON_LOADERS = _our_json_loaders()


def _load_json(adapters: AdaptersMap) -> None:
    """Give a cursor's own adapters (a copy-on-write child of the connection's) our json and
    jsonb loaders, where the connection's differ; the connection keeps its own."""
    for oid, loader in _JSON_LOADERS:
        if adapters.get_loader(oid, Format.TEXT) is not loader:
            adapters.register_loader(oid, loader)


def cursor(conn: Conn, row_factory: RowFactory[R]) -> psycopg.Cursor[R]:
    """A cursor for the queue's statements, on any connection: every statement of db/ whose
    rows are read runs on one, so json and jsonb come back as Python values everywhere.
    (What we write needs nothing: JSON goes as text we made, never through a json dumper.)"""
    cur = conn.cursor(row_factory=row_factory)
    _load_json(cur.adapters)
    return cur


def cursor_async(conn: AsyncConn, row_factory: AsyncRowFactory[R]) -> psycopg.AsyncCursor[R]:
    """`cursor` on an async connection."""
    cur = conn.cursor(row_factory=row_factory)
    _load_json(cur.adapters)
    return cur
