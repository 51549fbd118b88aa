"""The only package that executes SQL. Statements come from sql/queries.sql by name.

Functions here never commit: the caller owns the transaction (or uses an autocommit
connection). psycopg errors are wrapped once, here, into `DatabaseError`. By concern:
`connection` (connecting, error mapping), `enqueueing`, `lifecycle` (the worker's side and the
rescue), `admin`, `control` (pauses and rates), `watching` (waiters and progress), `schedules`
(periodic jobs), `supervisors` (registered supervisors), `dashboard` (the web dashboard's
reads); `params` and `rows` type what goes in and what comes out.
"""

from pgq_supervisor.db.admin import (
    cancel,
    cancelled_among,
    db_now,
    delete_finished,
    depth,
    get_bundle,
    get_job,
    list_jobs,
    queue_stats,
    reset,
    retry_failed,
    summary_by_origin,
)
from pgq_supervisor.db.connection import (
    DEFAULT_SCHEMA,
    AsyncConn,
    Conn,
    connect,
    connect_at_startup,
    default_schema,
    describe_connect_error,
    durable_commit,
    is_permanent_connect_error,
    listen,
    listen_async,
    redact,
    unlisten,
    unlisten_async,
    wrapped,
)
from pgq_supervisor.db.control import (
    pause,
    rate_next_due,
    resume,
    sync_rates,
    type_controls,
)
from pgq_supervisor.db.dashboard import (
    bundles_page,
    delete_job,
    job_dependencies,
    job_dependents,
    jobs_page,
    throughput,
)
from pgq_supervisor.db.enqueueing import (
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_params,
    enqueue_params,
    insert_bundle,
)
from pgq_supervisor.db.lifecycle import (
    claim,
    end_attempt,
    heartbeat,
    lock_bundles,
    next_due,
    release,
    rescue,
    succeed,
    succeed_and_claim,
)
from pgq_supervisor.db.params import ClaimArgs, dump_json
from pgq_supervisor.db.rows import CancelResult, TypeControl
from pgq_supervisor.db.schedules import (
    declare_schedules,
    enqueue_tick,
    list_schedules,
    schedule_states,
)
from pgq_supervisor.db.supervisors import (
    list_supervisors,
    register_supervisor,
    unregister_supervisor,
)
from pgq_supervisor.db.watching import (
    get_jobs,
    get_jobs_async,
    job_states,
    job_states_async,
    set_progress,
)

__all__ = [
    "DEFAULT_SCHEMA",
    "AsyncConn",
    "CancelResult",
    "ClaimArgs",
    "Conn",
    "TypeControl",
    "bundles_page",
    "cancel",
    "cancelled_among",
    "claim",
    "connect",
    "connect_at_startup",
    "db_now",
    "declare_schedules",
    "default_schema",
    "delete_finished",
    "delete_job",
    "depth",
    "describe_connect_error",
    "dump_json",
    "durable_commit",
    "end_attempt",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_params",
    "enqueue_params",
    "enqueue_tick",
    "get_bundle",
    "get_job",
    "get_jobs",
    "get_jobs_async",
    "heartbeat",
    "insert_bundle",
    "is_permanent_connect_error",
    "job_dependencies",
    "job_dependents",
    "job_states",
    "job_states_async",
    "jobs_page",
    "list_jobs",
    "list_schedules",
    "list_supervisors",
    "listen",
    "listen_async",
    "lock_bundles",
    "next_due",
    "pause",
    "queue_stats",
    "rate_next_due",
    "redact",
    "register_supervisor",
    "release",
    "rescue",
    "reset",
    "resume",
    "retry_failed",
    "schedule_states",
    "set_progress",
    "succeed",
    "succeed_and_claim",
    "summary_by_origin",
    "sync_rates",
    "throughput",
    "type_controls",
    "unlisten",
    "unlisten_async",
    "unregister_supervisor",
    "wrapped",
]
