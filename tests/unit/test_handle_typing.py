"""mypy --strict infers a task handle's payload type from the handler's annotation (issue 36):
a sample that misuses handles fails with the errors expected, a correct one passes. One mypy
run over both files, with a cache of its own (warm after the first run)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[2]

APP = """
import pydantic
from typing_extensions import TypedDict

import pgq_supervisor as pgq

registry = pgq.Registry()


class Greeting(pydantic.BaseModel):
    name: str


class Point(TypedDict):
    x: int
    y: int


@registry.handler("greet")
def greet(payload: Greeting, job: pgq.Job) -> str:
    return payload.name


@registry.handler("plot")
async def plot(payload: Point) -> None:
    return None


@registry.workflow("flow")
def flow(ctx: pgq.WorkflowContext, payload: list[int]) -> int:
    return sum(payload)
"""

GOOD = """
from typing import assert_type

import psycopg

import pgq_supervisor as pgq
from sample_app import Greeting, flow, greet, plot


def produce(conn: psycopg.Connection[tuple[object, ...]]) -> list[pgq.JobId]:
    one: pgq.JobId = greet.enqueue(conn, Greeting(name="Ada"), priority=2)
    many = plot.enqueue_many(conn, [{"x": 1, "y": 2}], tenant="t")
    job = greet.new_job(Greeting(name="Bo"))
    assert_type(greet.type, str)
    return [one, *many, flow.enqueue(conn, [1, 2]), *pgq.enqueue_many(conn, [job])]


async def produce_async(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> pgq.JobId:
    return await plot.enqueue_async(conn, {"x": 1, "y": 2})
"""

BAD = """
import psycopg

from sample_app import Greeting, flow, greet, plot


def produce(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    greet.enqueue(conn, {"name": "Ada"})  # error: a dict is no Greeting
    plot.enqueue(conn, {"x": 1})  # error: y is missing
    flow.enqueue_many(conn, [["1"]])  # error: a list of str is no list[int]
    greet.enqueue(conn, Greeting(name="Ada"), priorty=2)  # error: no such option
    greet(Greeting(name="Ada"), jobb=None)  # error: the function's own signature
"""


def test_mypy_strict_infers_the_payload_type_of_a_handle(tmp_path: Path) -> None:
    for name, text in [("sample_app", APP), ("sample_good", GOOD), ("sample_bad", BAD)]:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text).lstrip())
    out, err, status = api.run(
        [
            "--strict",
            "--python-version=3.11",
            "--no-error-summary",
            "--show-error-codes",
            "--cache-dir", str(ROOT / ".mypy_cache" / "handle_typing"),
            "--config-file", "",
            str(tmp_path / "sample_app.py"),
            str(tmp_path / "sample_good.py"),
            str(tmp_path / "sample_bad.py"),
        ]
    )  # fmt: skip
    assert err == "" and status == 1, out + err
    errors = [ln for ln in out.splitlines() if ": error:" in ln]
    assert not [e for e in errors if "sample_bad.py" not in e], out  # app and good are clean
    # each line marked "# error:" fails, and no other
    bad = textwrap.dedent(BAD).lstrip().splitlines()
    expected = [n for n, line in enumerate(bad, 1) if "# error:" in line]
    by_line = {int(m.group(1)): e for e in errors if (m := re.search(r"\.py:(\d+):", e))}
    assert sorted(by_line) == expected, out
    dict_for_model, missing_key, wrong_items, bad_option, bad_call = (by_line[n] for n in expected)
    assert 'expected "Greeting"' in dict_for_model and "[arg-type]" in dict_for_model, out
    assert 'Missing key "y"' in missing_key, out
    assert 'expected "int"' in wrong_items, out
    assert '"priorty"' in bad_option and '"jobb"' in bad_call, out
