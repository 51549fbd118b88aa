"""Django: an app whose migration creates the queue's schema, a Tasks backend
(`pgq_supervisor.contrib.django.TaskBackend`) and `manage.py pgq_worker`.

    INSTALLED_APPS += ["pgq_supervisor.contrib.django"]
    TASKS = {"default": {"BACKEND": "pgq_supervisor.contrib.django.TaskBackend"}}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgq_supervisor.contrib.django.backend import TaskBackend


def __getattr__(name: str) -> object:
    # lazily: Django imports this package while it populates the app registry, before the
    # backend's imports (django.tasks, the database) may be touched
    if name == "TaskBackend":
        from pgq_supervisor.contrib.django.backend import TaskBackend

        return TaskBackend
    raise AttributeError(name)


__all__ = ["TaskBackend"]
