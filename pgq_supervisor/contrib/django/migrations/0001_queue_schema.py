"""Creates (or brings up to date) the queue's schema in the database being migrated, on
Django's connection and inside the migration's transaction (pgq.migrate uses a savepoint)."""

from __future__ import annotations

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

from pgq_supervisor import schema
from pgq_supervisor.contrib.django.backend import (
    backend_options,
    options_database,
    options_schema,
    psycopg_connection,
)


def migrate_queue(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # the schemas of the backends that keep their queue in this database (without one of
    # ours configured: the default schema in the default database)
    alias = schema_editor.connection.alias
    ours = [p for _, p in backend_options()] or ([{}] if alias == "default" else [])
    names = {options_schema(p) for p in ours if options_database(p) == alias}
    if not names:
        return
    conn = psycopg_connection(alias)
    for name in sorted(names):
        schema.migrate(conn, name)


class Migration(migrations.Migration):
    initial = True
    operations = [migrations.RunPython(migrate_queue, migrations.RunPython.noop, elidable=False)]
