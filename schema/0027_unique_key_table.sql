-- pgq_supervisor schema, version 27 (issue 35, step 3a): the unique key's own narrow table.
-- Until now one unfinished job per unique_key was enforced by job_unique_key_idx, a unique
-- partial index of the wide table. A partitioned table cannot have a unique index without
-- its partition key (step 4 partitions job by id), and the wide table's index took an entry
-- at the enqueue and another at the claim (the claim's update is never HOT). Now the key is
-- held by a row of job_unique (key, holder) from the job's enqueue (or its return to pending)
-- to the end of its last attempt.
--
-- Row triggers keep the table true whoever writes job (this code, a producer of the previous
-- version, users' own SQL). A job inserted with a key takes it before its row is written; a
-- key already held inserts nothing, as the enqueue's ON CONFLICT DO NOTHING did (so a plain
-- INSERT needs no ON CONFLICT clause, and one naming the old index still works). A job put
-- back to pending takes its key again or is refused with unique_violation, as the index
-- refused it; a job that finishes, is deleted or changes its key lets it go. Their WHEN
-- clauses skip every job without a unique_key, and the claim (pending to running) fires none.
--
-- job_unique_key_idx stays for one version, so that a producer of the previous version (its
-- ON CONFLICT names that index) keeps working during a rolling upgrade; step 4 drops it,
-- and tests/integration/test_unique_table.py runs the unique options without it.

CREATE TABLE job_unique (
    unique_key text NOT NULL,
    job_id     uuid NOT NULL,
    CONSTRAINT job_unique_pkey PRIMARY KEY (unique_key)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

INSERT INTO job_unique (unique_key, job_id)
SELECT unique_key, id FROM job
WHERE unique_key IS NOT NULL AND state IN ('pending', 'running');

-- A job inserted with a key takes it, or is not inserted when another job holds it.
CREATE FUNCTION job_unique_take() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO job_unique (unique_key, job_id) VALUES (new.unique_key, new.id)
    ON CONFLICT (unique_key) DO NOTHING;
    IF FOUND THEN
        RETURN new;
    END IF;
    RETURN NULL;
END $$;

-- A job back to pending (or given a key) takes it; held by another job: unique_violation on
-- job_unique_pkey, as the index refused it.
CREATE FUNCTION job_unique_hold() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO job_unique (unique_key, job_id) VALUES (new.unique_key, new.id);
    RETURN NULL;
END $$;

-- The row (old) lets its key go: it finished, was deleted or took another key.
CREATE FUNCTION job_unique_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM job_unique u WHERE u.unique_key = old.unique_key AND u.job_id = old.id;
    RETURN NULL;
END $$;

CREATE FUNCTION job_unique_truncated() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM job_unique;
    RETURN NULL;
END $$;

CREATE TRIGGER job_unique_take BEFORE INSERT ON job
    FOR EACH ROW WHEN (new.unique_key IS NOT NULL AND new.state IN ('pending', 'running'))
    EXECUTE FUNCTION job_unique_take();

-- Alphabetical order fires job_unique_rehold after job_unique_release: a key moved from one
-- row to another in one statement is let go before it is taken.
CREATE TRIGGER job_unique_release AFTER UPDATE OF state, unique_key ON job
    FOR EACH ROW WHEN (old.unique_key IS NOT NULL AND old.state IN ('pending', 'running')
                       AND (new.state NOT IN ('pending', 'running')
                            OR new.unique_key IS DISTINCT FROM old.unique_key))
    EXECUTE FUNCTION job_unique_release();

CREATE TRIGGER job_unique_rehold AFTER UPDATE OF state, unique_key ON job
    FOR EACH ROW WHEN (new.unique_key IS NOT NULL AND new.state IN ('pending', 'running')
                       AND (old.state NOT IN ('pending', 'running')
                            OR old.unique_key IS DISTINCT FROM new.unique_key))
    EXECUTE FUNCTION job_unique_hold();

CREATE TRIGGER job_unique_deleted AFTER DELETE ON job
    FOR EACH ROW WHEN (old.unique_key IS NOT NULL AND old.state IN ('pending', 'running'))
    EXECUTE FUNCTION job_unique_release();

CREATE TRIGGER job_unique_truncated AFTER TRUNCATE ON job
    FOR EACH STATEMENT EXECUTE FUNCTION job_unique_truncated();

-- The dedup windows of 0018 find the unfinished holder of a key in job_unique.
CREATE OR REPLACE FUNCTION unique_holders(p_keys text[], p_windows double precision[],
                                          p_states text[])
RETURNS TABLE(unique_key text, id uuid)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    k text;
BEGIN
    FOR k IN SELECT DISTINCT x FROM unnest(p_keys) x ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(current_schema() || ':unique:' || k, 0));
    END LOOP;
    RETURN QUERY
    SELECT h.key, h.holder FROM (
        SELECT w.key, coalesce(
            (SELECT u.job_id FROM job_unique u WHERE u.unique_key = w.key),
            (SELECT j.id FROM job j
             WHERE j.unique_key = w.key AND j.stopped_at IS NOT NULL
               AND j.created_at >= clock_timestamp() - make_interval(secs => w.win)
               AND j.state::text = ANY(string_to_array(w.states, ','))
             ORDER BY j.created_at DESC
             LIMIT 1)) AS holder
        FROM unnest(p_keys, p_windows, p_states) AS w(key, win, states)
    ) h
    WHERE h.holder IS NOT NULL;
END $$;
