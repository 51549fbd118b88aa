-- pgq_supervisor schema, version 7: pausing a job type, and limiting its rate of starts.
-- Both are enforced in the claim, by the database, whatever the number of supervisors.
--
-- The claim statements call claim_pick; from here on it is a gate in front of the row picking:
--   claim_pick       paused types are dropped; types with a rate go through claim_pick_rated
--   claim_pick_rated locks the rate rows, picks at most each type's free starts, counts them
--   claim_pick_rows  claim_pick as it was before this migration: renamed, so its body, its
--                    pinned plan and any filter an earlier migration put in it carry over
-- A type neither paused nor rated costs two probes of tiny tables per claim (not per row).

ALTER FUNCTION claim_pick(text[], integer) RENAME TO claim_pick_rows;

-- A paused type is not claimed by any supervisor; its running jobs finish. Resuming deletes the
-- row and notifies pgq_job_available with the type.
CREATE TABLE type_pause (
    type      text PRIMARY KEY CHECK (char_length(type) BETWEEN 1 AND 100),
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text,
    reason    text
);

-- One row per rate-limited type, written by each supervisor at start-up from its handlers
-- (the last one started wins). The window slides: `period` is cut into 20 buckets of starts,
-- bucket k covering [k, k+1) * period / 20 seconds of the database clock (the clock of
-- started_at, since claims count their starts at now()), and a claim at bucket B may start
-- max_starts minus what buckets B-20..B hold. Those 21 buckets cover every window of length
-- `period` that ends in bucket B, so no such window (by started_at) holds more than
-- max_starts starts; the price is that a full window frees up to period / 20 later than a
-- sliding log would (at worst max_starts starts per 1.05 x period). A claim whose now() falls
-- in an earlier bucket than one already counted (its transaction began before a claim that
-- committed first) starts nothing of the type: counts only ever go to the newest bucket.
CREATE TABLE type_rate (
    type       text PRIMARY KEY CHECK (char_length(type) BETWEEN 1 AND 100),
    max_starts integer NOT NULL CHECK (max_starts > 0),
    period     double precision NOT NULL CHECK (period > 0),
    buckets    bigint[] NOT NULL DEFAULT '{}',   -- bucket numbers, ascending, none empty
    counts     integer[] NOT NULL DEFAULT '{}',  -- starts counted in each
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The bucket now() falls in, for a window of `p_period` seconds.
CREATE FUNCTION rate_bucket(p_period double precision) RETURNS bigint
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT floor(extract(epoch FROM now())::float8 * 20 / p_period)::bigint
$$;

-- A rate row's window at now(): its bucket, the starts it may take now, and in how many
-- seconds a start frees up when it may take none (0 when it may take some).
CREATE FUNCTION rate_window(p_max integer, p_period double precision, p_buckets bigint[],
                            p_counts integer[], OUT bucket bigint, OUT free integer,
                            OUT free_in double precision)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT w.bucket,
           CASE WHEN w.latest > w.bucket THEN 0 ELSE greatest(0, p_max - w.used)::int END,
           CASE WHEN w.latest > w.bucket THEN 0.0
                WHEN w.used < p_max THEN 0.0
                ELSE greatest(0.0, (w.oldest + 21) * p_period / 20
                                   - extract(epoch FROM now())::float8) END
    FROM (SELECT b.bucket,
                 coalesce(sum(k.c) FILTER (WHERE k.b >= b.bucket - 20), 0) AS used,
                 min(k.b) FILTER (WHERE k.b >= b.bucket - 20) AS oldest,
                 max(k.b) AS latest
          FROM (SELECT rate_bucket(p_period) AS bucket) b
          LEFT JOIN unnest(p_buckets, p_counts) AS k(b, c) ON true
          GROUP BY b.bucket) w
$$;

-- claim_pick for types of which some have a rate. Unrated types are picked as usual; each
-- rated type at most its free starts; the union is cut back to p_limit in claim order (rows
-- cut stay pending, locked until this transaction ends) and what is taken is counted.
CREATE FUNCTION claim_pick_rated(p_types text[], p_limit integer) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    r       record;
    v_rated text[] := '{}';
    v_free  integer[] := '{}';
    v_free_types text[];
    v_ids   uuid[] := '{}';
BEGIN
    -- In type order, so claims of overlapping types cannot deadlock. A second claim of a type
    -- waits here until the first commits, then reads the row as the first left it.
    FOR r IN SELECT t.type, (rate_window(t.max_starts, t.period, t.buckets, t.counts)).free
             FROM type_rate t WHERE t.type = ANY(p_types) ORDER BY t.type FOR UPDATE
    LOOP
        v_rated := v_rated || r.type;
        v_free := v_free || r.free;
    END LOOP;
    v_free_types := ARRAY(SELECT unnest(p_types) EXCEPT SELECT unnest(v_rated));
    -- never pick with no types: the walk would read every pending row to find none
    IF cardinality(v_free_types) > 0 THEN
        v_ids := claim_pick_rows(v_free_types, p_limit);
    END IF;
    FOR i IN 1 .. cardinality(v_rated) LOOP
        IF v_free[i] > 0 THEN
            v_ids := v_ids || claim_pick_rows(ARRAY[v_rated[i]], least(v_free[i], p_limit));
        END IF;
    END LOOP;
    IF cardinality(v_ids) > p_limit THEN
        v_ids := ARRAY(SELECT j.id FROM job j WHERE j.id = ANY(v_ids)
                       ORDER BY j.priority DESC, j.created_at, j.id LIMIT p_limit);
    END IF;
    FOR r IN SELECT j.type, count(*)::int AS n FROM job j
             WHERE j.id = ANY(v_ids) AND j.type = ANY(v_rated) GROUP BY j.type
    LOOP
        UPDATE type_rate t
        SET (buckets, counts) = (
                SELECT coalesce(array_agg(w.b ORDER BY w.b), '{}'),
                       coalesce(array_agg(w.c ORDER BY w.b), '{}')
                FROM (SELECT u.b, sum(u.c)::int AS c
                      FROM (SELECT k.b, k.c FROM unnest(t.buckets, t.counts) AS k(b, c)
                            WHERE k.b >= rate_bucket(t.period) - 20
                            UNION ALL
                            SELECT rate_bucket(t.period), r.n) u
                      GROUP BY u.b) w),
            updated_at = now()
        WHERE t.type = r.type;
    END LOOP;
    RETURN v_ids;
END $$;

-- The entry the claim statements call (see the top of this file).
CREATE FUNCTION claim_pick(p_types text[], p_limit integer) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
BEGIN
    -- pauses: a paused type is not claimed
    IF EXISTS (SELECT 1 FROM type_pause WHERE type = ANY(p_types)) THEN
        p_types := ARRAY(SELECT t FROM unnest(p_types) AS t
                         WHERE NOT EXISTS (SELECT 1 FROM type_pause p WHERE p.type = t));
        IF cardinality(p_types) = 0 THEN
            RETURN '{}';  -- picking with no types would read every pending row
        END IF;
    END IF;
    -- rates: a rated type starts no more than its window has free
    IF EXISTS (SELECT 1 FROM type_rate WHERE type = ANY(p_types)) THEN
        RETURN claim_pick_rated(p_types, p_limit);
    END IF;
    RETURN claim_pick_rows(p_types, p_limit);
END $$;
