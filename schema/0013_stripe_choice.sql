-- pgq_supervisor schema, version 13: a claim of a striped limit (0008) takes a stripe that
-- has room for the batch it wants, starting from its connection's own stripe; the running
-- jobs are indexed by lease (the end of this file).
--
-- 0008 took the first stripe it could lock that had any free slot, starting from a random
-- one. A worker whose batch of 100 ran in one stripe of 125 slots then often landed in
-- another worker's stripe and came back with 25 jobs: a tenth of the claims of the limits
-- benchmark (global_concurrency=1000, 2 procs) were such slivers, each costing a full claim.
-- Now a claim starts at the stripe of its connection (backend pid modulo the stripes), where
-- the connection's previous batch usually ran and whose slots the completion riding on this
-- claim has just freed (succeed_and_claim), so a steady worker keeps to one stripe. Behind a
-- pooler in transaction mode the pid changes from one claim to the next and claims simply
-- start anywhere. It takes the first stripe with room for p_want jobs (or all of its slots
-- free, for a batch bigger than a stripe); near the limit, when none has, the better of the
-- first two that have some room. Every stripe it looked at stays locked until its claim
-- commits, as before.
--
-- claim_pick_limited is redefined only to pass the batch it wants, and with jit = off: with
-- seqscan and bitmapscan off, a plan that found no index would be priced past
-- jit_above_cost, and a JIT compilation costs a claim hundreds of milliseconds.

CREATE FUNCTION limit_take_stripe(p_type text, p_lease uuid, p_want integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    v_space     integer := limit_lock_space();
    v_n         integer;
    v_home      integer;
    v_s         integer;
    v_held      boolean := false;
    v_roomy     integer := 0;  -- stripes seen with a free slot
    v_slots     integer;
    v_free      integer;
    v_live      uuid[];
    v_best      integer;
    v_best_free integer := 0;
    v_best_live uuid[];
BEGIN
    SELECT count(*) INTO v_n FROM type_limit_stripe WHERE type = p_type;
    IF v_n = 0 THEN
        RETURN 0;  -- restriped meanwhile into none
    END IF;
    v_home := pg_backend_pid() % v_n;
    -- rounds 0 .. n-1 look at the stripes it can lock without waiting; round n, only if it
    -- could lock none (every stripe is held by another claim), waits for its own
    FOR k IN 0 .. v_n LOOP
        IF k < v_n THEN
            v_s := (v_home + k) % v_n;
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(v_space, limit_stripe_key(p_type, v_s));
            v_held := true;
        ELSIF v_held THEN
            EXIT;  -- it holds stripes already: waiting for another could deadlock
        ELSE
            -- holding no other lock of the type, and types are taken in order: no deadlock
            v_s := v_home;
            PERFORM pg_advisory_xact_lock(v_space, limit_stripe_key(p_type, v_s));
        END IF;
        -- this statement, after the lock, sees every claim that held the stripe before
        SELECT t.slots, t.slots - l.n, l.live INTO v_slots, v_free, v_live
        FROM type_limit_stripe t,
             LATERAL (SELECT count(*)::int AS n,
                             coalesce(array_agg(DISTINCT j.lease), '{}') AS live
                      FROM job j
                      WHERE j.state = 'running' AND j.type = p_type
                        AND j.lease = ANY(t.leases)) l
        WHERE t.type = p_type AND t.stripe = v_s;
        IF NOT FOUND THEN
            RETURN 0;  -- restriped meanwhile: take nothing this time
        END IF;
        IF v_free > 0 THEN
            v_roomy := v_roomy + 1;
        END IF;
        IF v_free > v_best_free THEN
            v_best := v_s;
            v_best_free := v_free;
            v_best_live := v_live;
        END IF;
        -- room for the batch, or a stripe all free when the batch is bigger than a stripe;
        -- near the limit no stripe has that: the better of two with some room, rather than
        -- every stripe locked by one claim while it looks
        EXIT WHEN v_free >= least(p_want, v_slots) OR v_roomy >= 2;
    END LOOP;
    IF v_best IS NULL THEN
        RETURN 0;  -- no free slot in the stripes it could look at
    END IF;
    -- the lease recorded in its stripe, which forgets the claims whose jobs have all ended
    UPDATE type_limit_stripe SET leases = v_best_live || p_lease
    WHERE type = p_type AND stripe = v_best;
    RETURN v_best_free;
END $$;

-- claim_pick_limited (0008) as it was, but for the batch it passes to limit_take_stripe.
CREATE OR REPLACE FUNCTION claim_pick_limited(p_types text[], p_limit integer, p_lease uuid)
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
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
    v_striped boolean[] := '{}';
    v_slots   integer[] := '{}';  -- a striped type's free slots in the stripe taken
BEGIN
    FOR r IN SELECT l.type, l.global_concurrency, l.key_concurrency,
                    EXISTS (SELECT 1 FROM type_limit_stripe t WHERE t.type = l.type) AS striped
             FROM type_limit l WHERE l.type = ANY(p_types) ORDER BY l.type
    LOOP
        v_limited := v_limited || r.type;
        v_global := v_global || r.global_concurrency;
        v_per_key := v_per_key || r.key_concurrency;
        IF r.striped AND p_lease IS NOT NULL THEN
            v_striped := v_striped || true;
            v_slots := v_slots || limit_take_stripe(r.type, p_lease, p_limit);
        ELSIF r.striped THEN
            -- no lease to record (a direct call): exclude every claim of the type
            PERFORM limit_lock_all(r.type);
            v_striped := v_striped || false;
            v_slots := v_slots || NULL::integer;
        ELSE
            PERFORM pg_advisory_xact_lock(limit_lock_space(), hashtext(r.type));
            v_striped := v_striped || false;
            v_slots := v_slots || NULL::integer;
        END IF;
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
        IF v_striped[i] THEN
            v_cap := least(v_cap, v_slots[i]);
        ELSIF v_global[i] IS NOT NULL AND v_cap > 0 THEN
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

DROP FUNCTION limit_take_stripe(text, uuid);

-- job_running_idx by lease rather than by worker: the running jobs of a lease are what a
-- fenced completion updates and what a stripe counts (it read every running job of every type
-- to count its own: 194 microseconds per claim in a worker's loop, 35 by lease). The running
-- jobs of a worker are looked for when its child exits (a death, a recycle, a kill, the
-- shutdown: release_jobs by worker), now by reading every running job through this index, as
-- the rescue always has: 2 to 4 ms with 10,000 jobs running (measured), once per child exit.
-- Same entries, as many writes: a claim adds one per job either way.
DROP INDEX job_running_idx;
CREATE INDEX job_running_idx ON job (lease) WHERE state = 'running';
