-- pgq_supervisor schema, version 14: the queue depth an autoscaler sizes workers for, defined
-- once, here. `python -m pgq_supervisor depth`, `pgq.queue_depth`, the `pgq_queue_depth` gauge
-- and KEDA's PostgreSQL trigger (deploy/k8s/scaledobject.yaml: `SELECT pgq.depth()`) all call
-- it; the manifest used to carry a copy of the query that had fallen behind (it counted jobs
-- waiting on dependencies).
--
-- depth() counts the jobs a claim could take now: pending, due, not waiting on dependencies,
-- and of a type that is not paused (no worker claims those: scaling up for a paused backlog
-- would hold the Deployment at its maximum for nothing). A rated type counts at most the
-- starts its window allows now, a type with a global_concurrency at most its free slots (more
-- workers would only wait for the rate or the limit). A per-key limit is not applied: that
-- would group the type's backlog by key. Running and delayed jobs are not counted.
-- `depth('a', 'b')` counts those types only (a Deployment that sets PGQ_TYPES); `depth()` or
-- `depth(VARIADIC NULL)` every type.
-- The ready jobs are counted in two parts, one per partial index that holds them (0009): those
-- due when inserted (job_claim_idx) and delayed ones come due (job_delayed_idx); a single
-- `start_at <= now()` implies neither index's predicate and would scan the table.
CREATE FUNCTION depth(VARIADIC p_types text[] DEFAULT NULL) RETURNS integer
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT coalesce(sum(least(
               r.n,
               (SELECT (rate_window(t.max_starts, t.period, t.buckets, t.counts)).free
                FROM type_rate t WHERE t.type = r.type),
               -- no rate, no global limit: NULL, which least() ignores
               (SELECT greatest(0, l.global_concurrency
                                   - (SELECT count(*) FROM job x
                                      WHERE x.state = 'running' AND x.type = l.type))
                FROM type_limit l WHERE l.type = r.type AND l.global_concurrency IS NOT NULL))), 0)::integer
    FROM (SELECT k.type, count(*) AS n
          FROM (SELECT j.type FROM job j
                WHERE j.state = 'pending' AND j.waiting_on = 0 AND j.start_at <= j.created_at
                  AND j.start_at <= now() AND (p_types IS NULL OR j.type = ANY(p_types))
                UNION ALL
                SELECT j.type FROM job j
                WHERE j.state = 'pending' AND j.waiting_on = 0 AND j.start_at > j.created_at
                  AND j.start_at <= now() AND (p_types IS NULL OR j.type = ANY(p_types))) k
          GROUP BY k.type) r
    WHERE NOT EXISTS (SELECT 1 FROM type_pause p WHERE p.type = r.type)
$$;
