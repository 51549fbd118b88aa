-- pgq_supervisor schema, version 18 (issue 24): dedup windows. `enqueue(..., unique_key=K,
-- unique_for=W)` returns the id of the job that holds K instead of inserting: an unfinished
-- one (as job_unique_key_idx has always enforced), or, within W of its enqueue, a finished
-- one in the states the caller counts (succeeded, by default).
--
-- A finished job no longer holds job_unique_key_idx, so the database cannot refuse the insert
-- by a constraint: unique_holders serialises the producers of one key on a transaction-scoped
-- advisory lock, then looks (each statement of a volatile plpgsql function takes a new
-- snapshot, so a producer that waited for the lock sees the job its predecessor committed).
-- Producers that do not give unique_for never call it and pay nothing; the index below holds
-- only finished jobs that have a unique_key.
CREATE INDEX job_unique_finished_idx ON job (unique_key, created_at DESC)
    WHERE unique_key IS NOT NULL AND stopped_at IS NOT NULL;

-- For each (key, window in seconds, states as 'succeeded,failed'): the job that holds the key
-- now: the unfinished one, else the newest finished one created within the window in one of
-- the states. Keys without a holder have no row. Locks every key first, in key order (two
-- batches that share keys cannot deadlock); the locks are held until the caller's transaction
-- ends, so its insert of the keys found free is seen by every producer that waited.
-- Under REPEATABLE READ or SERIALIZABLE the caller's snapshot predates the lock: a job a
-- concurrent producer committed meanwhile is not seen (use READ COMMITTED, the default).
CREATE FUNCTION unique_holders(p_keys text[], p_windows double precision[], p_states text[])
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
            (SELECT j.id FROM job j
             WHERE j.unique_key = w.key AND j.state IN ('pending', 'running')),
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
