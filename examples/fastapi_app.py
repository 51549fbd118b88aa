"""FastAPI with pgq_supervisor: an order and its job in one transaction, and a wait for a result.

    export PGQ_DSN=postgresql://postgres@127.0.0.1/postgres
    python -m pgq_supervisor migrate --dsn "$PGQ_DSN"
    uvicorn examples.fastapi_app:app --port 8000 &
    python -m pgq_supervisor run --dsn "$PGQ_DSN" --app examples.fastapi_app:registry &
    curl -s -X POST localhost:8000/orders -H 'content-type: application/json' \\
        -d '{"quantity": 3, "unit_price": 7}'            # {"order_id": 1, "job_id": "..."}
    curl -s localhost:8000/jobs/<job_id>/result          # {"state": "succeeded", "result": 21}

The pool belongs to the app's lifespan; each request borrows one connection from it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import psycopg
from fastapi import Depends, FastAPI, HTTPException, Request
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

import pgq_supervisor as pgq

registry = pgq.Registry()


class Order(BaseModel):
    quantity: int
    unit_price: int


@registry.handler("orders.total")
def order_total(order: Order) -> int:
    return order.quantity * order.unit_price


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with AsyncConnectionPool(os.environ["PGQ_DSN"], min_size=1, open=False) as pool:
        async with pool.connection() as conn:  # the app's own table
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY,"
                " quantity int NOT NULL CHECK (quantity BETWEEN 1 AND 1000),"
                " unit_price int NOT NULL, total_job uuid NOT NULL)"
            )
        app.state.pool = pool
        yield


app = FastAPI(lifespan=lifespan)


async def connection(request: Request) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
    pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]] = request.app.state.pool
    async with pool.connection() as conn:
        yield conn


Conn = Annotated[psycopg.AsyncConnection[TupleRow], Depends(connection)]


@app.post("/orders")
async def create_order(order: Order, conn: Conn) -> dict[str, object]:
    """The order row and its job commit together, or neither does."""
    try:
        async with conn.transaction():
            job_id = await pgq.enqueue_async(conn, "orders.total", order.model_dump())
            cur = await conn.execute(
                "INSERT INTO orders (quantity, unit_price, total_job) VALUES (%s, %s, %s)"
                " RETURNING id",
                (order.quantity, order.unit_price, job_id),
            )
            row = await cur.fetchone()
    except psycopg.errors.CheckViolation:
        raise HTTPException(422, "quantity must be between 1 and 1000") from None
    assert row is not None
    return {"order_id": row[0], "job_id": str(job_id)}


@app.get("/jobs/{job_id}/result")
async def job_result(job_id: uuid.UUID, conn: Conn, timeout: float = 10.0) -> dict[str, object]:
    """Wait (LISTEN/NOTIFY, no polling) until the job has finished; 504 after `timeout` s."""
    try:
        record = await pgq.wait_async(conn, pgq.JobId(job_id), timeout)
    except TimeoutError:
        raise HTTPException(504, f"job {job_id} has not finished yet") from None
    except pgq.JobNotFound:
        raise HTTPException(404, f"no job {job_id}") from None
    return {"state": record.state.value, "result": record.result, "error": record.error_msg}
