-- pgq_supervisor schema 0008: concurrency limits per job type, enforced in the claim.
--
--   global_concurrency = N   never more than N jobs of the type running, across every supervisor
--   key_concurrency = N      never more than N running jobs of the type with the same
--                            concurrency_key (jobs without a key are limited by the global
--                            limit only); within a key, jobs start in claim order (FIFO)
--
-- The claim gate (claim_pick, 0007) sends a claim that names a limited type through
-- claim_pick_limited, which also applies pauses' and rates' rules (the gate has dropped paused
-- types already). A limited type's claims are serialised by a transaction-level advisory lock
-- (held until the claim commits): under it, a claim counts the type's running jobs (and per
-- key), which every earlier claim has committed, and picks at most what the limit leaves. Jobs
-- held back stay pending, untouched: no attempt, no error. A claim of types none of which is
-- limited costs one more probe of a tiny table (type_limit) and nothing else.

ALTER TABLE job
    ADD COLUMN concurrency_key text,
    ADD CONSTRAINT job_concurrency_key_length
        CHECK (concurrency_key IS NULL OR char_length(concurrency_key) BETWEEN 1 AND 200);

-- One row per limited type, written by each supervisor at start-up from its handlers (the
-- last one started wins), as type_rate.
CREATE TABLE type_limit (
    type               text PRIMARY KEY CHECK (char_length(type) BETWEEN 1 AND 100),
    global_concurrency integer CHECK (global_concurrency > 0),
    key_concurrency    integer CHECK (key_concurrency > 0),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT type_limit_some CHECK (global_concurrency IS NOT NULL OR key_concurrency IS NOT NULL)
);

-- The running jobs of a limited type are counted through job_running_idx (every running job:
-- as many as the workers hold, never the backlog); no new index, so claims and completions of
-- unlimited types write nothing more.

