"""The app `manage.py pgq_worker` runs (`pgq_supervisor.contrib.django.worker:registry`).

Importing it sets Django up (DJANGO_SETTINGS_MODULE from the environment, as manage.py left
it) and imports every installed app's `tasks` module: the fork server imports it once, so the
children begin with Django ready and the tasks' modules in shared pages. One handler per queue
of each of our TASKS backends (job type `django:<queue>`) runs the task its payload names;
the user's own `--app` (passed in _PGQ_DJANGO_APP) adds its handlers beside them.
"""

from __future__ import annotations

import os
from typing import cast

import django
from django.db import close_old_connections, connections
from django.utils.module_loading import autodiscover_modules, import_string
from typing_extensions import TypedDict  # pydantic needs it before Python 3.12

from pgq_supervisor import db
from pgq_supervisor.errors import ConfigError, PermanentError
from pgq_supervisor.jobs import Job, JsonValue
from pgq_supervisor.registry import Registry, load_registry

django.setup()

from pgq_supervisor.contrib.django.backend import (  # noqa: E402  (needs Django set up)
    USER_APP_ENV,
    TaskBackend,
    backend_options,
    job_type,
    psycopg_connection,
    task_result,
)
from pgq_supervisor.contrib.django.compat import (  # noqa: E402
    Task,
    TaskContext,
    normalize_json,
)


class TaskPayload(TypedDict):
    task: str
    args: list[object]  # JSON (object: pydantic cannot resolve the recursive JsonValue)
    kwargs: dict[str, object]


def run_task(payload: TaskPayload, job: Job) -> JsonValue:
    """Run the task the payload names; its return value (as JSON) is the job's result.
    Stale Django connections are closed before and after, as a request does (CONN_MAX_AGE,
    a server that went away): each job starts on a usable one. The task writes through
    Django's own connection, so it takes no `conn` of the worker: a transaction held open on
    the job connection for the whole task would buy nothing (its writes are elsewhere) and
    would sit idle in transaction meanwhile (idle_in_transaction_session_timeout, a pooler)."""
    close_old_connections()
    try:
        try:
            task = import_string(payload["task"])
        except ImportError as exc:
            raise PermanentError(f"cannot import task {payload['task']!r}: {exc}") from exc
        if not isinstance(task, Task):
            raise PermanentError(f"{payload['task']!r} is not a task")
        args, kwargs = payload["args"], payload["kwargs"]
        if task.takes_context:
            # the TaskResult as get_result() would read it now: attempts from the job's row
            backend = task.get_backend()
            if isinstance(backend, TaskBackend):
                record = db.get_job(psycopg_connection(backend.database), backend.schema, job.id)
            else:
                record = db.get_job(psycopg_connection(), db.default_schema(), job.id)
            context = TaskContext(task_result=task_result(record, task.backend))
            value = task.call(context, *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        return cast(JsonValue, normalize_json(value))
    finally:
        close_old_connections()


def _registry() -> Registry:
    found = backend_options()
    if not found:
        raise ConfigError(
            "no TASKS backend is pgq_supervisor.contrib.django.TaskBackend: nothing to run"
        )
    registry = Registry()
    for _alias, params in found:
        options = params.get("OPTIONS")
        retries = options.get("MAX_RETRIES", 0) if isinstance(options, dict) else 0
        queues = params.get("QUEUES") or ["default"]
        for queue in cast(list[str], queues):
            if job_type(queue) not in registry.handlers:
                registry.handler(job_type(queue), max_retry_count=int(retries))(run_task)
    if user_app := os.environ.get(USER_APP_ENV):
        user = load_registry(user_app)
        for type_, handler in user.handlers.items():
            if type_ in registry.handlers:
                raise ConfigError(f"job type {type_!r} has two handlers (the app's and Django's)")
            registry.handlers[type_] = handler
        registry.schedules.update(user.schedules)
    return registry


autodiscover_modules("tasks")
registry = _registry()
# The fork server imports this: a connection an app opened while importing would be shared by
# every child forked after (one socket, many processes). Each child opens its own instead.
connections.close_all()
