"""The caller's connection in each state a writing call can find it in (sync and async), as
context managers whose end commits or rolls back the caller's transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgq_supervisor.db import AsyncConn, Conn

State = Callable[[str, bool], AbstractContextManager[Conn]]


@contextmanager
def _autocommit(dsn: str, commit: bool) -> Iterator[Conn]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@contextmanager
def _idle(dsn: str, commit: bool) -> Iterator[Conn]:
    """No autocommit, nothing sent yet: the first statement opens the transaction."""
    with psycopg.connect(dsn) as conn:
        yield conn
        conn.commit() if commit else conn.rollback()


@contextmanager
def _after_statement(dsn: str, commit: bool) -> Iterator[Conn]:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1")
        yield conn
        conn.commit() if commit else conn.rollback()


@contextmanager
def _in_transaction(dsn: str, commit: bool) -> Iterator[Conn]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction(force_rollback=not commit):
        yield conn


@contextmanager
def _in_savepoint(dsn: str, commit: bool) -> Iterator[Conn]:
    """Inside a savepoint of the caller's transaction; only the savepoint rolls back, the
    transaction around it commits."""
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        conn.transaction(),
        conn.transaction(force_rollback=not commit),
    ):
        yield conn


@contextmanager
def _pooled(dsn: str, commit: bool) -> Iterator[Conn]:
    """A psycopg_pool connection: the pool commits it when the block ends."""
    with ConnectionPool(dsn, min_size=1, max_size=1) as pool, pool.connection() as conn:
        yield conn
        if not commit:
            conn.rollback()


SYNC_STATES: dict[str, State] = {
    "autocommit": _autocommit,
    "idle": _idle,
    "after_statement": _after_statement,
    "in_transaction": _in_transaction,
    "in_savepoint": _in_savepoint,
    "pool": _pooled,
}

AsyncState = Callable[[str, bool], AbstractAsyncContextManager[AsyncConn]]


@asynccontextmanager
async def _a_autocommit(dsn: str, commit: bool) -> AsyncIterator[AsyncConn]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        yield conn


@asynccontextmanager
async def _a_idle(dsn: str, commit: bool) -> AsyncIterator[AsyncConn]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        yield conn
        await (conn.commit() if commit else conn.rollback())


@asynccontextmanager
async def _a_after_statement(dsn: str, commit: bool) -> AsyncIterator[AsyncConn]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("SELECT 1")
        yield conn
        await (conn.commit() if commit else conn.rollback())


@asynccontextmanager
async def _a_in_transaction(dsn: str, commit: bool) -> AsyncIterator[AsyncConn]:
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        conn.transaction(force_rollback=not commit),
    ):
        yield conn


@asynccontextmanager
async def _a_in_savepoint(dsn: str, commit: bool) -> AsyncIterator[AsyncConn]:
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        conn.transaction(),
        conn.transaction(force_rollback=not commit),
    ):
        yield conn


@asynccontextmanager
async def _a_pooled(dsn: str, commit: bool) -> AsyncIterator[AsyncConn]:
    async with (
        AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool,
        pool.connection() as conn,
    ):
        yield conn
        if not commit:
            await conn.rollback()


ASYNC_STATES: dict[str, AsyncState] = {
    "autocommit": _a_autocommit,
    "idle": _a_idle,
    "after_statement": _a_after_statement,
    "in_transaction": _a_in_transaction,
    "in_savepoint": _a_in_savepoint,
    "pool": _a_pooled,
}


def matrix(states: Mapping[str, object]) -> list[tuple[str, bool]]:
    """Each state with a commit and a rollback (an autocommit connection has no rollback)."""
    return [(s, c) for s in states for c in (True, False) if c or s != "autocommit"]


def case_id(case: object) -> str:
    return case if isinstance(case, str) else ("commit" if case else "rollback")
