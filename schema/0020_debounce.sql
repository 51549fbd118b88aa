-- pgq_supervisor schema, version 20 (issue 24): debounce. `enqueue(..., unique_key=K,
-- replace=True)` replaces the payload, start_at and priority of the pending job that holds K
-- instead of being ignored. A running holder is never touched: the new job is dropped (its id
-- is the running job's), or waits behind it (`replace_running="wait"`, the default): it is
-- inserted depending on the running job (it runs once that one ends, however it ends) and
-- holds K in `debounce_key`, since job_unique_key_idx lets one unfinished job hold
-- `unique_key`. Later debounced enqueues of K replace the payload of the job that waits.
ALTER TABLE job ADD COLUMN debounce_key text;
CREATE INDEX job_debounce_key_idx ON job (debounce_key)
    WHERE debounce_key IS NOT NULL AND state IN ('pending', 'running');

-- Under the key's lock (the advisory lock of unique_holders, schema/0019: windowed and
-- debounced producers of one key serialise on it, held to the end of the caller's
-- transaction), the job that holds K now:
--   ('replaced', id): a pending holder (the one waiting behind a running job first) now has
--     the new payload, start_at and priority;
--   ('running', id): the holder is running (untouched): the caller drops its job or makes it
--     wait behind this one;
--   no row: nobody holds K, insert the job.
-- The update re-checks `state = 'pending'` after waiting for a claim that holds the row: a job
-- claimed meanwhile is found running by the next statement (its own, newer snapshot).
CREATE FUNCTION debounce_holder(p_key text, p_payload jsonb, p_start_at timestamptz,
                                p_priority integer)
RETURNS TABLE(action text, id uuid)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    found_id uuid;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(current_schema() || ':unique:' || p_key, 0));
    UPDATE job j SET payload = p_payload, start_at = coalesce(p_start_at, now()),
                     priority = p_priority, updated_at = now()
    WHERE j.id = coalesce(
            (SELECT x.id FROM job x
             WHERE x.debounce_key = p_key AND x.state = 'pending' LIMIT 1),
            (SELECT x.id FROM job x WHERE x.unique_key = p_key AND x.state = 'pending'))
      AND j.state = 'pending'
    RETURNING j.id INTO found_id;
    IF found_id IS NOT NULL THEN
        action := 'replaced'; id := found_id; RETURN NEXT; RETURN;
    END IF;
    SELECT x.id INTO found_id FROM job x
    WHERE x.state = 'running' AND (x.unique_key = p_key OR x.debounce_key = p_key)
    ORDER BY x.created_at DESC LIMIT 1;
    IF found_id IS NOT NULL THEN
        action := 'running'; id := found_id; RETURN NEXT;
    END IF;
END $$;
