"""WAL bytes one database wrote, and the bytes a schema's relations hold (issue 35).

Shared by `lifecycle_wal` (each step of a job's life) and the `wal` and `retention` groups of
`python -m benchmarks`. The server's other databases (another benchmark, a test suite) write
into the same WAL, so the difference of two WAL positions counts their records too:
`wal_bytes` reads the records between two positions with pg_walinspect (PostgreSQL 15+
contrib) and keeps only this database's. `keep_wal` holds those records on disk until they
have been read: a checkpoint another session asks for could otherwise recycle a segment.
"""

from __future__ import annotations

import os
import sys

import psycopg
from psycopg.rows import TupleRow

Conn = psycopg.Connection[TupleRow]


def insert_lsn(conn: Conn) -> str:
    """The WAL insert position: where the next record of any session will go."""
    return _lsn(conn, "pg_current_wal_insert_lsn()")


def flush_lsn(conn: Conn) -> str:
    """The flushed position, which pg_walinspect may read up to (a committed transaction's
    records are below it once its commit returned)."""
    return _lsn(conn, "pg_current_wal_flush_lsn()")


def _lsn(conn: Conn, function: str) -> str:
    row = conn.execute(f"SELECT {function}::text").fetchone()
    assert row is not None
    return str(row[0])


# The WAL records of this database between two positions: those whose blocks are its relations,
# and the commit records of the transactions that wrote them. One pass over the records, summed
# per transaction: no materialized copy of them (millions of records, a purge's, spilled it to
# disk and took minutes).
OWN_WAL = """
SELECT coalesce(sum(own_len + CASE WHEN wrote THEN commit_len ELSE 0 END), 0)::bigint,
       coalesce(sum(own_fpi + CASE WHEN wrote THEN commit_fpi ELSE 0 END), 0)::bigint
FROM (
    SELECT coalesce(sum(record_length) FILTER (WHERE own), 0) AS own_len,
           coalesce(sum(fpi_length) FILTER (WHERE own), 0) AS own_fpi,
           coalesce(sum(record_length) FILTER (WHERE commit AND NOT own), 0) AS commit_len,
           coalesce(sum(fpi_length) FILTER (WHERE commit AND NOT own), 0) AS commit_fpi,
           bool_or(own) AND xid <> '0'::xid AS wrote
    FROM (
        SELECT xid, record_length, fpi_length,
               coalesce(block_ref LIKE '%%/' || %(db)s || '/%%', false) AS own,
               resource_manager = 'Transaction' AS commit
        FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
    ) r
    GROUP BY xid
) x
"""


def wal_bytes(conn: Conn, start: str, end: str) -> tuple[int, int]:
    """WAL bytes this database wrote from `start` to `end`, and the full-page images among
    them (pg_walinspect); else every database's bytes (the difference of the positions) and
    -1 when the extension cannot be had."""
    try:
        with conn.transaction():
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            db_oid = conn.execute(
                "SELECT oid::text FROM pg_database WHERE datname = current_database()"
            ).fetchone()
            assert db_oid is not None
            row = conn.execute(OWN_WAL, {"start": start, "end": end, "db": db_oid[0]}).fetchone()
    except psycopg.Error as exc:
        print(f"pg_walinspect: {exc}", file=sys.stderr)
        row = conn.execute("SELECT %s::pg_lsn - %s::pg_lsn, -1", (end, start)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def keep_wal(conn: Conn, purpose: str) -> bool:
    """A temporary physical replication slot on `conn` (an autocommit session): the server
    keeps every WAL segment from now on until that session ends. False (and a line on stderr)
    when it cannot be made; then a figure may fall back to the difference of the positions."""
    try:
        conn.execute(
            "SELECT pg_create_physical_replication_slot(%s, true, true)",
            (f"pgq_{purpose}_{os.getpid()}",),
        )
    except psycopg.Error as exc:
        print(f"no replication slot ({exc}): a step may read as '?'", file=sys.stderr)
        return False
    return True


def schema_bytes(conn: Conn, schema: str) -> int:
    """pg_total_relation_size (heap, indexes, TOAST) summed over the tables of `schema`."""
    row = conn.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'm')",
        (schema,),
    ).fetchone()
    assert row is not None
    return int(row[0])
