"""Typed task handles (issue 36): `@registry.handler(...)` gives back a handle that enqueues its
own type with a payload checked against the handler's annotation before the insert."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import psycopg
import pydantic
import pytest
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

import pgq_supervisor as pgq
from pgq_supervisor.db import Conn
from pgq_supervisor.testing import drain
from tests.support.db import count_rows, get


class Greeting(pydantic.BaseModel):
    name: str = pydantic.Field(alias="who")
    times: int = pydantic.Field(default=1, gt=0)


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Resize:
    path: str
    width: int


registry = pgq.Registry()
seen: list[object] = []


@registry.handler("greet", max_retry_count=0)
def greet(payload: Greeting, job: pgq.Job) -> str:
    seen.append(payload)
    return f"hello {payload.name} x{payload.times}"


@registry.handler("plot")
def plot(payload: Point) -> None:
    seen.append(payload)


@registry.handler("resize")
async def resize(payload: Resize) -> None:
    seen.append(payload)


@registry.handler("anything")
def anything(payload: object) -> None:  # no annotation to check: any JSON value
    seen.append(payload)


@registry.workflow("flow")
def flow(ctx: pgq.WorkflowContext, payload: Point) -> int:
    return payload["x"] + payload["y"]


def test_a_handle_is_still_the_function() -> None:
    seen.clear()
    assert plot({"x": 1, "y": 2}) is None and seen == [{"x": 1, "y": 2}]
    assert greet.type == "greet" and greet.__name__ == "greet" and flow.type == "flow"
    assert registry.get("greet").func is greet.func
    assert asyncio.run(resize(Resize("a.png", 3))) is None


def test_enqueue_stores_the_payload_as_the_worker_reads_it(conn: Conn) -> None:
    seen.clear()
    with conn.transaction():
        g = greet.enqueue(conn, Greeting(who="Ada", times=2), priority=3, origin="t")
        p = plot.enqueue(conn, {"x": 1, "y": 2})
        r = resize.enqueue(conn, Resize("a.png", 640))
        a = anything.enqueue(conn, [1, "two"])
    rec = get(conn, g)
    assert (rec.type, rec.priority, rec.origin) == ("greet", 3, "t")
    assert rec.payload == {"who": "Ada", "times": 2}  # by alias, as the worker reads it
    assert get(conn, p).payload == {"x": 1, "y": 2}
    assert get(conn, r).payload == {"path": "a.png", "width": 640}
    assert get(conn, a).payload == [1, "two"]
    conn.autocommit = True
    result = drain(conn, registry)
    assert result.failed == 0 and result.succeeded == 4
    assert Greeting(who="Ada", times=2) in seen and Resize("a.png", 640) in seen


def test_a_payload_that_does_not_fit_is_refused_before_the_insert(conn: Conn) -> None:
    # typed Any: mypy refuses these payloads already (tests/unit/test_handle_typing.py)
    name_not_who: Any = {"name": "Ada"}
    no_y: Any = {"x": 1}
    not_an_int: Any = "wide"
    wide = Resize("a.png", not_an_int)
    with pytest.raises(pgq.InvalidInput, match=r"^payload for 'greet' is invalid: who: Field"):
        greet.enqueue(conn, name_not_who)
    with pytest.raises(pgq.InvalidInput, match=r"^payload for 'plot' is invalid: y: "):
        plot.enqueue(conn, no_y)
    with pytest.raises(pgq.InvalidInput, match=r"^payload for 'resize' is invalid: width: "):
        resize.enqueue(conn, wide)
    with pytest.raises(pgq.InvalidInput, match=r"^payload for 'flow' is invalid"):
        flow.enqueue(conn, no_y)
    with pytest.raises(pgq.InvalidInput, match=r"^payloads\[1\] for 'plot' is invalid: y: "):
        plot.enqueue_many(conn, [{"x": 1, "y": 2}, no_y])
    assert count_rows(conn) == 0  # nothing half-written: the good first payload neither


def test_enqueue_many_and_async_carry_the_type_and_options(conn: Conn, dsn: str) -> None:
    with conn.transaction():
        ids = plot.enqueue_many(conn, [{"x": 1, "y": 1}, {"x": 2, "y": 2}], priority=7)
        bundle = pgq.enqueue_bundle(conn, "b", [greet.new_job(Greeting(who="B"))])
    assert [get(conn, i).payload for i in ids] == [{"x": 1, "y": 1}, {"x": 2, "y": 2}]
    assert {get(conn, i).priority for i in ids} == {7}
    assert bundle.num_jobs == 1

    async def enqueue_async() -> pgq.JobId:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await greet.enqueue_async(aconn, Greeting(who="Bo"), unique_key="k")

    job_id = asyncio.run(enqueue_async())
    rec = get(conn, job_id)
    assert (rec.type, rec.payload) == ("greet", {"who": "Bo", "times": 1})
    with pytest.raises(pgq.InvalidInput, match="payload for 'greet' is invalid: times: "):
        asyncio.run(enqueue_async_bad(dsn))


async def enqueue_async_bad(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        await greet.enqueue_async(aconn, Greeting.model_construct(name="x", times=0))


def test_a_handle_registered_again_and_stacked_under_periodic() -> None:
    other = pgq.Registry()
    again = other.handler("greet2")(greet)
    assert other.get("greet2").func is greet.func and again.type == "greet2"
    ticks = pgq.Registry()

    @ticks.periodic("every-minute", cron="* * * * *", payload={"x": 0, "y": 0})
    @ticks.handler("tick")
    def tick(payload: Point) -> None:
        return None

    assert ticks.schedules["every-minute"].type == "tick" and tick.type == "tick"
