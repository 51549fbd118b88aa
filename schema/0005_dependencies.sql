-- pgq_supervisor schema, version 5: jobs that run after other jobs (issue 13, dependencies).
--
-- A dependent job is inserted pending with waiting_on = the number of its dependencies not yet
-- met, and only waiting_on = 0 jobs are in job_claim_idx: a waiting job is never visited by a
-- claim, however many there are. When a dependency reaches a terminal state, the row trigger
-- below decrements its waiting dependents (success, or any end under 'run') or cancels them
-- (failure or cancel under 'cancel', and their own dependents in the same statement: see
-- dependency_doom). Only jobs that have dependents (has_dependents, set when a dependent is
-- linked) fire it, so the completion of an ordinary job costs a WHEN test and nothing more
-- (plus, in `succeed`, one probe of job_dependency's index for the ordered pre-lock).
--
-- A dependency that is reset (terminal -> pending) counts as unmet again for the dependents
-- still waiting; dependents already released (waiting_on reached 0, or cancelled) are left
-- as they are. A dependent that is reset recounts its unmet dependencies (job_recount_waiting).

ALTER TABLE job
    ADD COLUMN waiting_on integer NOT NULL DEFAULT 0,
    -- the job's dependencies, in the order given; NULL for a job without any
    ADD COLUMN depends_on uuid[],
    ADD COLUMN on_dependency_failure text,
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT job_waiting_only_pending CHECK (waiting_on = 0 OR state = 'pending'),
    ADD CONSTRAINT job_waiting_on_range CHECK (waiting_on >= 0),
    ADD CONSTRAINT job_dependency_failure_rule
        CHECK ((depends_on IS NULL AND on_dependency_failure IS NULL)
               OR (depends_on IS NOT NULL AND on_dependency_failure IN ('cancel', 'run')));

-- Edges, for finding the dependents of a job that just finished (the primary key serves the
-- dependent's side and the cascade when a dependent is deleted).
CREATE TABLE job_dependency (
    job_id     uuid NOT NULL REFERENCES job (id) ON DELETE CASCADE,
    depends_on uuid NOT NULL REFERENCES job (id) ON DELETE CASCADE,
    PRIMARY KEY (job_id, depends_on)
);
CREATE INDEX job_dependency_depends_on_idx ON job_dependency (depends_on);

-- Waiting jobs leave the claim's index (see 0001 and 0003: the claim walks it in order).
DROP INDEX job_claim_idx;
CREATE INDEX job_claim_idx ON job (priority DESC, created_at, id)
    WHERE state = 'pending' AND waiting_on = 0;

CREATE OR REPLACE FUNCTION claim_pick(p_types text[], p_limit integer) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
BEGIN
    RETURN ARRAY(
        SELECT p.id
        FROM job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= now()
          AND p.type = ANY(p_types)
        ORDER BY p.priority DESC, p.created_at, p.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED);
END $$;

-- A waiting job is not available: link_dependencies notifies when it is.
CREATE OR REPLACE FUNCTION job_notify_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify('pgq_job_available', t.type)
    FROM (SELECT DISTINCT n.type FROM new_jobs n
          WHERE n.state = 'pending' AND n.waiting_on = 0 AND n.start_at <= now()) t;
    RETURN NULL;
END $$;

-- Called right after inserting jobs that have dependencies (inserted with waiting_on > 0), in
-- the same transaction: (p_jobs[i], p_deps[i]) is one edge. Locks the dependencies in id order
-- and marks them has_dependents, so a dependency finishing concurrently either committed
-- before (its state is read here) or waits for this transaction and then sees the edges.
-- Raises PGQ01 naming the first unknown id; the caller's savepoint then drops the jobs too.
-- Sets each job's waiting_on, cancels those a failed dependency dooms, and notifies.
CREATE FUNCTION link_dependencies(p_jobs uuid[], p_deps uuid[]) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    missing uuid;
    r record;
    ready text[] := ARRAY[]::text[];
    stopped uuid[] := ARRAY[]::uuid[];
BEGIN
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

-- A dependency that ends without success (or is deleted) dooms its waiting dependents under
-- 'cancel', theirs, and so on: found by one recursive query and cancelled by one UPDATE, whose
-- own trigger calls find nothing left to cancel. (A trigger recursion per level exhausted the
-- stack on a chain of 1,000.) Each names the dependency it waited on; returns their ids.
CREATE FUNCTION dependency_doom(p_root uuid, p_state text) RETURNS uuid[]
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    doomed_ids uuid[];
    causes uuid[];
    cause_states text[];
    stopped uuid[];
BEGIN
    WITH RECURSIVE doomed(id, cause, cause_state) AS (
        SELECT w.id, p_root, p_state
        FROM job_dependency e JOIN job w ON w.id = e.job_id
        WHERE e.depends_on = p_root AND w.state = 'pending' AND w.waiting_on > 0
          AND w.on_dependency_failure = 'cancel'
      UNION
        SELECT w.id, x.id, 'cancelled'
        FROM doomed x
        JOIN job_dependency e ON e.depends_on = x.id
        JOIN job w ON w.id = e.job_id
        WHERE w.state = 'pending' AND w.waiting_on > 0 AND w.on_dependency_failure = 'cancel'
    )
    SELECT array_agg(c.id ORDER BY c.id), array_agg(c.cause ORDER BY c.id),
           array_agg(c.cause_state ORDER BY c.id)
    INTO doomed_ids, causes, cause_states
    FROM (SELECT DISTINCT ON (x.id) x.id, x.cause, x.cause_state FROM doomed x
          ORDER BY x.id, x.cause = p_root DESC, x.cause) c;
    IF doomed_ids IS NULL THEN
        RETURN ARRAY[]::uuid[];
    END IF;
    PERFORM 1 FROM job WHERE id = ANY(doomed_ids) ORDER BY id FOR NO KEY UPDATE;
    WITH cancelled AS (
        UPDATE job j SET state = 'cancelled', stopped_at = now(), waiting_on = 0,
            error_msg = format('dependency %s %s', c.cause, c.cause_state),
            error_data = jsonb_build_object('dependency', c.cause,
                                            'dependency_state', c.cause_state),
            updated_at = now()
        FROM unnest(doomed_ids, causes, cause_states) AS c(id, cause, cause_state)
        WHERE j.id = c.id AND j.state = 'pending'
        RETURNING j.id
    )
    SELECT array_agg(id) INTO stopped FROM cancelled;
    RETURN coalesce(stopped, ARRAY[]::uuid[]);
END $$;

-- Every job still waiting on p_root counts it as met now; returns the types of those that
-- became claimable.
CREATE FUNCTION dependency_release(p_root uuid) RETURNS text[]
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    d record;
    left_ integer;
    ready text[] := ARRAY[]::text[];
BEGIN
    FOR d IN
        SELECT w.id, w.type, w.start_at
        FROM job_dependency e JOIN job w ON w.id = e.job_id
        WHERE e.depends_on = p_root AND w.state = 'pending' AND w.waiting_on > 0
        ORDER BY w.id
        FOR NO KEY UPDATE OF w
    LOOP
        UPDATE job SET waiting_on = waiting_on - 1, updated_at = now()
        WHERE id = d.id AND state = 'pending' AND waiting_on > 0
        RETURNING waiting_on INTO left_;
        IF left_ = 0 AND d.start_at <= now() THEN
            ready := array_append(ready, d.type);
        END IF;
    END LOOP;
    RETURN ready;
END $$;

CREATE FUNCTION dependency_notify(p_ready text[], p_stopped uuid[]) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify('pgq_job_available', t.type)
    FROM (SELECT DISTINCT unnest(p_ready) AS type) t;
    PERFORM pg_notify('pgq_job_stopped', string_agg(k.id::text, ','))
    FROM (SELECT id, (row_number() OVER () - 1) / 200 AS chunk FROM unnest(p_stopped) AS id) k
    GROUP BY k.chunk;
END $$;

-- A job with dependents reached a terminal state, or left one (reset). Waiting dependents are
-- locked in id order (completions lock them before their batch, see `succeed` in queries.sql).
CREATE FUNCTION job_release_dependents() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    stopped uuid[] := ARRAY[]::uuid[];
BEGIN
    IF NEW.state NOT IN ('succeeded', 'failed', 'cancelled') THEN
        -- reset: the dependents still waiting that counted its end as met count it as unmet
        -- again (under 'cancel', one waiting on a failed dependency already counts it unmet)
        UPDATE job j SET waiting_on = j.waiting_on + 1, updated_at = now()
        WHERE j.id = ANY(ARRAY(
            SELECT w.id FROM job_dependency e JOIN job w ON w.id = e.job_id
            WHERE e.depends_on = NEW.id AND w.state = 'pending' AND w.waiting_on > 0
              AND (OLD.state = 'succeeded' OR w.on_dependency_failure = 'run')
            ORDER BY w.id FOR NO KEY UPDATE OF w))
          AND j.state = 'pending' AND j.waiting_on > 0;
        RETURN NULL;
    END IF;
    IF NEW.state <> 'succeeded' THEN
        stopped := dependency_doom(NEW.id, NEW.state::text);
    END IF;
    -- what still waits on it now is released: everything on a success, 'run' on a failure
    PERFORM dependency_notify(dependency_release(NEW.id), stopped);
    RETURN NULL;
END $$;

CREATE TRIGGER job_release_dependents AFTER UPDATE OF state ON job
    FOR EACH ROW
    WHEN (NEW.has_dependents
          AND (OLD.state IN ('succeeded', 'failed', 'cancelled'))
              IS DISTINCT FROM (NEW.state IN ('succeeded', 'failed', 'cancelled')))
    EXECUTE FUNCTION job_release_dependents();

-- A dependent job that leaves pending stops waiting (waiting_on counts only pending jobs);
-- one reset back to pending recounts: dependencies not yet succeeded, and under 'cancel' the
-- failed ones too (it then waits until they are reset and succeed; cancel it to give up).
CREATE FUNCTION job_recount_waiting() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.state <> 'pending' THEN
        NEW.waiting_on := 0;
    ELSIF OLD.state IN ('succeeded', 'failed', 'cancelled') THEN
        SELECT count(*) INTO NEW.waiting_on
        FROM job_dependency e JOIN job d ON d.id = e.depends_on
        WHERE e.job_id = NEW.id
          AND (d.state IN ('pending', 'running')
               OR (d.state IN ('failed', 'cancelled') AND NEW.on_dependency_failure = 'cancel'));
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER job_recount_waiting BEFORE UPDATE OF state ON job
    FOR EACH ROW
    WHEN (NEW.depends_on IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION job_recount_waiting();

-- A job with dependents deleted by hand (or with its bundle) will never succeed: its waiting
-- dependents under 'cancel' are cancelled ("dependency <id> deleted"), and those under 'run'
-- that still counted it unmet are released. BEFORE the delete: the edges go with the row.
-- A succeeded one (what retention deletes) was counted as met already: nothing to do.
CREATE FUNCTION job_dependency_deleted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    stopped uuid[];
BEGIN
    IF OLD.state <> 'succeeded' THEN
        stopped := dependency_doom(OLD.id, 'deleted');
        PERFORM dependency_notify(
            CASE WHEN OLD.state IN ('pending', 'running') THEN dependency_release(OLD.id)
                 ELSE ARRAY[]::text[] END,
            stopped);
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER job_dependency_deleted BEFORE DELETE ON job
    FOR EACH ROW WHEN (OLD.has_dependents)
    EXECUTE FUNCTION job_dependency_deleted();
