from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class PgqConfig(AppConfig):
    name = "pgq_supervisor.contrib.django"
    label = "pgq_supervisor"
    verbose_name = "pgq_supervisor job queue"

    def ready(self) -> None:
        # the Django migration creates the schema once; a newer pgq_supervisor brings newer
        # schema migrations, which every `manage.py migrate` applies from here
        post_migrate.connect(_upgrade_queue, sender=self)


def _upgrade_queue(sender: AppConfig, using: str, **kwargs: object) -> None:
    from django.db import connections

    from pgq_supervisor.contrib.django.backend import migrate_queue

    # post_migrate comes for every database, also from `flush` and each TransactionTestCase:
    # one that is not PostgreSQL (a sqlite test database, say) holds no queue
    if connections[using].vendor == "postgresql":
        migrate_queue(using)