-- The pending jobs of `p_type` a key-limited claim may take, at most p_cap, in claim order:
-- a job whose key already has p_per_key running (or taken here) is passed over, and so is
-- every later job of that key (FIFO within a key). A job another transaction holds locked (a
-- cancel, a reset) is skipped and its key with it, for the same reason. Walks job_claim_idx
-- in order (the plan is pinned as claim_pick_rows's) and reads past the jobs of full keys:
-- its cost grows with the backlog of keys at their limit ahead of the first free one.
CREATE FUNCTION claim_pick_keyed(p_type text, p_cap integer, p_per_key integer) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    r       record;
    v_taken jsonb;  -- key -> jobs of that key running, or taken by this claim
    v_n     integer;
    v_ids   uuid[] := '{}';
BEGIN
    SELECT coalesce(jsonb_object_agg(k.key, k.n), '{}') INTO v_taken
    FROM (SELECT j.concurrency_key AS key, count(*) AS n FROM job j
          WHERE j.state = 'running' AND j.type = p_type AND j.concurrency_key IS NOT NULL
          GROUP BY j.concurrency_key) k;
    FOR r IN
        SELECT p.id, p.concurrency_key AS key
        FROM job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= now()
          AND p.type = p_type
        ORDER BY p.priority DESC, p.created_at, p.id
    LOOP
        v_n := 0;
        IF r.key IS NOT NULL THEN
            v_n := coalesce((v_taken ->> r.key)::int, 0);
            CONTINUE WHEN v_n >= p_per_key;
        END IF;
        PERFORM 1 FROM job j WHERE j.id = r.id AND j.state = 'pending' AND j.waiting_on = 0
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            IF r.key IS NOT NULL THEN
                v_taken := jsonb_set(v_taken, ARRAY[r.key], to_jsonb(p_per_key));
            END IF;
            CONTINUE;
        END IF;
        v_ids := v_ids || r.id;
        IF r.key IS NOT NULL THEN
            v_taken := jsonb_set(v_taken, ARRAY[r.key], to_jsonb(v_n + 1));
        END IF;
        EXIT WHEN cardinality(v_ids) >= p_cap;
    END LOOP;
    RETURN v_ids;
END $$;

-- claim_pick for types of which some are limited (pauses are dropped by the gate already).
-- Locks first, always in one order, so overlapping claims cannot deadlock: the advisory lock
-- of each limited type in type order, then the rate rows in type order (as claim_pick_rated).
-- Then types neither limited nor rated are picked as usual, a rated one at most its free
-- starts, a limited one at most what its limit (and its rate) leaves; the union is cut back to
-- p_limit in claim order (rows cut stay pending, locked until this transaction ends) and the
-- rated types' starts are counted, as claim_pick_rated does.
CREATE FUNCTION claim_pick_limited(p_types text[], p_limit integer) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    r         record;
    v_limited text[] := '{}';
    v_global  integer[] := '{}';
    v_per_key integer[] := '{}';
    v_rated   text[] := '{}';
    v_free    integer[] := '{}';
    v_plain   text[];
    v_ids     uuid[] := '{}';
    v_cap     integer;
    v_running integer;
    v_at      integer;
BEGIN
    FOR r IN SELECT l.type, l.global_concurrency, l.key_concurrency
             FROM type_limit l WHERE l.type = ANY(p_types) ORDER BY l.type
    LOOP
        -- two int4 keys: this schema's limits, then the type (a hash collision only
        -- serialises two types' claims, it never lets a limit through)
        PERFORM pg_advisory_xact_lock(hashtext('pgq_limit:' || current_schema()),
                                      hashtext(r.type));
        v_limited := v_limited || r.type;
        v_global := v_global || r.global_concurrency;
        v_per_key := v_per_key || r.key_concurrency;
    END LOOP;
    FOR r IN SELECT t.type, (rate_window(t.max_starts, t.period, t.buckets, t.counts)).free
             FROM type_rate t WHERE t.type = ANY(p_types) ORDER BY t.type FOR UPDATE
    LOOP
        v_rated := v_rated || r.type;
        v_free := v_free || r.free;
    END LOOP;
    v_plain := ARRAY(SELECT unnest(p_types) EXCEPT SELECT unnest(v_limited)
                     EXCEPT SELECT unnest(v_rated));
    -- never pick with no types: the walk would read every pending row to find none
    IF cardinality(v_plain) > 0 THEN
        v_ids := claim_pick_rows(v_plain, p_limit);
    END IF;
    FOR i IN 1 .. cardinality(v_rated) LOOP
        IF v_rated[i] <> ALL(v_limited) AND v_free[i] > 0 THEN
            v_ids := v_ids || claim_pick_rows(ARRAY[v_rated[i]], least(v_free[i], p_limit));
        END IF;
    END LOOP;
    FOR i IN 1 .. cardinality(v_limited) LOOP
        v_cap := p_limit;
        v_at := array_position(v_rated, v_limited[i]);
        IF v_at IS NOT NULL THEN
            v_cap := least(v_cap, v_free[v_at]);
        END IF;
        IF v_global[i] IS NOT NULL AND v_cap > 0 THEN
            -- this statement's snapshot is taken after the lock: it sees every earlier claim
            SELECT count(*) INTO v_running FROM job j
            WHERE j.state = 'running' AND j.type = v_limited[i];
            v_cap := least(v_cap, v_global[i] - v_running);
        END IF;
        IF v_cap > 0 THEN
            IF v_per_key[i] IS NULL THEN
                v_ids := v_ids || claim_pick_rows(ARRAY[v_limited[i]], v_cap);
            ELSE
                v_ids := v_ids || claim_pick_keyed(v_limited[i], v_cap, v_per_key[i]);
            END IF;
        END IF;
    END LOOP;
    IF cardinality(v_ids) > p_limit THEN
        v_ids := ARRAY(SELECT j.id FROM job j WHERE j.id = ANY(v_ids)
                       ORDER BY j.priority DESC, j.created_at, j.id LIMIT p_limit);
    END IF;
    IF cardinality(v_rated) > 0 THEN
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
    END IF;
    RETURN v_ids;
END $$;

-- The gate (0007) with limits in front of rates: a claim naming a limited type goes through
-- claim_pick_limited, which applies the rates too.
CREATE OR REPLACE FUNCTION claim_pick(p_types text[], p_limit integer) RETURNS uuid[]
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
    -- limits: a limited type starts no more than its limits leave (rates applied there too)
    IF EXISTS (SELECT 1 FROM type_limit WHERE type = ANY(p_types)) THEN
        RETURN claim_pick_limited(p_types, p_limit);
    END IF;
    -- rates: a rated type starts no more than its window has free
    IF EXISTS (SELECT 1 FROM type_rate WHERE type = ANY(p_types)) THEN
        RETURN claim_pick_rated(p_types, p_limit);
    END IF;
    RETURN claim_pick_rows(p_types, p_limit);
END $$;
