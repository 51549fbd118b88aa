-- pgq_supervisor schema, version 21 (issue 24): fair claims across tenants.
-- `enqueue(..., tenant=T)` tags a job with its tenant. The claims of a type that has tenant
-- jobs go round-robin across its tenants, so one tenant's million pending jobs do not delay
-- another tenant's single job: each claim walks the type's tenants from where the previous
-- claim (of the same cursor stripe) left off, takes a small quota from each in turn (its
-- weight times greatest(1, batch / 20)), and, once round the circle, shares what the batch
-- still wants among the tenants that had more, in proportion to their weights.
--
-- Cost. Jobs without a tenant pay nothing but one probe of fair_cursor per claim (as the
-- pause, limit and rate gates). Tenant jobs are kept out of job_claim_idx (rebuilt below with
-- `tenant IS NULL`) and indexed by (type, tenant, claim order) in job_tenant_idx, so a claim
-- finds the next tenant with a ready job by one index descent (a skip scan) and its oldest
-- jobs by another: at most about 40 descents per claim of 200, whatever the number of tenants
-- (1,000 measured). Delayed tenant jobs that come due, retries and released jobs are taken
-- from job_delayed_idx in claim order, as for jobs without a tenant (not round-robin).
-- Migrating rebuilds job_claim_idx (below): on a big table it takes as long as building that
-- index, with the table locked meanwhile.
ALTER TABLE job ADD COLUMN tenant text;
ALTER TABLE job ADD CONSTRAINT job_tenant_length
    CHECK (tenant IS NULL OR char_length(tenant) BETWEEN 1 AND 200);

-- Cursor stripes of a type with tenant jobs: a claim locks one stripe (SKIP LOCKED, starting
-- from its connection's own) and resumes the walk after the stripe's last served tenant, so
-- claims of the type by several workers run side by side; each stripe goes round every tenant.
-- Made by the first tenant job of a type (job_tenant_type below), never removed: a type that
-- had tenants keeps taking the fair walk (cheap when it finds none).
CREATE TABLE fair_cursor (
    type        text NOT NULL CHECK (char_length(type) BETWEEN 1 AND 100),
    stripe      integer NOT NULL CHECK (stripe BETWEEN 0 AND 7),
    last_tenant text,
    PRIMARY KEY (type, stripe)
);

-- Weights: a tenant with weight w gets w turns' worth of jobs per round (default 1).
CREATE TABLE tenant_weight (
    type       text NOT NULL CHECK (char_length(type) BETWEEN 1 AND 100),
    tenant     text NOT NULL CHECK (char_length(tenant) BETWEEN 1 AND 200),
    weight     integer NOT NULL CHECK (weight BETWEEN 1 AND 1000),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (type, tenant)
);

-- Only tenant jobs fire it (WHEN): one probe of fair_cursor per tenant job inserted.
CREATE FUNCTION job_tenant_type() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM fair_cursor c WHERE c.type = NEW.type AND c.stripe = 0) THEN
        INSERT INTO fair_cursor (type, stripe)
        SELECT NEW.type, s FROM generate_series(0, 7) s
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER job_tenant_type AFTER INSERT ON job FOR EACH ROW
    WHEN (new.tenant IS NOT NULL)
    EXECUTE FUNCTION job_tenant_type();

DROP INDEX job_claim_idx;
CREATE INDEX job_claim_idx ON job (priority DESC, created_at, id)
    WHERE state = 'pending' AND waiting_on = 0 AND start_at <= created_at AND tenant IS NULL;
CREATE INDEX job_tenant_idx ON job (type, tenant, priority DESC, created_at, id)
    WHERE state = 'pending' AND waiting_on = 0 AND start_at <= created_at AND tenant IS NOT NULL;

-- The round-robin walk of one type's tenant jobs (ready when inserted), at most p_limit rows,
-- locked, in the order taken.
CREATE FUNCTION claim_pick_fair(p_type text, p_limit integer) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
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
    IF v_start IS NOT NULL THEN
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

-- claim_pick_rows (0009) with the jobs due when inserted split in two: those without a tenant
-- walked on job_claim_idx as before, those of the types with tenants (one probe of
-- fair_cursor) by the fair walk. Both picks are interleaved one for one (each in its own
-- order) when there are more than p_limit: a plain backlog neither starves the tenants nor
-- is starved by them.
CREATE OR REPLACE FUNCTION claim_pick_rows(p_types text[], p_limit integer) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_due   uuid[];
    v_ready uuid[];
    v_fair  uuid[] := '{}';
    v_tenanted text[];
BEGIN
    v_due := ARRAY(
        SELECT p.id
        FROM job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at > p.created_at
          AND p.start_at <= now() AND p.type = ANY(p_types)
        ORDER BY p.priority DESC, p.created_at, p.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED);
    v_ready := ARRAY(
        SELECT p.id
        FROM job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= p.created_at
          AND p.tenant IS NULL AND p.start_at <= now() AND p.type = ANY(p_types)
        ORDER BY p.priority DESC, p.created_at, p.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED);
    IF cardinality(v_due) > 0 THEN
        v_ready := ARRAY(
            SELECT j.id FROM job j WHERE j.id = ANY(v_due || v_ready)
            ORDER BY j.priority DESC, j.created_at, j.id
            LIMIT p_limit);
    END IF;
    v_tenanted := ARRAY(SELECT c.type FROM fair_cursor c
                        WHERE c.type = ANY(p_types) AND c.stripe = 0);
    IF cardinality(v_tenanted) = 0 THEN
        RETURN v_ready;
    END IF;
    FOR i IN 1 .. cardinality(v_tenanted) LOOP
        EXIT WHEN cardinality(v_fair) >= p_limit;
        v_fair := v_fair || claim_pick_fair(v_tenanted[i], p_limit - cardinality(v_fair));
    END LOOP;
    IF cardinality(v_ready) = 0 THEN
        RETURN v_fair;
    END IF;
    RETURN ARRAY(
        SELECT x.id
        FROM (SELECT u.id, u.n, 0 AS s FROM unnest(v_ready) WITH ORDINALITY AS u(id, n)
              UNION ALL
              SELECT f.id, f.n, 1 AS s FROM unnest(v_fair) WITH ORDINALITY AS f(id, n)) x
        ORDER BY x.n, x.s
        LIMIT p_limit);
