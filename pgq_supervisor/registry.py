"""Handlers, their payload validation and policy. No database, no processes.

A handler's policy (timeout, retry budget, backoff; policy.py) is resolved here, once, at
registration; the worker, the executor and the supervisor ask it rather than each working it
out. Registering gives back a TaskHandle (handles.py): the function, and its type's enqueue.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from difflib import get_close_matches
from typing import Concatenate, ParamSpec, TypeVar

import pydantic

from pgq_supervisor.aging import Aging
from pgq_supervisor.errors import AppLoadError, ConfigError, InvalidInput
from pgq_supervisor.handles import TaskHandle
from pgq_supervisor.jobs import JsonValue, check_type_name
from pgq_supervisor.limits import Limits as Limits
from pgq_supervisor.limits import Rate as Rate
from pgq_supervisor.periodic import Schedule
from pgq_supervisor.policy import DEFAULT_MAX_RETRY_COUNT as DEFAULT_MAX_RETRY_COUNT
from pgq_supervisor.policy import DEFAULT_MAX_SNOOZES as DEFAULT_MAX_SNOOZES
from pgq_supervisor.policy import UNHANDLED as UNHANDLED
from pgq_supervisor.policy import Backoff as Backoff
from pgq_supervisor.policy import ClaimPolicy as ClaimPolicy
from pgq_supervisor.policy import Policy as Policy
from pgq_supervisor.policy import RetryPolicy as RetryPolicy

F = TypeVar("F", bound=Callable[..., object])
P = TypeVar("P")  # a handler's payload, as annotated
A = ParamSpec("A")  # the rest of a handler's parameters
R = TypeVar("R")
C = TypeVar("C")  # a workflow's context


@dataclass(frozen=True, slots=True)
class Handler:
    type: str
    func: Callable[..., object]
    adapter: pydantic.TypeAdapter[object] | None
    wants_job: bool
    wants_conn: bool
    policy: Policy
    rate: Rate | None = None
    limits: Limits | None = None
    concurrency: int | None = None  # at most this many of the type in flight in one child
    ephemeral: bool = False  # its jobs are deleted at success (no history row)
    aging: Aging | None = None  # its pending jobs' priority rises with their wait
    workflow: bool = False  # `func(ctx, payload)`: the executor gives it its context

    @property
    def is_async(self) -> bool:
        """An `async def` handler: run on the child's event loop."""
        return inspect.iscoroutinefunction(self.func)

    @property
    def timeout(self) -> float | None:
        return self.policy.timeout

    @property
    def max_retry_count(self) -> int:
        return self.policy.max_retry_count

    @property
    def backoff(self) -> Backoff:
        return self.policy.backoff

    def validate(self, payload: object, *, argument: str = "payload") -> object:
        """The payload as the handler's annotation wants it; InvalidInput (naming `argument`)
        if it does not fit."""
        if self.adapter is None:
            return payload
        try:
            return self.adapter.validate_python(payload)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "payload"
            raise InvalidInput(
                f"{argument} for {self.type!r} is invalid: {where}: {first['msg']}"
                + (f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else "")
            ) from exc


