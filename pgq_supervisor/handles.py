"""Typed task handles (issue 36): what `@registry.handler("greet")` and `@registry.workflow(...)`
give back. A handle is still the decorated function (calling it calls the function), and it
enqueues jobs of its type: the type name comes from the handle, so a producer that imports the
handler cannot misspell it, and the payload is checked against the handler's annotation before
anything is inserted (the check the worker makes when it decodes the payload).

    @registry.handler("greet")
    def greet(payload: Greeting) -> None: ...

    greet.enqueue(conn, Greeting(name="Ada"))   # mypy: the payload must be a Greeting

The payload is validated by the handler's pydantic TypeAdapter (a model, a dataclass, a
TypedDict, a plain `dict[str, int]`...) and stored as its JSON form (by alias, as the worker
reads it back). A handler without an annotation takes any JSON value, as `pgq.enqueue` does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, ParamSpec, TypeVar, Unpack, cast

from pydantic_core import PydanticSerializationError

from pgq_supervisor import client
from pgq_supervisor.errors import InvalidInput
from pgq_supervisor.jobs import JobId, JsonValue, NewJob

if TYPE_CHECKING:
    from pgq_supervisor.client import EnqueueOptions
    from pgq_supervisor.frameworks import AsyncConnLike, ConnLike
    from pgq_supervisor.registry import Handler, Registry

P = TypeVar("P")  # the payload, as the handler's annotation has it
A = ParamSpec("A")  # the handler's whole signature (payload first)
R = TypeVar("R")


class TaskHandle(Generic[P, A, R]):
    """A registered handler (or workflow) and the way to enqueue its jobs. Calling the handle
    calls the function; `.func` is the function itself, `.type` its job type. It carries
    the function's `__name__`, `__doc__` and `__wrapped__` (functools.update_wrapper), so
    `inspect.signature` reads the function's."""

    __name__: str
    __qualname__: str

    def __init__(self, registry: Registry, type_: str, func: Callable[A, R]) -> None:
        self._registry = registry
        self._type = type_
        self._func = func
        functools.update_wrapper(self, func)
        mark = getattr(inspect, "markcoroutinefunction", None)  # Python 3.12+
        if mark is not None and inspect.iscoroutinefunction(func):
            mark(self)  # inspect.iscoroutinefunction(handle) as of its function

    @property
    def type(self) -> str:
        """The job type this handle enqueues."""
        return self._type

    @property
    def func(self) -> Callable[A, R]:
        """The decorated function, unchanged."""
        return self._func

    def __call__(self, *args: A.args, **kwargs: A.kwargs) -> R:
        return self._func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<TaskHandle {self._type!r} of {getattr(self._func, '__qualname__', self._func)}>"

    def _handler(self) -> Handler:
        return self._registry.get(self._type)

    def encode(self, payload: P, *, argument: str = "payload") -> JsonValue:
        """The payload checked against the handler's annotation and in its JSON form, as it is
        stored; InvalidInput naming `argument` if it does not fit."""
        handler = self._handler()
        if handler.adapter is None:
            # no annotation: any JSON value, checked by the insert as pgq.enqueue's is
            return cast(JsonValue, payload)
        value = handler.validate(payload, argument=argument)
        try:
            dumped: JsonValue = handler.adapter.dump_python(
                value, mode="json", by_alias=True, warnings=False
            )
        except PydanticSerializationError as exc:
            raise InvalidInput(f"{argument} for {self._type!r} is not JSON: {exc}") from None
        # and as the worker decodes it: an instance is not validated again above (a model
        # made with model_construct, a dataclass given a wrong field)
        handler.validate(dumped, argument=argument)
        return dumped

    def new_job(self, payload: P, **options: Unpack[EnqueueOptions]) -> NewJob:
        """A NewJob of this type with the checked payload: for `pgq.enqueue_many` of mixed
        types or `pgq.enqueue_bundle`."""
        return NewJob(type=self._type, payload=self.encode(payload), **options)

    def enqueue(
        self,
        conn: ConnLike,
        payload: P,
        *,
        schema: str | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> JobId:
        """`pgq.enqueue(conn, <this type>, payload, **options)`, the payload checked first
        (InvalidInput naming it on a mismatch; nothing is inserted then)."""
        return client.enqueue(conn, self._type, self.encode(payload), schema=schema, **options)

    async def enqueue_async(
        self,
        conn: AsyncConnLike,
        payload: P,
        *,
        schema: str | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> JobId:
        """`enqueue` for an async connection."""
        encoded = self.encode(payload)
        return await client.enqueue_async(conn, self._type, encoded, schema=schema, **options)

    def enqueue_many(
        self,
        conn: ConnLike,
        payloads: Sequence[P],
        *,
        schema: str | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> list[JobId]:
        """One job per payload, in one statement (`pgq.enqueue_many`), each with the same
        options; every payload is checked before anything is inserted (InvalidInput naming
        `payloads[i]`). Returns the ids in order."""
        if isinstance(payloads, str | bytes) or not isinstance(payloads, Sequence):
            raise InvalidInput(f"payloads must be a sequence, got {type(payloads).__name__}")
        jobs = [
            NewJob(type=self._type, payload=self.encode(p, argument=f"payloads[{i}]"), **options)
            for i, p in enumerate(payloads)
        ]
        return client.enqueue_many(conn, jobs, schema=schema)
