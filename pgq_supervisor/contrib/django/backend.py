"""The Tasks backend: a task is a pgq job, enqueued on Django's own connection.

A task's job is of type `django:<queue_name>` (one job type per queue: `manage.py pgq_worker
--types django:emails` serves a subset), its payload names the task and its arguments. Its
result is the job: `get_result(id)` reads the job's row, so status, return value and errors
are the queue's own.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import cast
from uuid import UUID

import psycopg
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils import timezone
from django.utils.module_loading import import_string

from pgq_supervisor import db, errors
from pgq_supervisor import schema as migrations
from pgq_supervisor.contrib.django.compat import (
    BaseTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from pgq_supervisor.errors import JobNotFound
from pgq_supervisor.jobs import JobId, JobRecord, JobState, JsonValue, NewJob

BACKEND_PATH = "pgq_supervisor.contrib.django.TaskBackend"
TYPE_PREFIX = "django:"
# what `manage.py pgq_worker` runs, and where it tells the worker module of the user's --app
WORKER_APP = "pgq_supervisor.contrib.django.worker:registry"
USER_APP_ENV = "_PGQ_DJANGO_APP"  # no PGQ_ prefix: not a setting

# Django has no "cancelled": a cancelled task failed (its errors say why, if it was running)
STATUS = {
    JobState.PENDING: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}


def job_type(queue_name: str) -> str:
    return f"{TYPE_PREFIX}{queue_name}"


def psycopg_connection(using: str = "default") -> db.Conn:
    """The psycopg Connection under Django's connection `using` (opened if need be): its
    transaction is Django's, so what is written on it commits or rolls back with `atomic()`."""
    wrapper = connections[using]
    wrapper.ensure_connection()
    raw: object = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise ImproperlyConfigured(
            f"pgq_supervisor needs Django's postgresql backend on psycopg 3; database {using!r}"
            f" has a {type(raw).__name__} connection"
        )
    return cast(db.Conn, raw)


def backend_options() -> list[tuple[str, Mapping[str, object]]]:
    """(alias, params) of each TASKS backend that is ours, "default" first."""
    tasks: Mapping[str, Mapping[str, object]] = getattr(settings, "TASKS", {})
    ours = [(a, p) for a, p in tasks.items() if p.get("BACKEND") == BACKEND_PATH]
    return sorted(ours, key=lambda ap: ap[0] != "default")


def _options(params: Mapping[str, object]) -> Mapping[str, object]:
    options = params.get("OPTIONS", {})
    return cast(Mapping[str, object], options) if isinstance(options, Mapping) else {}


def options_database(params: Mapping[str, object]) -> str:
    return str(_options(params).get("DATABASE", "default"))


def options_schema(params: Mapping[str, object]) -> str:
    schema = _options(params).get("SCHEMA")
    return str(schema) if schema else db.default_schema()


def migrate_queue(alias: str) -> list[int]:
    """Bring the queue's schemas in Django's database `alias` up to date: those of the
    backends that keep their queue there (without one of ours configured, the default schema
    in the default database). Returns the versions applied."""
    ours = [p for _, p in backend_options()] or ([{}] if alias == "default" else [])
    names = sorted({options_schema(p) for p in ours if options_database(p) == alias})
    if not names:
        return []
    conn = psycopg_connection(alias)
    done: list[int] = []
    for name in names:
        done += migrations.migrate(conn, name)
    return done


class TaskBackend(BaseTaskBackend):
    """OPTIONS: DATABASE (the Django database alias the queue lives in, "default"), SCHEMA
    (the queue's schema, $PGQ_SCHEMA or "pgq"), MAX_RETRIES (attempts after the first for a
    task that raises, 0: Django's tasks fail on their first error)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, object]) -> None:
        super().__init__(alias, params)
        self.database = options_database(params)
        self.schema = options_schema(params)

    # The base types args as P.args outside a *args (its own ignores say so): not expressible
    def enqueue(  # type: ignore[override]
        self, task: Task[..., object], args: Sequence[object], kwargs: Mapping[str, object]
    ) -> TaskResult[object]:
        self.validate_task(task)
        payload: JsonValue = {
            "task": task.module_path,
            "args": normalize_json(list(args)),
            "kwargs": normalize_json(dict(kwargs)),
        }
        job = NewJob(
            type=job_type(task.queue_name),
            payload=payload,
            priority=task.priority,  # both: larger runs sooner
            start_at=task.run_after,
            origin="django",
        )
        job_id = db.enqueue(psycopg_connection(self.database), self.schema, job)
        result: TaskResult[object] = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[object]:
        try:
            job_id = JobId(UUID(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        try:
            record = db.get_job(psycopg_connection(self.database), self.schema, job_id)
        except JobNotFound:
            raise TaskResultDoesNotExist(result_id) from None
        if not record.type.startswith(TYPE_PREFIX):
            raise TaskResultDoesNotExist(result_id)
        return task_result(record, self.alias)


def _payload(record: JobRecord) -> tuple[str, list[JsonValue], dict[str, JsonValue]]:
    p = record.payload if isinstance(record.payload, dict) else {}
    args, kwargs = p.get("args"), p.get("kwargs")
    return (
        str(p.get("task")),
        args if isinstance(args, list) else [],
        kwargs if isinstance(kwargs, dict) else {},
    )


def _class_path(name: str) -> str | None:
    """The importable path of an exception class as a traceback's last line names it
    ("module.Class"; builtins, and our errors in an attempt's message, by name alone)."""
    if "." in name:
        return name
    if isinstance(getattr(builtins, name, None), type):
        return f"builtins.{name}"
    if isinstance(getattr(errors, name, None), type):
        return f"pgq_supervisor.errors.{name}"
    return None


def task_error(attempt: JsonValue) -> TaskError | None:
    """A failed attempt as Django's TaskError: the exception's class path from the traceback
    (an attempt that raised) or the message ("PermanentError: ..."); an attempt the task never
    ended itself (a timeout, a worker's death, a cancel) says its kind and message."""
    if not isinstance(attempt, dict):
        return None
    trace, message = attempt.get("traceback"), str(attempt.get("error") or "")
    text = str(trace) if trace else message
    last = text.rstrip().splitlines()[-1] if text.strip() else ""
    path = _class_path(last.split(":", 1)[0].strip()) if ":" in last else None
    if path is None:
        kind = str(attempt.get("kind") or "error")
        path = "builtins.TimeoutError" if kind == "timeout" else "pgq_supervisor.errors.PgqError"
        text = f"{kind}: {message}"
    return TaskError(exception_class_path=path, traceback=text)


def task_result(record: JobRecord, alias: str) -> TaskResult[object]:
    """The TaskResult of the task whose job `record` is."""
    path, args, kwargs = _payload(record)
    task = cast("Task[..., object]", import_string(path))  # Django 6: not generic
    workers = [a.get("worker") for a in record.attempts if isinstance(a, dict)]
    if record.state in (JobState.RUNNING, JobState.SUCCEEDED):
        workers.append(record.worker_id)  # the attempt under way, or the one that succeeded
    failures = [e for e in map(task_error, record.attempts) if e is not None]
    result: TaskResult[object] = TaskResult(
        task=task,
        id=str(record.id),
        status=STATUS[record.state],
        enqueued_at=record.created_at,
        started_at=record.started_at,
        finished_at=record.stopped_at if record.state.is_terminal else None,
        last_attempted_at=record.started_at,
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=failures,
        worker_ids=[str(w) for w in workers if w is not None],
    )
    object.__setattr__(result, "_return_value", record.result)
    return result
