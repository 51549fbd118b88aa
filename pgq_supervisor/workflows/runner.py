"""How the executor calls a workflow: its context made on the job's connection, then the
workflow's own function with it and the payload."""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable

import psycopg

from pgq_supervisor import db
from pgq_supervisor.db import workflows as wdb
from pgq_supervisor.jobs import Job
from pgq_supervisor.registry import Handler
from pgq_supervisor.workflows.async_context import AsyncWorkflowContext
from pgq_supervisor.workflows.context import WorkflowContext
from pgq_supervisor.workflows.replay import Replay


def workflow_call(
    handler: Handler, job: Job, conn: db.Conn | db.AsyncConn, schema: str, rng: random.Random
) -> Callable[[object], object]:
    """What the executor calls with the validated payload, in place of a handler: it reads the
    workflow's history (a database error there is the run's failure, as a handler's) and runs
    the workflow. An async workflow needs an async connection, a sync one a sync connection."""
    func = handler.func
    policy = handler.policy
    if isinstance(conn, psycopg.AsyncConnection):
        aconn = conn

        async def run_async(payload: object) -> object:
            steps, signals = await wdb.history_async(aconn, schema, job.id)
            ctx = AsyncWorkflowContext(job, aconn, schema, Replay(job, policy, steps, signals, rng))
            value = func(ctx, payload)
            if inspect.isawaitable(value):
                return await value
            return value

        return run_async
    sconn = conn

    def run(payload: object) -> object:
        steps, signals = wdb.history(sconn, schema, job.id)
        ctx = WorkflowContext(job, sconn, schema, Replay(job, policy, steps, signals, rng))
        return func(ctx, payload)

    return run
