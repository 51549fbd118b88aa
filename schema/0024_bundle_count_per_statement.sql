-- pgq_supervisor schema, version 24 (issue 35, storage, step 1): a bundle's counter is
-- written once per statement, not once per job.
-- The row triggers of 0001 updated job_bundle once for every job of a bundle that became (or
-- stopped being) terminal: a bundle of 10,000 jobs left 10,000 versions of its one row, and
-- under a snapshot held open (a long report, a replica with hot_standby_feedback) none of them
-- could be pruned, so every later completion walked the whole chain of versions to find the
-- live one (the hot-row pattern of shared/STORAGE-FIELD.md A11.3). Now statement triggers
-- read the statement's changed rows (transition tables) and write each bundle once per
-- statement with the sum of its changes: a worker completes its batch (up to 200 jobs) in one
-- statement, so that bundle takes one version per batch. The rules are unchanged: the bundle
-- row is locked with a blocking lock (never SKIP LOCKED: every completion counts), bundles in
-- id order (two statements touching the same bundles cannot deadlock on them), after the
-- statement's job rows (as the row triggers did: jobs first, then bundles); when a counter
-- reaches num_jobs, the same transaction notifies pgq_bundle_stopped and enqueues the
-- on_complete job, once per transition to complete (B4).
-- Transition tables cannot go with a column list (UPDATE OF state), so the update trigger runs
-- after every UPDATE of job; it looks for a bundled row first and returns at once without one
-- (a claim or heartbeat of unbundled jobs: one scan of its new rows).

DROP TRIGGER job_bundle_count_update ON job;
DROP TRIGGER job_bundle_count_delete ON job;
DROP FUNCTION job_bundle_count();

-- Applies one statement's changes to the bundles they touch: p_stopped[i] and p_jobs[i] are
-- the changes of num_jobs_stopped and num_jobs of bundle p_ids[i] (distinct, any order).
CREATE FUNCTION bundle_count_apply(p_ids uuid[], p_stopped integer[], p_jobs integer[])
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    d        record;
    was_done boolean;
    b        job_bundle%ROWTYPE;
BEGIN
    FOR d IN
        SELECT u.id, u.d_stopped, u.d_jobs
        FROM unnest(p_ids, p_stopped, p_jobs) AS u(id, d_stopped, d_jobs)
        ORDER BY u.id
    LOOP
        SELECT * INTO b FROM job_bundle WHERE id = d.id FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;  -- the bundle itself is being deleted (cascade)
        was_done := b.num_jobs > 0 AND b.num_jobs_stopped = b.num_jobs;

        UPDATE job_bundle
        SET num_jobs_stopped = num_jobs_stopped + d.d_stopped,
            num_jobs = num_jobs + d.d_jobs,
            updated_at = now()
        WHERE id = d.id
        RETURNING * INTO b;

        IF NOT was_done AND b.num_jobs > 0 AND b.num_jobs_stopped = b.num_jobs THEN
            PERFORM pg_notify('pgq_bundle_stopped', b.id::text);
            IF b.on_complete IS NOT NULL THEN
                INSERT INTO job (type, payload, origin)
                VALUES (b.on_complete, jsonb_build_object('bundle_id', b.id),
                        coalesce(b.origin, 'bundle:' || b.type));
            END IF;
        END IF;
    END LOOP;
END $$;

-- After an UPDATE of job: each bundle gains (or, on a reset, loses) the jobs of it that became
-- terminal (or stopped being so) in the statement.
CREATE FUNCTION job_bundle_count_updated() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_ids     uuid[];
    v_stopped integer[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM bundle_new_rows n WHERE n.bundle_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(x.bundle_id), array_agg(x.d)
    INTO v_ids, v_stopped
    FROM (SELECT n.bundle_id,
                 sum(CASE WHEN n.state IN ('succeeded', 'failed', 'cancelled') THEN 1 ELSE -1 END)
                     AS d
          FROM bundle_new_rows n JOIN bundle_old_rows o ON o.id = n.id
          WHERE n.bundle_id IS NOT NULL
            AND (o.state IN ('succeeded', 'failed', 'cancelled'))
                IS DISTINCT FROM (n.state IN ('succeeded', 'failed', 'cancelled'))
          GROUP BY n.bundle_id) x
    WHERE x.d <> 0;
    IF v_ids IS NOT NULL THEN
        PERFORM bundle_count_apply(v_ids, v_stopped, array_fill(0, ARRAY[cardinality(v_ids)]));
    END IF;
    RETURN NULL;
END $$;

-- After a DELETE of job: each bundle loses its deleted jobs, and the terminal ones among them
-- from its counter.
CREATE FUNCTION job_bundle_count_deleted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_ids     uuid[];
    v_stopped integer[];
    v_jobs    integer[];
BEGIN
    SELECT array_agg(x.bundle_id), array_agg(x.d_stopped), array_agg(x.d_jobs)
    INTO v_ids, v_stopped, v_jobs
    FROM (SELECT o.bundle_id,
                 -count(*) FILTER (WHERE o.state IN ('succeeded', 'failed', 'cancelled'))
                     AS d_stopped,
                 -count(*) AS d_jobs
          FROM bundle_old_rows o
          WHERE o.bundle_id IS NOT NULL
          GROUP BY o.bundle_id) x;
    IF v_ids IS NOT NULL THEN
        PERFORM bundle_count_apply(v_ids, v_stopped::integer[], v_jobs::integer[]);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER job_bundle_count_update AFTER UPDATE ON job
    REFERENCING OLD TABLE AS bundle_old_rows NEW TABLE AS bundle_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION job_bundle_count_updated();

CREATE TRIGGER job_bundle_count_delete AFTER DELETE ON job
    REFERENCING OLD TABLE AS bundle_old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION job_bundle_count_deleted();
