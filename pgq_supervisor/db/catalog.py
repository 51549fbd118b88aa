"""The schema read back from PostgreSQL's catalogs, for `schema-dump` (admin/schema.py): one
statement per object, by kind, then name (the schema_dump_* statements)."""

from __future__ import annotations

import dataclasses

from psycopg.rows import scalar_row

from pgq_supervisor.db.connection import Conn, cursor, statement, wrapped
from pgq_supervisor.db.params import SchemaNameParams
from pgq_supervisor.db.rows import NamedRow


@dataclasses.dataclass(frozen=True, slots=True)
class SchemaObject:
    """One object of the schema: its name and the statement that makes it."""

    name: str
    definition: str


@dataclasses.dataclass(frozen=True, slots=True)
class SchemaObjects:
    """What a schema holds: the newest migration applied (None: no schema_version table rows)
    and, per kind, its objects in name order."""

    migration: str | None
    kinds: tuple[tuple[str, tuple[SchemaObject, ...]], ...]


SCHEMA_OBJECT = NamedRow(SchemaObject)


def schema_objects(conn: Conn, schema: str) -> SchemaObjects:
    """Read `schema` back from the catalogs, in one transaction, with search_path set to it
    (SET LOCAL) so that its own names print unqualified. For the schema-dump command's own
    autocommit connection: in a caller's transaction the search_path would outlive the call."""
    params: SchemaNameParams = {"schema": schema}
    with wrapped(), conn.transaction():
        conn.execute(statement("schema_dump_search_path", schema))
        with cursor(conn, scalar_row) as cur:
            migration: str | None = cur.execute(statement("schema_dump_version", schema)).fetchone()
        kinds = []
        with cursor(conn, SCHEMA_OBJECT) as cur:
            for title, query in _kinds(schema):
                kinds.append((title, tuple(cur.execute(query, params).fetchall())))
    return SchemaObjects(migration, tuple(kinds))


def _kinds(schema: str) -> tuple[tuple[str, bytes], ...]:
    """(section title, statement), in the order the dump prints them."""
    return (
        ("Types", statement("schema_dump_types", schema)),
        ("Sequences", statement("schema_dump_sequences", schema)),
        ("Tables", statement("schema_dump_tables", schema)),
        ("Indexes", statement("schema_dump_indexes", schema)),
        ("Triggers", statement("schema_dump_triggers", schema)),
        ("Views", statement("schema_dump_views", schema)),
        ("Functions", statement("schema_dump_functions", schema)),
    )
