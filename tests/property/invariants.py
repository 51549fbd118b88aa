"""The queue invariants of SPEC §4 as SQL, shared by the property tests.

Each check is a single statement, so it reads one snapshot: it must hold at any moment, even
while other sessions are writing, because every committed transaction keeps it true.
"""

from __future__ import annotations

from typing import LiteralString

from psycopg import sql

from pgq_supervisor import db
from pgq_supervisor.jobs import TERMINAL_STATES

SCHEMA = db.default_schema()
TERMINAL = sorted(s.value for s in TERMINAL_STATES)

# One row (rule, subject) per violation; no rows means every invariant holds.
_VIOLATIONS: LiteralString = """
SELECT 'B1 0 <= num_jobs_stopped <= num_jobs', b.id::text
FROM {schema}.job_bundle b
WHERE NOT (0 <= b.num_jobs_stopped AND b.num_jobs_stopped <= b.num_jobs)
UNION ALL
SELECT 'B2 num_jobs = count of its jobs', b.id::text
FROM {schema}.job_bundle b
WHERE b.num_jobs <> (SELECT count(*) FROM {schema}.job j WHERE j.bundle_id = b.id)
UNION ALL
SELECT 'B3 num_jobs_stopped = count of its terminal jobs', b.id::text
FROM {schema}.job_bundle b
WHERE b.num_jobs_stopped <> (SELECT count(*) FROM {schema}.job j
                             WHERE j.bundle_id = b.id AND j.state::text = ANY(%(terminal)s))
UNION ALL
SELECT 'J1 worker_alive_at set => running', j.id::text
FROM {schema}.job j WHERE j.worker_alive_at IS NOT NULL AND j.state <> 'running'
UNION ALL
SELECT 'J2 pending => no start, stop, heartbeat, worker or lease', j.id::text
FROM {schema}.job j
WHERE j.state = 'pending'
  AND (j.started_at IS NOT NULL OR j.stopped_at IS NOT NULL OR j.worker_alive_at IS NOT NULL
       OR j.worker_id IS NOT NULL OR j.lease IS NOT NULL)
UNION ALL
SELECT 'J3 0 <= current_retry_count <= max_retry_count', j.id::text
FROM {schema}.job j
WHERE j.current_retry_count < 0 OR j.current_retry_count > coalesce(j.max_retry_count, 0)
UNION ALL
SELECT 'J4 running <=> held under one lease', j.id::text
FROM {schema}.job j WHERE (j.state = 'running') <> (j.lease IS NOT NULL)
UNION ALL
SELECT 'D1 a waiting job waits for exactly its unmet dependencies', j.id::text
FROM {schema}.job j
WHERE j.waiting_on > 0 AND j.ordered_key IS NULL  -- an ordered job also waits on its key
  AND (j.state <> 'pending' OR j.depends_on IS NULL
       OR j.waiting_on <> (
           SELECT count(*) FROM {schema}.job_dependency e
           JOIN {schema}.job d ON d.id = e.depends_on
           WHERE e.job_id = j.id
             AND (d.state IN ('pending', 'running')
                  OR (d.state IN ('failed', 'cancelled') AND j.on_dependency_failure = 'cancel'))))
UNION ALL
SELECT 'U1 job_unique holds exactly the unfinished jobs with a unique_key', coalesce(
           u.unique_key, j.unique_key)
FROM {schema}.job_unique u
FULL JOIN (SELECT x.id, x.unique_key FROM {schema}.job x
           WHERE x.unique_key IS NOT NULL AND x.state IN ('pending', 'running')) j
       ON j.unique_key = u.unique_key AND j.id = u.job_id
WHERE u.job_id IS NULL OR j.id IS NULL
"""

# Bundles whose completion jobs do not number exactly their transitions to complete, as
# counted by the audit trigger below (a test-only observer, independent of the counter code).
_B4_VIOLATIONS: LiteralString = """
SELECT 'B4 one completion job per completion', b.id::text
FROM {schema}.job_bundle b
WHERE (SELECT count(*) FROM {schema}.job c
       WHERE c.bundle_id IS NULL AND c.type = b.on_complete
         AND c.payload = jsonb_build_object('bundle_id', b.id::text))
   <> CASE WHEN b.on_complete IS NULL THEN 0
           ELSE (SELECT count(*) FROM public.pgq_test_completions a WHERE a.bundle_id = b.id)
      END
"""

_AUDIT_SETUP: LiteralString = """
CREATE TABLE public.pgq_test_completions (bundle_id uuid NOT NULL);
CREATE FUNCTION public.pgq_test_audit_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.num_jobs > 0 AND NEW.num_jobs_stopped = NEW.num_jobs
       AND NOT (OLD.num_jobs > 0 AND OLD.num_jobs_stopped = OLD.num_jobs) THEN
        INSERT INTO public.pgq_test_completions (bundle_id) VALUES (NEW.id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER pgq_test_audit_completion AFTER UPDATE ON {schema}.job_bundle
    FOR EACH ROW EXECUTE FUNCTION public.pgq_test_audit_completion();
"""


def q(text: LiteralString) -> sql.Composed:
    """`text` with `{schema}` bound to the queue's schema."""
    return sql.SQL(text).format(schema=sql.Identifier(SCHEMA))


def violations(conn: db.Conn) -> list[tuple[str, str]]:
    """B1-B3, J1-J4, D1 and U1 broken anywhere in the database, read from one snapshot."""
    rows = conn.execute(q(_VIOLATIONS), {"terminal": TERMINAL}).fetchall()
    return [(r[0], r[1]) for r in rows]


def install_completion_audit(conn: db.Conn) -> None:
    """Record every transition of a bundle to complete (for `b4_violations`)."""
    conn.execute(q(_AUDIT_SETUP))


def b4_violations(conn: db.Conn) -> list[tuple[str, str]]:
    rows = conn.execute(q(_B4_VIOLATIONS)).fetchall()
    return [(r[0], r[1]) for r in rows]


def audited_completions(conn: db.Conn) -> dict[str, int]:
    rows = conn.execute(
        "SELECT bundle_id::text, count(*)::int FROM public.pgq_test_completions GROUP BY 1"
    ).fetchall()
    return {r[0]: r[1] for r in rows}
