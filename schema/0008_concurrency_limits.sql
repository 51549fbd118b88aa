-- pgq_supervisor schema 0008: concurrency limits per job type, enforced in the claim.
--
--   global_concurrency = N   never more than N jobs of the type running, across every supervisor
--   key_concurrency = N      never more than N running jobs of the type with the same
--                            concurrency_key (jobs without a key are limited by the global
--                            limit only); within a key, jobs start in claim order (FIFO)
--
-- The claim gate (claim_pick, 0007) sends a claim that names a limited type through
-- claim_pick_limited, which also applies the rates (the gate has dropped paused types
-- already). A limited type's claims are serialised by a transaction-level advisory lock (held
-- until the claim commits): under it, a claim counts the type's running jobs (and per key),
-- which every earlier claim has committed, and picks at most what the limit leaves. Jobs held
-- back stay pending, untouched: no attempt, no error. A claim of types none of which is
-- limited costs one more probe of a tiny table (type_limit) and nothing else.
--
-- Stripes. A large global limit (>= 200, no key limit) is cut into stripes (up to 8, see
-- type_limit_stripe), each with its share of the slots and a lock of its own, so claims of the
-- type run side by side instead of one after the other. A claim takes the first stripe it can
-- lock without waiting that has a free slot, counts the running jobs of that stripe only, and
-- records its lease there: a running job belongs to the stripe that holds its lease (the claim
-- passes its lease to claim_pick). No stripe runs more than its share, so the type runs no more
-- than the limit. A claim that finds every stripe locked waits for one.

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

