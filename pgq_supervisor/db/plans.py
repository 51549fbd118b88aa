"""One source for the sync and the async calls: a call is written once as a *plan*, a generator
that yields the statements it needs (sans I/O) and decides from their results; `run` drives it
on a psycopg Connection and `run_async` on an AsyncConnection. The plan holds the logic
(validation, which statement, what a result means, errors); the two drivers hold only I/O.

A plan says `rows = yield from fetch(query, params, row_factory)`, `n = yield from
execute(query, params)`, `yield from copy(query, chunks)`, `r = yield from atomic(plan)`
(db.connection.atomic around another plan) or `yield from savepoint(plan)` (a bare
`conn.transaction()`). A statement's psycopg error is thrown into the plan where it yielded,
so `with wrapped():` and `try/except` in a plan work as in straight-line code. Steps do not
wrap errors themselves: the plan says where (as `wrapped()` did before).

`Twin(plan_function)` gives the plan a sync face (`twin(conn, ...)`, what db's callers call)
and an async one (`await twin.run_async(aconn, ...)`); `twin.plan(...)` composes it into
another plan.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Generic, ParamSpec, Protocol, TypeAlias, TypeVar

from psycopg import sql
from psycopg.abc import Params
from psycopg.rows import BaseRowFactory, tuple_row

from pgq_supervisor.db.connection import (
    AsyncConn,
    Conn,
    atomic_async,
    cursor,
    cursor_async,
)
from pgq_supervisor.db.connection import atomic as atomic_sync

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
# what Connection.execute takes (a named statement's bytes, composed SQL, a literal)
Query: TypeAlias = str | bytes | sql.SQL | sql.Composed


class Step(Protocol):
    """One piece of I/O a plan asks for; the driver runs it and the step keeps its result."""

    def run(self, conn: Conn) -> None: ...

    async def run_async(self, conn: AsyncConn) -> None: ...


Plan = Generator[Step, None, T]


class _Driving(Generic[T]):
    """A plan being driven: its next step, given how the last one ended; its result at the end."""

    def __init__(self, plan: Plan[T]) -> None:
        self.plan = plan
        self.error: BaseException | None = None  # what the last step raised, for the plan
        self.result: T

    def next_step(self) -> Step | None:
        error, self.error = self.error, None
        try:
            return self.plan.send(None) if error is None else self.plan.throw(error)
        except StopIteration as stop:
            self.result = stop.value
            return None


def run(conn: Conn, plan: Plan[T]) -> T:
    """Drive `plan` on `conn`: each step runs, its error (if any) is thrown into the plan."""
    driving = _Driving(plan)
    while (step := driving.next_step()) is not None:
        try:
            step.run(conn)
        except BaseException as exc:  # the plan decides: handle, wrap or let it go
            driving.error = exc
    return driving.result


async def run_async(conn: AsyncConn, plan: Plan[T]) -> T:
    """`run` on an async connection."""
    driving = _Driving(plan)
    while (step := driving.next_step()) is not None:
        try:
            await step.run_async(conn)
        except BaseException as exc:
            driving.error = exc
    return driving.result


class _Fetch(Generic[R]):
    def __init__(self, query: Query, params: Params | None, row_factory: BaseRowFactory[R]):
        self.query, self.params, self.row_factory = query, params, row_factory
        self.rows: list[R] = []

    def run(self, conn: Conn) -> None:
        with cursor(conn, self.row_factory) as cur:
            self.rows = cur.execute(self.query, self.params).fetchall()

    async def run_async(self, conn: AsyncConn) -> None:
        async with cursor_async(conn, self.row_factory) as cur:
            await cur.execute(self.query, self.params)
            self.rows = await cur.fetchall()


class _Execute:
    def __init__(self, query: Query, params: Params | None) -> None:
        self.query, self.params = query, params
        self.rowcount = -1

    def run(self, conn: Conn) -> None:
        self.rowcount = conn.execute(self.query, self.params).rowcount

    async def run_async(self, conn: AsyncConn) -> None:
        self.rowcount = (await conn.execute(self.query, self.params)).rowcount


class _Copy:
    def __init__(self, query: Query, chunks: Iterable[str]) -> None:
        self.query, self.chunks = query, chunks

    def run(self, conn: Conn) -> None:
        with cursor(conn, tuple_row) as cur, cur.copy(self.query) as copying:
            for chunk in self.chunks:
                copying.write(chunk)

    async def run_async(self, conn: AsyncConn) -> None:
        async with cursor_async(conn, tuple_row) as cur, cur.copy(self.query) as copying:
            for chunk in self.chunks:
                await copying.write(chunk)


class _Atomic(Generic[T]):
    """The plan inside db.connection.atomic (`bare`: inside conn.transaction() only, which
    neither wraps errors nor begins the caller's implicit transaction first)."""

    def __init__(self, plan: Plan[T], *, bare: bool) -> None:
        self.plan, self.bare = plan, bare
        self.result: T  # set by run or run_async, which the driver calls before resuming

    def run(self, conn: Conn) -> None:
        with conn.transaction() if self.bare else atomic_sync(conn):
            self.result = run(conn, self.plan)

    async def run_async(self, conn: AsyncConn) -> None:
        async with conn.transaction() if self.bare else atomic_async(conn):
            self.result = await run_async(conn, self.plan)


def fetch(query: Query, params: Params | None, row_factory: BaseRowFactory[R]) -> Plan[list[R]]:
    """The statement's rows (json and jsonb as Python values: db.connection.cursor)."""
    step = _Fetch(query, params, row_factory)
    yield step
    return step.rows


def fetch_one(
    query: Query, params: Params | None, row_factory: BaseRowFactory[R]
) -> Plan[R | None]:
    """The statement's first row, or None."""
    found = yield from fetch(query, params, row_factory)
    return found[0] if found else None


def execute(query: Query, params: Params | None = None) -> Plan[int]:
    """Run the statement; its rowcount."""
    step = _Execute(query, params)
    yield step
    return step.rowcount


def copy(query: Query, chunks: Iterable[str]) -> Plan[None]:
    """COPY ... FROM STDIN, writing each chunk of COPY text as it is made."""
    yield _Copy(query, chunks)


def atomic(plan: Plan[T]) -> Plan[T]:
    """`plan` all or nothing: db.connection.atomic around it (never commits the caller's
    transaction; psycopg's errors become ours)."""
    step = _Atomic(plan, bare=False)
    yield step
    return step.result


def savepoint(plan: Plan[T]) -> Plan[T]:
    """`plan` in a bare conn.transaction() (a savepoint inside a transaction): its errors
    come out as psycopg raised them."""
    step = _Atomic(plan, bare=True)
    yield step
    return step.result


class Twin(Generic[P, T]):
    """A plan function with its two faces: call it with a Connection (the sync call), or
    `await twin.run_async(aconn, ...)`; `twin.plan(...)` is the plan itself."""

    def __init__(self, plan: Callable[P, Plan[T]]) -> None:
        self.plan = plan
        self.__doc__ = plan.__doc__
        self.__name__ = plan.__name__

    def __call__(self, conn: Conn, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return run(conn, self.plan(*args, **kwargs))

    async def run_async(self, conn: AsyncConn, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await run_async(conn, self.plan(*args, **kwargs))
