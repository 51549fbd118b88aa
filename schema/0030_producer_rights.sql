-- pgq_supervisor schema, version 30 (issue 38): a producer role that may insert jobs but not
-- update or delete job rows.
--
-- Parts of an enqueue write job rows after inserting them: linking dependencies (which may
-- cancel the new job at once: it depends on a failed job), strict order per key, a debounced
-- job waiting behind a running holder; and debounce rewrites the pending holder of its key,
-- pgq.signal wakes a waiting workflow. Those writes now run in SECURITY DEFINER functions
-- (owned by the migrating role), so the producer needs INSERT and SELECT only. Each function
-- does to a row only what the public call may do to it:
--   - link_dependencies, ordered_link, debounce_wait: only jobs this transaction wrote
--     (written_here) and that are as an enqueue leaves them (pending, never run, nothing
--     depends on them, not yet linked, ordered or debounced), and only what the job's own
--     columns ask (its declared depends_on, all of it);
--   - debounce_holder: the pending job holding the key named (the debounce rule: any producer
--     of a key may replace the payload, start_at and priority of its pending holder);
--   - workflow_signal: what pgq.signal does to any job it names.
-- A definer function resolves names in the caller's session, whose temporary tables come
-- first in a search_path that does not name pg_temp: every function of the schema (they run
-- as the owner when a definer function calls them or fires their triggers) now ends its
-- search_path with pg_temp. The runner migrates with that path (schema.py), so functions
-- made by later migrations capture it with SET search_path FROM CURRENT.
-- EXECUTE on the definer functions is revoked from PUBLIC: roles.sql grants it.

