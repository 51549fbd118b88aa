from __future__ import annotations

from django.apps import AppConfig


class PgqConfig(AppConfig):
    name = "pgq_supervisor.contrib.django"
    label = "pgq_supervisor"
    verbose_name = "pgq_supervisor job queue"
