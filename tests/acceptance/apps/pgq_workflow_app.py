"""Workflows for the process tests (tests/acceptance/test_workflows.py). Each `conn` step
writes one row to `wf_effects` (created by the test) in its checkpoint's transaction and takes
a moment, so a SIGKILL lands inside steps as well as between them."""

from __future__ import annotations

import time

import psycopg

import pgq_supervisor as pgq

registry = pgq.Registry()

STEPS = 5


def _effect(job_id: str, step: int, seconds: float, conn: psycopg.Connection) -> int:
    conn.execute("INSERT INTO wf_effects (job_id, step) VALUES (%s, %s)", (job_id, step))
    time.sleep(seconds)  # the step's simulated work, inside its transaction
    return step * step


# each kill costs the step in hand a try: plenty of them, retried soon
@registry.workflow("five", max_retry_count=50, retry=pgq.RetryPolicy(base=0.05, cap=0.2))
def five(ctx: pgq.WorkflowContext, payload: dict[str, float]) -> int:
    total = 0
    for step in range(STEPS):
        value = ctx.step(f"effect-{step}", _effect, str(ctx.job_id), step, payload["work"])
        assert isinstance(value, int)
        total += value
        if step == 2:
            ctx.sleep("pause", payload.get("pause", 0.05))
    return total


async def _effect_async(job_id: str, step: int, conn: psycopg.AsyncConnection) -> int:
    await conn.execute("INSERT INTO wf_effects (job_id, step) VALUES (%s, %s)", (job_id, step))
    return step * step


@registry.workflow("five_async", max_retry_count=50)
async def five_async(ctx: pgq.AsyncWorkflowContext, payload: object) -> int:
    total = 0
    for step in range(STEPS):
        value = await ctx.step(f"effect-{step}", _effect_async, str(ctx.job_id), step)
        assert isinstance(value, int)
        total += value
        if step == 2:
            await ctx.sleep("pause", 0.05)
    return total


@registry.workflow("nap")
def nap(ctx: pgq.WorkflowContext, payload: dict[str, float]) -> dict[str, object]:
    before = ctx.step("before", time.time)
    ctx.sleep("nap", payload["seconds"])
    after = ctx.step("after", time.time)
    return {"before": before, "after": after}


@registry.workflow("approve")
def approve(ctx: pgq.WorkflowContext, payload: dict[str, float]) -> object:
    try:
        return {"signal": ctx.wait_for("approved", timeout=payload.get("timeout"))}
    except pgq.WaitTimeout:
        return {"timed_out_at": ctx.step("timed out", time.time)}


@registry.workflow("approve_async")
async def approve_async(ctx: pgq.AsyncWorkflowContext, payload: object) -> object:
    return {"signal": await ctx.wait_for("approved")}


@registry.handler("double")
def double(payload: dict[str, int]) -> int:
    return payload["n"] * 2


@registry.workflow("parent")
def parent(ctx: pgq.WorkflowContext, payload: dict[str, int]) -> object:
    kids = [ctx.enqueue(f"spawn-{i}", "double", {"n": i}) for i in range(payload["n"])]
    return sum(int(str(ctx.wait(kid))) for kid in kids)