@dataclass
class Registry:
    """Maps job types to handlers.

    >>> registry = Registry()
    >>> @registry.handler("resize_image", timeout=60, max_retry_count=5)
    ... def resize(payload: dict, job: Job) -> dict: ...
    """

    handlers: dict[str, Handler] = field(default_factory=dict)
    schedules: dict[str, Schedule] = field(default_factory=dict)

    def handler(
        self,
        type_: str,
        *,
        timeout: float | None = None,
        max_retry_count: int = DEFAULT_MAX_RETRY_COUNT,
        retry: RetryPolicy | Backoff | None = None,
        rate: tuple[int, float | timedelta] | None = None,
        global_concurrency: int | None = None,
        key_concurrency: int | None = None,
        concurrency: int | None = None,
        ephemeral: bool = False,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
        aging: tuple[float | timedelta, int] | None = None,
    ) -> Callable[[Callable[Concatenate[P, A], R]], TaskHandle[P, Concatenate[P, A], R]]:
        """Register the decorated function as the handler of `type_`; it becomes a TaskHandle (the
        function still, with `.enqueue(conn, payload)` of this type: handles.py). `rate=(N,
        period)`: at most N starts of the type per period (seconds or timedelta) across all
        supervisors (see Rate). `global_concurrency=N`: at most N jobs of the type running at once
        across all supervisors; `key_concurrency=N`: at most N running per `concurrency_key` (see
        Limits). `concurrency=N`: at most N jobs of the type in flight in one child (the
        `concurrency` setting caps them all). `ephemeral=True`: a job of the type leaves no row when
        it succeeds (deleted by its completion; one in a bundle or with dependents is kept, as
        succeeded, for them); failures are kept as usual. `max_snoozes=N`: a job its handler snoozes
        (pgq.Snooze) more than N times fails. `aging=(every, max_priority)`: a pending job's
        priority rises by one per `every` it waits, up to max_priority (see Aging). ConfigError for
        an invalid option."""
        try:
            check_type_name(type_)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"handler {type_!r}: timeout must be > 0, got {timeout}")
        if max_retry_count < 0:
            raise ConfigError(f"handler {type_!r}: max_retry_count must be >= 0")
        parsed_rate = None if rate is None else Rate.parse(type_, rate)
        limits = Limits.parse(type_, global_concurrency, key_concurrency)
        parsed_aging = None if aging is None else Aging.parse(type_, aging)
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ConfigError(f"handler {type_!r}: concurrency must be an integer >= 1")
        if isinstance(max_snoozes, bool) or not isinstance(max_snoozes, int) or max_snoozes < 0:
            raise ConfigError(f"handler {type_!r}: max_snoozes must be an integer >= 0")

        def register(
            decorated: Callable[Concatenate[P, A], R],
        ) -> TaskHandle[P, Concatenate[P, A], R]:
            # a handle registered again (a second registry, a second type): its function
            func = decorated.func if isinstance(decorated, TaskHandle) else decorated
            if type_ in self.handlers:
                raise ConfigError(f"job type {type_!r} has two handlers")
            handler = _make_handler(type_, func, timeout, max_retry_count, retry or RetryPolicy())
            policy = dataclasses.replace(handler.policy, max_snoozes=max_snoozes)
            self.handlers[type_] = dataclasses.replace(
                handler,
                policy=policy,
                rate=parsed_rate,
                limits=limits,
                concurrency=concurrency,
                ephemeral=bool(ephemeral),
                aging=parsed_aging,
            )
            return TaskHandle(self, type_, func)

        return register

    def workflow(
        self,
        type_: str,
        *,
        timeout: float | None = None,
        max_retry_count: int = DEFAULT_MAX_RETRY_COUNT,
        retry: RetryPolicy | Backoff | None = None,
        concurrency: int | None = None,
        global_concurrency: int | None = None,
    ) -> Callable[[Callable[[C, P], R]], TaskHandle[P, [C, P], R]]:
        """Register the decorated `func(ctx, payload)` (sync or async) as the workflow of
        `type_` (docs/workflows.md); it becomes a TaskHandle, as a handler does. The options
        are `handler`'s; `timeout` bounds each run
        (a sleep or a wait ends one), `max_retry_count` and `retry` apply to each step."""
        register = self.handler(
            type_, timeout=timeout, max_retry_count=max_retry_count, retry=retry,
            concurrency=concurrency, global_concurrency=global_concurrency,
        )  # fmt: skip

        def decorate(decorated: Callable[[C, P], R]) -> TaskHandle[P, [C, P], R]:
            func = decorated.func if isinstance(decorated, TaskHandle) else decorated
            params = list(inspect.signature(func).parameters.values())
            if len(params) != 2:
                raise ConfigError(f"workflow {type_!r} must take (ctx, payload)")
            register(_stand_in)
            handler = self.handlers[type_]
            adapter = _adapter(type_, func, params[1].name)
            self.handlers[type_] = dataclasses.replace(
                handler, func=func, adapter=adapter, workflow=True, wants_conn=True
            )
            return TaskHandle(self, type_, func)

        return decorate

    def periodic(
        self,
        name: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        type: str | None = None,
        payload: JsonValue = None,
        timezone: str = "UTC",
        priority: int = 0,
        catch_up: int = 0,
    ) -> Callable[[F], F]:
        """Enqueue a `type` job on a schedule (see periodic.py): with `type=`, declared now;
        without, as a decorator stacked above `@registry.handler(...)`, of that handler's type.
        The handler must be registered first; the payload must fit its annotation."""

        def declare(type_: str) -> None:
            if name in self.schedules:
                raise ConfigError(f"periodic {name!r} is declared twice")
            handler = self.handlers.get(type_)
            if handler is None:
                raise ConfigError(
                    f"periodic {name!r}: no handler for job type {type_!r}"
                    " (register the handler first)"
                )
            schedule = Schedule.make(
                name, type=type_, cron=cron, every=every, timezone=timezone,
                payload=payload, priority=priority, catch_up=catch_up,
            )  # fmt: skip
            try:
                handler.validate(payload)
            except InvalidInput as exc:
                # like enqueue's, the default payload is JSON null: say so, a handler taking
                # a dict rejects it and the reader may not know where the null came from
                hint = " (no payload= given: the payload is null)" if payload is None else ""
                raise ConfigError(f"periodic {name!r}: {exc}{hint}") from None
            self.schedules[name] = schedule

        if type is not None:
            declare(type)

        def decorate(func: F) -> F:
            if type is None:
                if isinstance(func, TaskHandle) and func.type in self.handlers:
                    declare(func.type)
                    return func
                found = [h.type for h in self.handlers.values() if h.func is func]
                if not found:
                    raise ConfigError(
                        f"periodic {name!r}: {getattr(func, '__name__', func)!r} is not a"
                        " registered handler (stack @periodic above @handler, or pass type=)"
                    )
                declare(found[0])
            return func

        return decorate

    def schedules_for(self, types: Sequence[str]) -> list[Schedule]:
        """The schedules of the given job types (a supervisor runs those it serves)."""
        served = set(types)
        return [s for _, s in sorted(self.schedules.items()) if s.type in served]

    @property
    def types(self) -> list[str]:
        return sorted(self.handlers)

    def get(self, type_: str) -> Handler:
        """`type_`'s handler; InvalidInput naming it (and a registered type close to it)."""
        try:
            return self.handlers[type_]
        except KeyError:
            like = get_close_matches(str(type_), self.types, n=1)
            hint = f" (did you mean {like[0]!r}?)" if like else ""
            raise InvalidInput(f"no handler for job type {type_!r}{hint}") from None

    def policy(self, type_: str) -> Policy:
        """The policy of `type_`'s handler; UNHANDLED when there is none."""
        handler = self.handlers.get(type_)
        return UNHANDLED if handler is None else handler.policy

    def ephemeral_types(self) -> frozenset[str]:
        """The types whose jobs are deleted at success (`ephemeral=True`)."""
        return frozenset(t for t, h in self.handlers.items() if h.ephemeral)

    def rates(self, types: Sequence[str]) -> dict[str, Rate]:
        """The rates of those of `types` that have one."""
        found = {t: self.handlers[t].rate for t in types if t in self.handlers}
        return {t: r for t, r in found.items() if r is not None}

    def agings(self, types: Sequence[str]) -> dict[str, Aging]:
        """The priority aging of those of `types` that have one."""
        return {t: a for t in types if t in self.handlers and (a := self.handlers[t].aging)}

    def limits(self, types: Sequence[str]) -> dict[str, Limits]:
        """The concurrency limits of those of `types` that have some."""
        found = {t: self.handlers[t].limits for t in types if t in self.handlers}
        return {t: lim for t, lim in found.items() if lim is not None}

    def claim_policy(self, types: Sequence[str]) -> ClaimPolicy:
        """What a claim of `types` passes; InvalidInput if one has no handler."""
        return ClaimPolicy(
            types=tuple(types),
            max_retry_counts=tuple(self.get(t).max_retry_count for t in types),
        )