-- A striped limit's stripes, made by type_limit_restripe when its row is written.
CREATE TABLE type_limit_stripe (
    type   text NOT NULL REFERENCES type_limit (type) ON DELETE CASCADE,
    stripe integer NOT NULL CHECK (stripe >= 0),
    slots  integer NOT NULL CHECK (slots > 0),
    -- the leases of the claims made under this stripe whose jobs may still run (pruned by
    -- each claim under it); their running jobs are the stripe's
    leases uuid[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (type, stripe)
);

-- The advisory lock keys of limits: (this schema's limits, the type) for the whole type and
-- (this schema's limits, the type's stripe n). A hash collision only serialises two claims
-- that could have run side by side; it never lets a limit through.
CREATE FUNCTION limit_lock_space() RETURNS integer
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT hashtext('pgq_limit:' || current_schema())
$$;

CREATE FUNCTION limit_stripe_key(p_type text, p_stripe integer) RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path FROM CURRENT AS $$
    SELECT hashtext(p_type || '#' || p_stripe)
$$;

-- Takes every lock of a limited type, in one order: the type's, then each stripe's. Whoever
-- holds them all (a claim without a lease, a change of the limit) excludes every claim of it.
CREATE FUNCTION limit_lock_all(p_type text) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    s integer;
BEGIN
    PERFORM pg_advisory_xact_lock(limit_lock_space(), hashtext(p_type));
    FOR s IN SELECT t.stripe FROM type_limit_stripe t WHERE t.type = p_type ORDER BY t.stripe
    LOOP
        PERFORM pg_advisory_xact_lock(limit_lock_space(), limit_stripe_key(p_type, s));
    END LOOP;
END $$;

-- A limit written (at a supervisor's start): its stripes are made again; a changed limit
-- under every lock of the type, so no claim is counting meanwhile. Each new stripe starts with the leases of all
-- the type's running jobs: they count against every stripe until they end, which holds the
-- type under its new limit (each stripe admits at most its share minus all of them).
CREATE FUNCTION type_limit_restripe() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    n    integer;
    live uuid[];
BEGIN
    -- A changed limit waits for the claims counting under the old one (claims that start
    -- after it commits use the new stripes). A new one has no claims counting yet.
    IF TG_OP = 'UPDATE' THEN
        PERFORM limit_lock_all(NEW.type);
    END IF;
    DELETE FROM type_limit_stripe WHERE type = NEW.type;
    IF NEW.key_concurrency IS NULL AND NEW.global_concurrency >= 200 THEN
        n := least(8, NEW.global_concurrency / 100);
        live := ARRAY(SELECT DISTINCT j.lease FROM job j
                      WHERE j.state = 'running' AND j.type = NEW.type);
        INSERT INTO type_limit_stripe (type, stripe, slots, leases)
        SELECT NEW.type, s,
               NEW.global_concurrency / n + CASE WHEN s < NEW.global_concurrency % n THEN 1 ELSE 0 END,
               live
        FROM generate_series(0, n - 1) s;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER type_limit_restripe AFTER INSERT OR UPDATE ON type_limit
    FOR EACH ROW EXECUTE FUNCTION type_limit_restripe();

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

-- A claim of a striped type with lease p_lease: the first stripe, from a random one on, that
-- it can lock without waiting and that has a free slot; its free slots are returned and the
-- lease recorded in it (pruned of the claims whose jobs have all ended). When every stripe is
-- locked by other claims, it waits for one. 0: no free slot in the stripes it could look at.
-- Waiting only while holding no other lock of the type (types are taken in order) cannot
-- deadlock.
CREATE FUNCTION limit_take_stripe(p_type text, p_lease uuid) RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_n     integer;
    v_start integer;
    v_s     integer;
    v_held  boolean := false;
    v_row   record;
    v_live  uuid[];
    v_count integer;
BEGIN
    SELECT count(*) INTO v_n FROM type_limit_stripe WHERE type = p_type;
    v_start := floor(random() * v_n)::int;
    FOR k IN 0 .. 2 * v_n - 1 LOOP
        v_s := (v_start + k) % v_n;
        IF k < v_n THEN
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(limit_lock_space(),
                                                        limit_stripe_key(p_type, v_s));
        ELSIF v_held THEN
            RETURN 0;  -- it holds full stripes: waiting for another could deadlock
        ELSE
            PERFORM pg_advisory_xact_lock(limit_lock_space(), limit_stripe_key(p_type, v_s));
        END IF;
        v_held := true;
        -- statements from here on see every claim that held this stripe before
        SELECT t.slots, t.leases INTO v_row FROM type_limit_stripe t
        WHERE t.type = p_type AND t.stripe = v_s;
        IF NOT FOUND THEN
            RETURN 0;  -- restriped meanwhile: take nothing this time
        END IF;
        SELECT count(*), coalesce(array_agg(DISTINCT j.lease), '{}') INTO v_count, v_live
        FROM job j
        WHERE j.state = 'running' AND j.type = p_type AND j.lease = ANY(v_row.leases);
        IF v_count < v_row.slots THEN
            UPDATE type_limit_stripe SET leases = v_live || p_lease
            WHERE type = p_type AND stripe = v_s;
            RETURN v_row.slots - v_count;
        END IF;
        IF k >= v_n THEN
            RETURN 0;  -- waited for it, and it is full
        END IF;
    END LOOP;
    RETURN 0;
END $$;

-- claim_pick for types of which some are limited (pauses are dropped by the gate already).
-- Locks first, always in one order, so overlapping claims cannot deadlock: the advisory lock
-- of each limited type in type order, then the rate rows in type order (as claim_pick_rated).
-- Then types neither limited nor rated are picked as usual, a rated one at most its free
-- starts, a limited one at most what its limit (and its rate) leaves; the union is cut back to
-- p_limit in claim order (rows cut stay pending, locked until this transaction ends) and the
-- rated types' starts are counted, as claim_pick_rated does.
CREATE FUNCTION claim_pick_limited(p_types text[], p_limit integer, p_lease uuid)
RETURNS uuid[]
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
            v_slots := v_slots || limit_take_stripe(r.type, p_lease);
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

-- The gate (0007) with limits in front of rates: a claim naming a limited type goes through
-- claim_pick_limited, which applies the rates too. The claim statements now pass their lease
-- (a striped limit records it); without one, a striped type's claim excludes all others.
DROP FUNCTION claim_pick(text[], integer);
CREATE FUNCTION claim_pick(p_types text[], p_limit integer, p_lease uuid DEFAULT NULL)
RETURNS uuid[]
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
        RETURN claim_pick_limited(p_types, p_limit, p_lease);
    END IF;
    -- rates: a rated type starts no more than its window has free
    IF EXISTS (SELECT 1 FROM type_rate WHERE type = ANY(p_types)) THEN
        RETURN claim_pick_rated(p_types, p_limit);
    END IF;
    RETURN claim_pick_rows(p_types, p_limit);
END $$;