-- Whether this transaction (or one of its subtransactions not rolled back) wrote the row
-- version whose xmin is `p_xmin`: a visible row whose writer is still in progress is our own.
-- Its xid8 is rebuilt from our top-level xid (our subtransactions' ids follow it); a row of an
-- earlier transaction is false without a look at the commit log.
CREATE FUNCTION written_here(p_xmin xid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    top xid8 := pg_current_xact_id_if_assigned();
    d bigint;
BEGIN
    IF top IS NULL OR p_xmin IS NULL THEN
        RETURN false;  -- this transaction has written nothing
    END IF;
    d := (p_xmin::text::bigint - top::text::bigint % 4294967296 + 4294967296) % 4294967296;
    IF d >= 2147483648 THEN
        RETURN false;  -- older than this transaction
    END IF;
    RETURN pg_xact_status((top::text::bigint + d)::text::xid8) = 'in progress';
END $$;

-- The refusal of a definer function asked to touch a job that is not its caller's to touch.
CREATE FUNCTION refuse_foreign_job(p_function text, p_id uuid) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE insufficient_privilege USING
        MESSAGE = format('%s.%s: job %s is not a job this transaction just enqueued',
                         current_schema(), p_function, p_id);
END $$;

-- As an enqueue leaves a job: written by this transaction, pending, never claimed, nothing
-- depends on it and no workflow step of it (signal's wake of a waiting workflow writes one).
CREATE FUNCTION job_fresh(j job) RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT j.state = 'pending' AND j.started_at IS NULL AND NOT j.has_dependents
           AND NOT EXISTS (SELECT FROM workflow_step s WHERE s.job_id = j.id)
$$;

-- schema/0005's link_dependencies, as definer, for jobs this transaction inserted and has not
-- linked yet, each with all of its declared dependencies (depends_on).
CREATE OR REPLACE FUNCTION link_dependencies(p_jobs uuid[], p_deps uuid[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    missing uuid;
    r record;
    ready text[] := ARRAY[]::text[];
    stopped uuid[] := ARRAY[]::uuid[];
BEGIN
    SELECT x.id INTO missing
    FROM (SELECT DISTINCT l.j AS id FROM unnest(p_jobs) AS l(j)) x
    LEFT JOIN job j ON j.id = x.id
    WHERE j.id IS NULL OR NOT written_here(j.xmin) OR NOT job_fresh(j)
       OR j.depends_on IS NULL
       OR EXISTS (SELECT FROM job_dependency e WHERE e.job_id = j.id)
       OR ARRAY(SELECT DISTINCT l.d FROM unnest(p_jobs, p_deps) AS l(j, d)
                WHERE l.j = x.id ORDER BY 1)
          IS DISTINCT FROM ARRAY(SELECT DISTINCT d FROM unnest(j.depends_on) d ORDER BY 1)
    LIMIT 1;
    IF FOUND THEN
        PERFORM refuse_foreign_job('link_dependencies', missing);
    END IF;
    PERFORM 1 FROM job WHERE id = ANY(p_deps) ORDER BY id FOR NO KEY UPDATE;
    SELECT d INTO missing FROM unnest(p_deps) AS d
    WHERE NOT EXISTS (SELECT 1 FROM job j WHERE j.id = d) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'unknown dependency %: no such job', missing USING ERRCODE = 'PGQ01';
    END IF;
    UPDATE job SET has_dependents = true WHERE id = ANY(p_deps) AND NOT has_dependents;
    INSERT INTO job_dependency (job_id, depends_on)
    SELECT DISTINCT e.j, e.d FROM unnest(p_jobs, p_deps) AS e(j, d)
    ON CONFLICT DO NOTHING;

    FOR r IN
        WITH counted AS (
            SELECT e.job_id,
                   count(*) FILTER (WHERE d.state IN ('pending', 'running')) AS unmet,
                   (array_agg(d.id ORDER BY d.id) FILTER (
                       WHERE d.state IN ('failed', 'cancelled')
                         AND j.on_dependency_failure = 'cancel'))[1] AS failed_dep,
                   (array_agg(d.state ORDER BY d.id) FILTER (
                       WHERE d.state IN ('failed', 'cancelled')
                         AND j.on_dependency_failure = 'cancel'))[1] AS failed_state
            FROM job_dependency e
            JOIN job j ON j.id = e.job_id
            JOIN job d ON d.id = e.depends_on
            WHERE e.job_id = ANY(p_jobs)
            GROUP BY e.job_id
        )
        UPDATE job j SET
            state = CASE WHEN c.failed_dep IS NULL THEN j.state ELSE 'cancelled' END,
            stopped_at = CASE WHEN c.failed_dep IS NULL THEN NULL ELSE now() END,
            waiting_on = CASE WHEN c.failed_dep IS NULL THEN c.unmet ELSE 0 END,
            error_msg = CASE WHEN c.failed_dep IS NULL THEN NULL
                             ELSE format('dependency %s %s', c.failed_dep, c.failed_state) END,
            error_data = CASE WHEN c.failed_dep IS NULL THEN NULL
                              ELSE jsonb_build_object('dependency', c.failed_dep,
                                                      'dependency_state', c.failed_state) END,
            updated_at = now()
        FROM counted c
        WHERE j.id = c.job_id
        RETURNING j.id, j.type, j.state, j.waiting_on, j.start_at
    LOOP
        IF r.state = 'cancelled' THEN
            stopped := array_append(stopped, r.id);
        ELSIF r.waiting_on = 0 AND r.start_at <= now() THEN
            ready := array_append(ready, r.type);
        END IF;
    END LOOP;
    PERFORM pg_notify('pgq_job_available', t.type) FROM (SELECT DISTINCT unnest(ready) AS type) t;
    PERFORM pg_notify('pgq_job_stopped', string_agg(k.id::text, ','))
    FROM (SELECT id, (row_number() OVER () - 1) / 200 AS chunk FROM unnest(stopped) AS id) k
    GROUP BY k.chunk;
END $$;

-- schema/0019's ordered_link, as definer, for a job this transaction just inserted with no
-- other option that ordering excludes (no key, no dependency) and no key of order yet.
CREATE OR REPLACE FUNCTION ordered_link(p_id uuid, p_key text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM job j
        WHERE j.id = p_id AND written_here(j.xmin) AND job_fresh(j) AND j.ordered_key IS NULL
          AND j.depends_on IS NULL AND j.unique_key IS NULL AND j.debounce_key IS NULL
          AND j.waiting_on = 0
    ) THEN
        PERFORM refuse_foreign_job('ordered_link', p_id);
    END IF;
    PERFORM ordered_lock(p_key);
    UPDATE job SET ordered_key = p_key, ordered_seq = nextval('job_ordered_seq'),
                   waiting_on = waiting_on + ordered_blocked(p_key, p_id)::int
    WHERE id = p_id;
END $$;

-- Debounce behind a running holder (schema/0019): the job this transaction just inserted to
-- wait behind the job of `p_key` found running (it depends on that job alone, whatever its
-- end; that job may have ended since) holds the key in debounce_key. Was an UPDATE of the
-- producer's (set_debounce_key).
CREATE FUNCTION debounce_wait(p_id uuid, p_key text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(current_schema() || ':unique:' || p_key, 0));
    IF NOT EXISTS (
        SELECT FROM job j JOIN job h ON h.id = j.depends_on[1]
        WHERE j.id = p_id AND written_here(j.xmin) AND job_fresh(j)
          AND j.unique_key IS NULL AND j.debounce_key IS NULL AND j.ordered_key IS NULL
          AND cardinality(j.depends_on) = 1 AND j.on_dependency_failure = 'run'
          AND (h.unique_key = p_key OR h.debounce_key = p_key)  -- running, or ended since
    ) THEN
        PERFORM refuse_foreign_job('debounce_wait', p_id);
    END IF;
    UPDATE job SET debounce_key = p_key WHERE id = p_id;
END $$;

-- The debounce rule and pgq.signal act on jobs by key or id, for any producer: as definer.
ALTER FUNCTION debounce_holder(text, jsonb, timestamptz, integer) SECURITY DEFINER;
ALTER FUNCTION workflow_signal(uuid, text, jsonb) SECURITY DEFINER;

REVOKE EXECUTE ON FUNCTION link_dependencies(uuid[], uuid[]), ordered_link(uuid, text),
    debounce_wait(uuid, text), debounce_holder(text, jsonb, timestamptz, integer),
    workflow_signal(uuid, text, jsonb) FROM PUBLIC;

-- pg_temp last in every function's search_path (the runner's path, captured).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema() AND p.prokind IN ('f', 'p')
          AND EXISTS (SELECT FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')
          AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                          AND d.objid = p.oid AND d.deptype IN ('e', 'i'))
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path FROM CURRENT', f);
    END LOOP;
END $$;
