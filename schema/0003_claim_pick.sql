-- pgq_supervisor schema, version 3: the claim's row picking, with its plan pinned.
-- Picking must walk job_claim_idx in order and stop after p_limit rows. With stale statistics
-- (a fresh table, or a burst of enqueues after a quiet spell, until autoanalyze catches up)
-- the planner believes few jobs are pending and prefers a bitmap scan of every pending row
-- plus a sort: each claim then reads the whole backlog, and draining N jobs costs O(N^2).
-- The SET clauses make the ordered index walk the only sensible plan whatever the statistics.
CREATE FUNCTION claim_pick(p_types text[], p_limit integer) RETURNS uuid[]
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
        WHERE p.state = 'pending' AND p.start_at <= now() AND p.type = ANY(p_types)
        ORDER BY p.priority DESC, p.created_at, p.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED);
END $$;
