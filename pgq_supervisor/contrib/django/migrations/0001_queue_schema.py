"""Creates the queue's schema in the database being migrated, on Django's connection and
inside the migration's transaction (pgq.migrate uses a savepoint). Later versions of the
schema are applied by every `manage.py migrate` (apps.py), so this stays the only migration."""

from __future__ import annotations

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

from pgq_supervisor.contrib.django.backend import migrate_queue


def create_schema(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    migrate_queue(schema_editor.connection.alias)


class Migration(migrations.Migration):
    initial = True
    operations = [migrations.RunPython(create_schema, migrations.RunPython.noop, elidable=False)]
