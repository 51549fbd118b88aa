-- pgq_supervisor schema, version 23 (issue 24): a cheaper fair claim.
-- claim_pick_fair (0021) walked, after the tenants that sort after its stripe's last one, those
-- before it from the type's first, by a forward descent of job_tenant_idx. When the stripe's
-- tenant is the first and the only one with a backlog (one big tenant, the common case), that
-- descent crossed the index entries of every job of it claimed since the last vacuum (the
-- oldest: claims take them first) before it found none: a second walk of them per claim,
-- beside the one the tenant's own take makes (as the plain claim's on job_claim_idx). Now one
-- backward descent from the stripe's tenant first tells whether any tenant sorts before it;
-- the order of the turns is unchanged. And its statements keep one generic plan each
-- (plan_cache_mode): the plans are pinned by the enable_* settings anyway, and planning them
-- again with each call's values (custom plans) cost about a fifth of the pick (a pick of 50
-- from one tenant's backlog, 75,000 jobs into its drain: 0.62 to 0.67 ms at best, against
-- 0.83 to 0.90 ms with custom plans, on a busy 2-core machine).

CREATE OR REPLACE FUNCTION claim_pick_fair(p_type text, p_limit integer) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_quantum integer := greatest(1, p_limit / 20);
    v_max     integer := 2 * (p_limit / greatest(1, p_limit / 20)) + 2;  -- tenants per claim
    v_stripe  integer;
    v_start   text;
    v_cur     text;
    v_next    text;
    v_last    text;
    v_order   text[] := '{}';    -- the tenants to visit this round, in turn
    v_weight  integer;
    v_quota   integer;
    v_took    uuid[];
    v_ids     uuid[] := '{}';
    v_more    text[] := '{}';     -- tenants that gave their whole quota: they may have more
    v_more_w  integer[] := '{}';
    v_sum_w   integer := 0;
    v_tenants text[];
    v_weights integer[];
    v_total   integer;
    v_need    integer;
    v_served  integer := 0;      -- tenants that gave jobs in the first round
    v_short   boolean := false;  -- one of them gave its last ones
