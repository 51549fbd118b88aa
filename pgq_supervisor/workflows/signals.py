"""pgq.signal: send a workflow the signal its `ctx.wait_for(name)` waits for."""

from __future__ import annotations

from pgq_supervisor import db
from pgq_supervisor.db import workflows as wdb
from pgq_supervisor.errors import JobNotFound
from pgq_supervisor.frameworks import AsyncConnLike, ConnLike, as_psycopg, as_psycopg_async
from pgq_supervisor.ids import job_id as parse_job_id
from pgq_supervisor.inputs import check_key
from pgq_supervisor.jobs import IdLike, JsonValue
from pgq_supervisor.jsontext import dump_payload


def _checked(name: str, payload: JsonValue) -> str:
    """The payload's JSON text, once the name is one the statement takes (InvalidInput naming
    it, before anything is sent: the caller's transaction stays usable)."""
    check_key(name, "signal name")
    return dump_payload(payload, "signal payload")


def signal(
    conn: ConnLike,
    job_id: IdLike,
    name: str,
    payload: JsonValue = None,
    *,
    schema: str | None = None,
) -> bool:
    """Send the signal `name` with `payload` (JSON) to the workflow job `job_id`, in the
    caller's transaction (one statement: atomic in any connection state). Kept with the job:
    a `ctx.wait_for(name)` reached later returns it at once; one waiting now is made due and
    its workers notified when this commits. The first signal of a name wins: False if it was
    sent before (nothing changes). JobNotFound for an unknown job, InvalidInput for a bad id,
    name or a payload that is not JSON."""
    text = _checked(name, payload)
    job = parse_job_id(job_id)
    sent = wdb.signal(as_psycopg(conn), schema or db.default_schema(), job, name, text)
    if sent is None:
        raise JobNotFound(f"no job {job}")
    return sent


async def signal_async(
    conn: AsyncConnLike,
    job_id: IdLike,
    name: str,
    payload: JsonValue = None,
    *,
    schema: str | None = None,
) -> bool:
    """`signal` on an async connection."""
    text = _checked(name, payload)
    job = parse_job_id(job_id)
    aconn = await as_psycopg_async(conn)
    sent = await wdb.signal_async(aconn, schema or db.default_schema(), job, name, text)
    if sent is None:
        raise JobNotFound(f"no job {job}")
    return sent
