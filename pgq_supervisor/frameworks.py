"""The connections of frameworks, unwrapped to the psycopg connection under them.

Every public function that takes `conn` accepts, besides a psycopg connection:
- a SQLAlchemy `Session` or `Connection` (sync functions), `AsyncSession` or `AsyncConnection`
  (the `_async` ones), on the psycopg dialect (`postgresql+psycopg://`): the call joins the
  session's or connection's transaction, begun here when none is (as SQLAlchemy's autobegin
  would), so the job commits or rolls back with the caller's rows;
- Django's connection wrapper (`django.db.connection`, with Django's psycopg 3 backend):
  connected here, and inside `atomic()` the call joins its transaction.

Duck-typed: neither SQLAlchemy nor Django is imported (both are optional). The Protocols below
describe the shapes used, so user code type-checks (mypy --strict) with no cast and without
either package's stubs.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol, TypeAlias, cast

import psycopg

from pgq_supervisor import db


class _PoolProxied(Protocol):
    """SQLAlchemy's PoolProxiedConnection: the DBAPI connection and the driver's under it."""

    @property
    def driver_connection(self) -> object: ...


class SAConnectionLike(Protocol):
    """A SQLAlchemy `Connection`."""

    @property
    def connection(self) -> _PoolProxied: ...
    def in_transaction(self) -> bool: ...
    def begin(self) -> object: ...


class SASessionLike(Protocol):
    """A SQLAlchemy `Session` (or `scoped_session`)."""

    def connection(self) -> SAConnectionLike: ...
    def get_bind(self) -> object: ...


class DjangoConnectionLike(Protocol):
    """Django's connection wrapper (`django.db.connection`, `connections["default"]`)."""

    def ensure_connection(self) -> None: ...


class SAAsyncConnectionLike(Protocol):
    """A SQLAlchemy `AsyncConnection`."""

    @property
    def sync_connection(self) -> object: ...
    def in_transaction(self) -> bool: ...
    def begin(self) -> Awaitable[object]: ...
    def get_raw_connection(self) -> Awaitable[_PoolProxied]: ...


class SAAsyncSessionLike(Protocol):
    """A SQLAlchemy `AsyncSession`."""

    @property
    def sync_session(self) -> object: ...
    def connection(self) -> Awaitable[SAAsyncConnectionLike]: ...


# Any row factory: the queue reads through its own cursors (db.connection.cursor).
ConnLike: TypeAlias = (
    "psycopg.Connection[Any] | SASessionLike | SAConnectionLike | DjangoConnectionLike"
)
AsyncConnLike: TypeAlias = (
    "psycopg.AsyncConnection[Any] | SAAsyncSessionLike | SAAsyncConnectionLike"
)

_DIALECT = "a SQLAlchemy connection on the psycopg dialect (postgresql+psycopg://)"


def _driver(raw: _PoolProxied, what: str) -> object:
    driver = raw.driver_connection
    if driver is None:
        raise TypeError(f"the {what} has no open DBAPI connection")
    return driver


def as_psycopg(conn: ConnLike) -> db.Conn:
    """The psycopg connection under `conn`, in `conn`'s transaction (see the module)."""
    if isinstance(conn, psycopg.Connection):
        return cast(db.Conn, conn)  # the row factory is the connection's, never used by us
    if isinstance(conn, psycopg.AsyncConnection):
        raise TypeError("an AsyncConnection needs the _async function (enqueue_async, ...)")
    if hasattr(conn, "sync_session") or hasattr(conn, "sync_connection"):
        raise TypeError(
            "a SQLAlchemy AsyncSession/AsyncConnection needs the _async function (enqueue_async)"
        )
    if hasattr(conn, "ensure_connection"):  # Django's wrapper: connect, then its connection
        conn.ensure_connection()
        driver: object = getattr(conn, "connection", None)
        if not isinstance(driver, psycopg.Connection):
            raise TypeError(
                "Django's connection must use the psycopg (3) backend"
                " (django.db.backends.postgresql with psycopg installed)"
            )
        return cast(db.Conn, driver)
    if hasattr(conn, "get_bind") and callable(getattr(conn, "connection", None)):
        conn = cast(SASessionLike, conn).connection()  # begins the session's transaction
    if hasattr(conn, "in_transaction") and hasattr(conn, "connection"):
        sa = cast(SAConnectionLike, conn)
        if not sa.in_transaction():
            sa.begin()  # what autobegin would do: the caller's commit() commits our rows
        driver = _driver(sa.connection, "SQLAlchemy connection")
        if isinstance(driver, psycopg.Connection):
            return cast(db.Conn, driver)
        raise TypeError(f"need {_DIALECT}, got a {type(driver).__name__} driver connection")
    raise TypeError(
        f"expected a psycopg Connection, a SQLAlchemy Session or Connection, or Django's"
        f" connection; got {type(conn).__name__}"
    )


async def as_psycopg_async(conn: AsyncConnLike) -> db.AsyncConn:
    """The psycopg AsyncConnection under `conn`, in `conn`'s transaction (see the module)."""
    if isinstance(conn, psycopg.AsyncConnection):
        return cast(db.AsyncConn, conn)
    if isinstance(conn, psycopg.Connection):
        raise TypeError("a sync Connection needs the sync function (enqueue, wait, ...)")
    if hasattr(conn, "sync_session"):
        conn = await cast(SAAsyncSessionLike, conn).connection()  # begins its transaction
    if hasattr(conn, "sync_connection") and hasattr(conn, "get_raw_connection"):
        sa = conn
        if not sa.in_transaction():
            await sa.begin()  # what autobegin would do
        driver = _driver(await sa.get_raw_connection(), "SQLAlchemy AsyncConnection")
        if isinstance(driver, psycopg.AsyncConnection):
            return cast(db.AsyncConn, driver)
        raise TypeError(f"need {_DIALECT}, got a {type(driver).__name__} driver connection")
    raise TypeError(
        "expected a psycopg AsyncConnection or a SQLAlchemy AsyncSession or AsyncConnection;"
        f" got {type(conn).__name__}"
    )