BEGIN
    SELECT c.stripe, c.last_tenant INTO v_stripe, v_start
    FROM fair_cursor c
    WHERE c.type = p_type
    ORDER BY (c.stripe + 8 - pg_backend_pid() % 8) % 8
    LIMIT 1
    FOR UPDATE SKIP LOCKED;
    -- every stripe held by another claim: walk from the start without a cursor
    -- The round: the tenants after the stripe's last one, then from the first up to it, and
    -- that one last. Each found by one descent of job_tenant_idx bounded on both sides, so
    -- none reads the entries of a tenant's jobs claimed and not vacuumed yet.
    v_cur := v_start;
    LOOP
        EXIT WHEN cardinality(v_order) >= v_max;
        IF v_cur IS NULL THEN
            v_next := (SELECT j.tenant FROM job j
                       WHERE j.type = p_type AND j.state = 'pending' AND j.waiting_on = 0
                         AND j.start_at <= j.created_at AND j.tenant IS NOT NULL
                       ORDER BY j.tenant LIMIT 1);
        ELSE
            v_next := (SELECT j.tenant FROM job j
                       WHERE j.type = p_type AND j.state = 'pending' AND j.waiting_on = 0
                         AND j.start_at <= j.created_at AND j.tenant IS NOT NULL
                         AND j.tenant > v_cur
                       ORDER BY j.tenant LIMIT 1);
        END IF;
        EXIT WHEN v_next IS NULL;
        v_order := v_order || v_next;
        v_cur := v_next;
    END LOOP;
    -- The wrap-around (below): only if some tenant sorts before the stripe's, which one
    -- backward descent from it tells. It lands on the newest jobs of the tenant before (alive:
    -- claims take the oldest); a forward walk from the type's start, as in 0021, crossed first
    -- the entries of the first tenant's claimed jobs not vacuumed yet (every claim, when that
    -- tenant is the big one and the only one).
    IF v_start IS NOT NULL
       AND cardinality(v_order) < v_max
       AND (SELECT j.tenant FROM job j
            WHERE j.type = p_type AND j.state = 'pending' AND j.waiting_on = 0
              AND j.start_at <= j.created_at AND j.tenant IS NOT NULL
              AND j.tenant < v_start
            ORDER BY j.tenant DESC LIMIT 1) IS NULL THEN
        v_order := v_order || v_start;  -- its take finds out whether it has jobs left
    ELSIF v_start IS NOT NULL THEN
        v_cur := NULL;
        LOOP
            EXIT WHEN cardinality(v_order) >= v_max;
            IF v_cur IS NULL THEN
                v_next := (SELECT j.tenant FROM job j
                           WHERE j.type = p_type AND j.state = 'pending' AND j.waiting_on = 0
                             AND j.start_at <= j.created_at AND j.tenant IS NOT NULL
                             AND j.tenant < v_start
                           ORDER BY j.tenant LIMIT 1);
            ELSE
                v_next := (SELECT j.tenant FROM job j
                           WHERE j.type = p_type AND j.state = 'pending' AND j.waiting_on = 0
                             AND j.start_at <= j.created_at AND j.tenant IS NOT NULL
                             AND j.tenant > v_cur AND j.tenant < v_start
                           ORDER BY j.tenant LIMIT 1);
            END IF;
            EXIT WHEN v_next IS NULL;
            v_order := v_order || v_next;
            v_cur := v_next;
        END LOOP;
        IF cardinality(v_order) < v_max THEN
            v_order := v_order || v_start;  -- its take finds out whether it has jobs left
        END IF;
    END IF;
    -- one tenant: the whole batch is its own, in one take
    IF cardinality(v_order) = 1 THEN
        v_quantum := p_limit;
    END IF;
    FOR i IN 1 .. cardinality(v_order) LOOP
        EXIT WHEN cardinality(v_ids) >= p_limit;
        v_next := v_order[i];
        v_weight := coalesce((SELECT w.weight FROM tenant_weight w
                              WHERE w.type = p_type AND w.tenant = v_next), 1);
        v_quota := least(v_weight * v_quantum, p_limit - cardinality(v_ids));
        v_took := ARRAY(SELECT j.id FROM job j
                        WHERE j.type = p_type AND j.tenant = v_next AND j.state = 'pending'
                          AND j.waiting_on = 0 AND j.start_at <= j.created_at
                        ORDER BY j.priority DESC, j.created_at, j.id
                        LIMIT v_quota
                        FOR UPDATE SKIP LOCKED);
        IF cardinality(v_took) > 0 THEN
            v_ids := v_ids || v_took;
            v_last := v_next;
            v_served := v_served + 1;
            v_short := v_short OR cardinality(v_took) < v_quota;
        END IF;
        IF cardinality(v_took) = v_weight * v_quantum THEN
            v_more := v_more || v_next;
            v_more_w := v_more_w || v_weight;
            v_sum_w := v_sum_w + v_weight;
        END IF;
    END LOOP;
    -- few tenants had more than a quota: the rest of the batch is theirs, by weight; one that
    -- runs out drops from the next share-out (each one ends with a tenant fewer, or the batch).
    -- Not when the round served a tenant its last jobs beside others: a small batch brings the
    -- next claim, and the next small tenant's turn, sooner (a small tenant's job would wait
    -- behind a full batch of the big ones otherwise).
    v_need := p_limit - cardinality(v_ids);
    IF v_served > 1 AND v_short THEN
        v_need := 0;
    END IF;
    WHILE v_need > 0 AND v_sum_w > 0 LOOP
        v_tenants := v_more;
        v_weights := v_more_w;
        v_more := '{}';
        v_more_w := '{}';
        v_total := v_sum_w;
        v_sum_w := 0;
        FOR i IN 1 .. cardinality(v_tenants) LOOP
            v_quota := least(ceil(v_need::numeric * v_weights[i] / v_total)::integer,
                             p_limit - cardinality(v_ids));
            EXIT WHEN v_quota <= 0;
            v_took := ARRAY(SELECT j.id FROM job j
                            WHERE j.type = p_type AND j.tenant = v_tenants[i]
                              AND j.state = 'pending' AND j.waiting_on = 0
                              AND j.start_at <= j.created_at AND j.id <> ALL(v_ids)
                            ORDER BY j.priority DESC, j.created_at, j.id
                            LIMIT v_quota
                            FOR UPDATE SKIP LOCKED);
            v_ids := v_ids || v_took;
            IF cardinality(v_took) = v_quota THEN
                v_more := v_more || v_tenants[i];
                v_more_w := v_more_w || v_weights[i];
                v_sum_w := v_sum_w + v_weights[i];
            END IF;
        END LOOP;
        v_need := p_limit - cardinality(v_ids);
    END LOOP;
    IF v_stripe IS NOT NULL AND v_last IS NOT NULL THEN
        UPDATE fair_cursor SET last_tenant = v_last WHERE type = p_type AND stripe = v_stripe;
    END IF;
    RETURN v_ids;
END $$;