END $$;

-- claim_pick_keyed (0009) walked every ready job on job_claim_idx, which no longer holds the
-- tenant jobs: after the merged walk, a type with tenants goes on through job_tenant_idx in
-- its order (tenant by tenant, not round-robin), with the same per-key checks.
CREATE OR REPLACE FUNCTION claim_pick_keyed(p_type text, p_cap integer, p_per_key integer)
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    r       record;  -- the next job due when inserted (c_ready), if v_r
    d       record;  -- the next delayed job come due (c_due), if v_d
    v_r     boolean;
    v_d     boolean;
    v_id    uuid;
    v_key   text;
    v_ok    boolean;
    v_taken jsonb;  -- key -> jobs of that key running, or taken by this claim
    v_ids   uuid[] := '{}';
    c_ready CURSOR FOR
        SELECT p.id, p.concurrency_key AS key, p.priority, p.created_at
        FROM job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= p.created_at
          AND p.tenant IS NULL AND p.start_at <= now() AND p.type = p_type
        ORDER BY p.priority DESC, p.created_at, p.id;
    c_due CURSOR FOR
        SELECT p.id, p.concurrency_key AS key, p.priority, p.created_at
        FROM job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at > p.created_at
          AND p.start_at <= now() AND p.type = p_type
        ORDER BY p.priority DESC, p.created_at, p.id;
    c_tenant CURSOR FOR
        SELECT p.id, p.concurrency_key AS key
        FROM job p
        WHERE p.type = p_type AND p.state = 'pending' AND p.waiting_on = 0
          AND p.start_at <= p.created_at AND p.tenant IS NOT NULL
        ORDER BY p.type, p.tenant, p.priority DESC, p.created_at, p.id;
BEGIN
    SELECT coalesce(jsonb_object_agg(k.key, k.n), '{}') INTO v_taken
    FROM (SELECT j.concurrency_key AS key, count(*) AS n FROM job j
          WHERE j.state = 'running' AND j.type = p_type AND j.concurrency_key IS NOT NULL
          GROUP BY j.concurrency_key) k;
    OPEN c_ready;
    OPEN c_due;
    FETCH c_ready INTO r;
    v_r := FOUND;
    FETCH c_due INTO d;
    v_d := FOUND;
    -- the two walks merged in claim order
    WHILE v_r OR v_d LOOP
        IF v_d AND (NOT v_r OR ROW(-d.priority, d.created_at, d.id)
                                < ROW(-r.priority, r.created_at, r.id)) THEN
            v_id := d.id;
            v_key := d.key;
            FETCH c_due INTO d;
            v_d := FOUND;
        ELSE
            v_id := r.id;
            v_key := r.key;
            FETCH c_ready INTO r;
            v_r := FOUND;
        END IF;
        SELECT t.p_taken, t.taken INTO v_taken, v_ok
        FROM claim_pick_keyed_take(v_id, v_key, p_per_key, v_taken) t;
        IF v_ok THEN
            v_ids := v_ids || v_id;
            EXIT WHEN cardinality(v_ids) >= p_cap;
        END IF;
    END LOOP;
    IF cardinality(v_ids) < p_cap
       AND EXISTS (SELECT 1 FROM fair_cursor c WHERE c.type = p_type AND c.stripe = 0) THEN
        FOR tj IN c_tenant LOOP
            SELECT t.p_taken, t.taken INTO v_taken, v_ok
            FROM claim_pick_keyed_take(tj.id, tj.key, p_per_key, v_taken) t;
            IF v_ok THEN
                v_ids := v_ids || tj.id;
                EXIT WHEN cardinality(v_ids) >= p_cap;
            END IF;
        END LOOP;
    END IF;
    RETURN v_ids;
END $$;

-- depth() (0014) counted the jobs due when inserted on job_claim_idx, which no longer holds
-- the tenant jobs: they are counted on job_tenant_idx.
CREATE OR REPLACE FUNCTION depth(VARIADIC p_types text[] DEFAULT NULL) RETURNS integer
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
                  AND j.tenant IS NULL
                  AND j.start_at <= now() AND (p_types IS NULL OR j.type = ANY(p_types))
                UNION ALL
                SELECT j.type FROM job j
                WHERE j.state = 'pending' AND j.waiting_on = 0 AND j.start_at <= j.created_at
                  AND j.tenant IS NOT NULL
                  AND j.start_at <= now() AND (p_types IS NULL OR j.type = ANY(p_types))
                UNION ALL
                SELECT j.type FROM job j
                WHERE j.state = 'pending' AND j.waiting_on = 0 AND j.start_at > j.created_at
                  AND j.start_at <= now() AND (p_types IS NULL OR j.type = ANY(p_types))) k
          GROUP BY k.type) r
    WHERE NOT EXISTS (SELECT 1 FROM type_pause p WHERE p.type = r.type)
$$;
