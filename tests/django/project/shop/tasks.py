"""The tasks the tests run through `manage.py pgq_worker`."""

from __future__ import annotations

from django.db import connection

# django.tasks on Django 6, the django-tasks backport's django_tasks on 5.2
from pgq_supervisor.contrib.django.compat import TaskContext, task
from shop.models import Order


class Boom(Exception):
    pass


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def ship(order_id: int) -> str:
    # reads the row the enqueuing transaction wrote: the job runs only once that committed
    name: str = Order.objects.get(id=order_id).name
    return name


@task()
def explode(why: str) -> None:
    raise Boom(why)


@task(takes_context=True)
def attempt(context: TaskContext) -> int:
    return context.attempt


@task(queue_name="emails", priority=10)
async def send(to: str) -> dict[str, str]:
    return {"sent": to}


@task()
def backend_pid() -> int:
    """The server process of this task's Django connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    assert row is not None
    pid: int = row[0]
    return pid
