"""Producer: enqueues through a connection pool, one short transaction per call, for code that
has no transaction of its own (client.py's calls take the caller's connection instead)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Unpack, overload

from pgq_supervisor import db
from pgq_supervisor.client import EnqueueOptions, enqueue, enqueue_async
from pgq_supervisor.jobs import JobId, JobRecord, JsonValue, NewJob
from pgq_supervisor.manage import _check_type, _schema
from pgq_supervisor.waiting import wait, wait_async

if TYPE_CHECKING:
    # imported lazily: worker children import this package and never need the pool
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

    from pgq_supervisor.registry import Registry


class Producer:
    """Enqueues through a connection pool, one short transaction per call, for code that has
    no transaction of its own. Works with ConnectionPool (sync methods) and
    AsyncConnectionPool (the `_async` methods).

    With `registry=` (opt-in), a type the registry has no handler for is refused before
    anything is written (InvalidInput: "no handler for job type 'gret' (did you mean
    'greet'?)"), and a payload that does not fit the handler's annotation too: a misspelt type
    fails at once instead of waiting for a supervisor that never comes."""

    @overload
    def __init__(
        self,
        pool: ConnectionPool[db.Conn],
        *,
        schema: str | None = None,
        registry: Registry | None = None,
    ) -> None: ...
    @overload
    def __init__(
        self,
        pool: AsyncConnectionPool[db.AsyncConn],
        *,
        schema: str | None = None,
        registry: Registry | None = None,
    ) -> None: ...
    def __init__(
        self,
        pool: ConnectionPool[db.Conn] | AsyncConnectionPool[db.AsyncConn],
        *,
        schema: str | None = None,
        registry: Registry | None = None,
    ) -> None:
        self._pool = pool
        self._schema = _schema(schema)
        self._registry = registry

    def _check(self, type_: str, payload: JsonValue) -> None:
        """With a registry: InvalidInput for a type it does not know or a payload that does not
        fit its handler (as pgq.enqueue stores it: null is {})."""
        if self._registry is not None:
            _check_type(type_)
            self._registry.get(type_).validate({} if payload is None else payload)

    def _sync_pool(self) -> ConnectionPool[db.Conn]:
        from psycopg_pool import ConnectionPool

        if not isinstance(self._pool, ConnectionPool):
            raise TypeError("this Producer wraps an AsyncConnectionPool: use enqueue_async")
        return self._pool

    def _async_pool(self) -> AsyncConnectionPool[db.AsyncConn]:
        from psycopg_pool import AsyncConnectionPool

        if not isinstance(self._pool, AsyncConnectionPool):
            raise TypeError("this Producer wraps a ConnectionPool: use enqueue")
        return self._pool

    # Each method owns its pooled connection: its transaction() is the outermost one and
    # commits (the calls inside it join it, in a savepoint where they need one).
    def enqueue(
        self, type: str, payload: JsonValue = None, **options: Unpack[EnqueueOptions]
    ) -> JobId:
        self._check(type, payload)
        with self._sync_pool().connection() as conn, conn.transaction():
            return enqueue(conn, type, payload, schema=self._schema, **options)

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[JobId]:
        for job in jobs:
            if isinstance(job, NewJob):  # anything else: db.enqueue_many says what is wrong
                self._check(job.type, job.payload)
        with self._sync_pool().connection() as conn, conn.transaction():
            return db.enqueue_many(conn, self._schema, jobs)

    async def enqueue_async(
        self, type: str, payload: JsonValue = None, **options: Unpack[EnqueueOptions]
    ) -> JobId:
        self._check(type, payload)
        async with self._async_pool().connection() as conn, conn.transaction():
            return await enqueue_async(conn, type, payload, schema=self._schema, **options)

    def enqueue_and_wait(
        self,
        type: str,
        payload: JsonValue = None,
        *,
        wait_timeout: float | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> JobRecord:
        """Enqueue (committed), then `pgq.wait` for the job on a pooled connection, which is
        held for the whole wait. TimeoutError after `wait_timeout` seconds: the job itself is
        left alone (it still runs; cancel it if it should not)."""
        job_id = self.enqueue(type, payload, **options)
        with self._sync_pool().connection() as conn:
            return wait(conn, job_id, wait_timeout, schema=self._schema)

    async def enqueue_and_wait_async(
        self,
        type: str,
        payload: JsonValue = None,
        *,
        wait_timeout: float | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> JobRecord:
        """`enqueue_and_wait` for an AsyncConnectionPool."""
        job_id = await self.enqueue_async(type, payload, **options)
        async with self._async_pool().connection() as conn:
            return await wait_async(conn, job_id, wait_timeout, schema=self._schema)