def _stand_in(payload: object) -> None:
    """Registered for a workflow while its own function (ctx, payload) replaces it."""


def _adapter(
    type_: str, func: Callable[..., object], name: str
) -> pydantic.TypeAdapter[object] | None:
    """The payload's validator, from the annotation of `func`'s parameter `name`."""
    try:
        hints = inspect.get_annotations(func, eval_str=True)
    except Exception as exc:
        raise ConfigError(f"handler {type_!r}: cannot resolve annotations: {exc}") from exc
    annotation = hints.get(name, inspect.Parameter.empty)
    if annotation is inspect.Parameter.empty or annotation is object:
        return None
    return pydantic.TypeAdapter(annotation)


def _make_handler(
    type_: str,
    func: Callable[..., object],
    timeout: float | None,
    max_retry_count: int,
    backoff: Backoff,
) -> Handler:
    sig = inspect.signature(func)
    params = list(sig.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigError(f"handler {type_!r} must take the payload as its first parameter")
    names = {p.name for p in params[1:]}
    unknown = names - {"job", "conn"}
    if unknown:
        raise ConfigError(
            f"handler {type_!r}: unknown parameters {sorted(unknown)} (allowed: job, conn)"
        )
    return Handler(
        type=type_,
        func=func,
        adapter=_adapter(type_, func, params[0].name),
        wants_job="job" in names,
        wants_conn="conn" in names,
        policy=Policy(timeout=timeout, max_retry_count=max_retry_count, backoff=backoff),
    )


def _where(exc: BaseException) -> str:
    """The error and where it was raised, on one line: the last frame of the app's own code
    (importlib's frames left out), or the file and line a SyntaxError names."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SyntaxError):
        # its str() names the file's base name only: the message, then the full path
        text = f"{type(exc).__name__}: {exc.msg}"
        return f"{text} ({exc.filename}:{exc.lineno})" if exc.filename else text
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<") and f.filename not in _NOT_THE_APP
    ]  # fmt: skip
    return f"{text} ({frames[-1].filename}:{frames[-1].lineno})" if frames else text


_NOT_THE_APP = {__file__, importlib.__file__}


def _did_you_mean(obj: object, name: str) -> str:
    """` (did you mean 'registry'?)` for a mistyped attribute of `obj`: a Registry first."""
    names = [n for n in dir(obj) if not n.startswith("_")]
    registries = [n for n in names if isinstance(getattr(obj, n, None), Registry)]
    close = get_close_matches(name, registries, n=1) or get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_registry(target: str) -> Registry:
    """Import `pkg.module:attribute` and return the Registry it names. AppLoadError if not."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        # a malformed setting, like any other bad flag (exit 2), not an app that failed
        raise ConfigError(
            f"invalid setting app: must look like 'package.module:registry', got {target!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ConfigError:
        raise  # the app declared something invalid: its own message says what
    except Exception as exc:
        raise AppLoadError(f"cannot import app module {module_name!r}: {_where(exc)}") from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            why = f"app module {module_name!r} has no attribute {attr!r}"
            raise AppLoadError(why + _did_you_mean(obj, part)) from None
    if not isinstance(obj, Registry):
        raise AppLoadError(f"{target!r} is a {type(obj).__name__}, not a pgq_supervisor.Registry")
    if not obj.handlers:
        raise AppLoadError(f"{target!r} has no handlers registered")
    return obj
