-- pgq_supervisor schema, version 22 (issue 23 item 2): claims that start past the dead prefix.
--
-- The problem. A claim walks job_claim_idx (priority DESC, created_at, id) from its start. A
-- claimed job leaves its pending version's entry there until vacuum removes it, and the first
-- scan that finds the version dead to every snapshot marks the entry so later scans skip it
-- without a visit to the table. While a snapshot is held (a REPEATABLE READ report, a session
-- idle in transaction, a standby's feedback) neither can happen: every claim since then leaves
-- an entry that every later claim must follow into the table, one page visit each. At 1,500
-- jobs/s a snapshot held 5 minutes made 450,000 of them and the claim's p99 went from 22 ms to
-- 450 ms.
--
-- The floor. While the horizon is held back, each supervisor walks, about once a second, the
-- claim order of each type it serves from where the type's floor was (claim_floor_refresh) and
-- records, per priority level with a ready job, the created_at of the first one (`ats`), and
-- for the other levels the time of the walk (`upto`). A claim of types that all have a floor
-- starts each level's scan there (claim_pick_rows): the dead prefix is never read. The walk is
-- the claim's own walk, made once a second instead of at every claim.
--
-- Why a floor stays right. A floor is a lower bound: every ready job of the type is at or past
-- it in claim order. A job can appear before it in only these ways, each handled:
-- - it was inserted by a transaction open during the walk, committed later: its created_at is
--   at least its transaction's start, and the walk lowers the floor to the oldest start of the
--   transactions writing, or running a statement, at the time (pg_stat_activity);
-- - that cannot be known of a session whose details this role may not read (another role's,
--   without pg_read_all_stats), nor of a prepared transaction (its rows commit at COMMIT
--   PREPARED with the created_at they had, and nothing says when it began): while one of these
--   is in the database, the walk drops the types' floors instead (claim_floor_refresh: -1);
-- - a job that becomes ready again keeps its created_at: released, retried, snoozed, reset and
--   debounced jobs get start_at = now() and are claimed from job_delayed_idx (no floor there);
--   a job whose last dependency or ordered-key predecessor ends, whose priority changes
--   (aging, a debounce) or whose start_at a debounce moves back, is moved there too, by
--   job_floor_requeue below, while its type has a floor.
-- A row written by hand with an old created_at is not; it is claimed once the floors are
-- dropped. Floors are dropped when the horizon moves on (claim_floor_clear). A floor left
-- behind by a supervisor that died stays a lower bound: claims read more, never miss a job.
CREATE TABLE claim_floor (
    type      text PRIMARY KEY CHECK (char_length(type) BETWEEN 1 AND 100),
    levels    integer[] NOT NULL DEFAULT '{}',      -- priority levels with a ready job, highest first
    ats       timestamptz[] NOT NULL DEFAULT '{}',  -- each level's floor
    upto      timestamptz NOT NULL DEFAULT '-infinity',  -- the floor of every other level
    walked_at timestamptz NOT NULL DEFAULT '-infinity',
    CHECK (cardinality(levels) = cardinality(ats))
);

-- The advisory lock key of a type's floor: job_floor_requeue takes it shared while the type has
-- no floor, a walk exclusively, so a job made ready by a transaction that saw no floor is
-- committed (and seen by the walk) before the walk reads.
CREATE FUNCTION claim_floor_key(p_type text) RETURNS bigint
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT hashtextextended(current_schema() || ':claim_floor:' || p_type, 0)
$$;

CREATE FUNCTION job_floor_requeue() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM claim_floor f WHERE f.type = NEW.type) THEN
        NEW.start_at := greatest(NEW.start_at, clock_timestamp());
    ELSE
        PERFORM pg_advisory_xact_lock_shared(claim_floor_key(NEW.type));
    END IF;
    RETURN NEW;
END $$;

-- A job that becomes ready in claim order with an old created_at (its last dependency ended,
-- its ordered key's predecessor ended, aging or a debounce changed its priority, a debounce
-- moved its start_at back before its creation).
CREATE TRIGGER job_floor_requeue BEFORE UPDATE OF waiting_on, priority, start_at ON job
FOR EACH ROW
WHEN (NEW.state = 'pending' AND NEW.waiting_on = 0 AND NEW.tenant IS NULL
      AND NEW.start_at <= NEW.created_at
      AND (OLD.waiting_on > 0 OR OLD.priority <> NEW.priority
           OR OLD.start_at > OLD.created_at))
EXECUTE FUNCTION job_floor_requeue();

-- The first ready job of `p_type` in claim order at or past (priority in [p_lo, p_hi],
-- created_at >= p_from): its priority and created_at, or no row.
CREATE FUNCTION claim_floor_first(p_type text, p_lo bigint, p_hi bigint, p_from timestamptz)
RETURNS TABLE (priority integer, created_at timestamptz)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT p.priority, p.created_at FROM job p
    WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= p.created_at
      AND p.tenant IS NULL AND p.type = p_type
      AND p.priority BETWEEN p_lo AND p_hi AND p.created_at >= p_from
    ORDER BY p.priority DESC, p.created_at, p.id
    LIMIT 1
$$;

-- Walk each type's claim order and record its floor (see the top); `p_full`: from the start of
-- the index, not from the old floor. A type walked by another supervisor in the last half
-- second is left alone; one that had no floor gets an empty one (no level skipped) and its
-- first walk at the next call, after its releasers have committed. Returns the types walked,
-- or -1 when a writer may be unseen (see the top): the types' floors are dropped then.
CREATE FUNCTION claim_floor_refresh(p_types text[], p_full boolean) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_type   text;
    v_old    claim_floor;
    v_upto   timestamptz;
    v_levels integer[];
    v_ats    timestamptz[];
    v_hi     bigint;
    v_lo     bigint;
    v_at     timestamptz;
    v_from   timestamptz;
    v_n      integer;
    r        record;
    v_walked integer := 0;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a
               WHERE a.datname = current_database() AND a.query = '<insufficient privilege>')
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_prepared_xacts p
                  WHERE p.database = current_database()) THEN
        DELETE FROM claim_floor f WHERE f.type = ANY(p_types);
        RETURN -1;
    END IF;
    -- The oldest start of the transactions writing now, or running a statement (one may be
    -- writing without an xid yet: COPY evaluates a row's created_at when it reads the row and
    -- inserts its buffered rows at the end): what they insert is at or past it. Read once:
    -- pg_stat_activity is read once per transaction, and a writer that starts after that read
    -- inserts after this clock_timestamp().
    v_upto := least(clock_timestamp(),
                    (SELECT min(a.xact_start) FROM pg_catalog.pg_stat_activity a
                     WHERE (a.backend_xid IS NOT NULL
                            OR a.state IN ('active', 'fastpath function call'))
                       AND a.pid <> pg_backend_pid() AND a.datname = current_database()));
    FOREACH v_type IN ARRAY p_types LOOP
        SELECT * INTO v_old FROM claim_floor f WHERE f.type = v_type FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            INSERT INTO claim_floor (type) VALUES (v_type) ON CONFLICT DO NOTHING;
            CONTINUE;
        END IF;
        CONTINUE WHEN NOT p_full AND v_old.walked_at > clock_timestamp() - interval '0.5 s';
        PERFORM pg_advisory_xact_lock(claim_floor_key(v_type));
        IF p_full THEN
            v_old.levels := '{}';
            v_old.ats := '{}';
            v_old.upto := '-infinity';
        END IF;
        v_levels := '{}';
        v_ats := '{}';
        -- A level once listed stays listed (at the walk's upto while it has no ready job), and
        -- the default priority is always: the scan of a listed level starts at its floor,
        -- while that of a range of unlisted levels reads every entry of the range's levels
        -- (created_at is not the leading column there), a level emptied by claims included.
        IF NOT 0 = ANY(v_old.levels) THEN
            SELECT coalesce(array_agg(x.l ORDER BY x.l DESC), '{}'),
                   coalesce(array_agg(x.a ORDER BY x.l DESC), '{}')
            INTO v_old.levels, v_old.ats
            FROM (SELECT u.l, u.a FROM unnest(v_old.levels, v_old.ats) AS u(l, a)
                  UNION ALL SELECT 0, v_old.upto) x(l, a);
        END IF;
        v_hi := 2147483647;
        v_n := cardinality(v_old.levels);
        -- the old floor's parts in claim order: the unlisted range above each listed level
        -- (from the old upto), then that level (from its own floor); last the range below all
        FOR i IN 1 .. v_n + 1 LOOP
            v_lo := CASE WHEN i <= v_n THEN v_old.levels[i]::bigint + 1 ELSE -2147483648 END;
            LOOP  -- every level of the range with a ready job, highest first
                EXIT WHEN v_lo > v_hi;
                SELECT * INTO r FROM claim_floor_first(v_type, v_lo, v_hi, v_old.upto);
                EXIT WHEN NOT FOUND;
                v_levels := v_levels || r.priority;
                v_ats := v_ats || least(r.created_at, v_upto);
                v_hi := r.priority::bigint - 1;
            END LOOP;
            EXIT WHEN i > v_n;
            v_from := v_old.ats[i];
            SELECT * INTO r FROM claim_floor_first(v_type, v_old.levels[i], v_old.levels[i],
                                                  v_from);
            v_levels := v_levels || v_old.levels[i];
            v_ats := v_ats || CASE WHEN FOUND THEN least(r.created_at, v_upto) ELSE v_upto END;
            v_hi := v_old.levels[i]::bigint - 1;
        END LOOP;
        UPDATE claim_floor f
        SET levels = v_levels, ats = v_ats, upto = v_upto, walked_at = clock_timestamp()
        WHERE f.type = v_type;
        v_walked := v_walked + 1;
    END LOOP;
    RETURN v_walked;
END $$;

-- The horizon moved on: claims of these types walk from the start again.
CREATE FUNCTION claim_floor_clear(p_types text[]) RETURNS integer
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH gone AS (DELETE FROM claim_floor f WHERE f.type = ANY(p_types) RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;

-- claim_pick_rows as in schema/0021, and the floored walk when every claimed type has a floor.
-- Its statements' plans are generic from the first call (plan_cache_mode): PL/pgSQL would plan
-- the first five with the call's values and then compare, 250-560 us per claim; a generic plan
-- is the same walk (the SET clauses leave the ordered index scan the only cheap one), 55-140 us.
CREATE OR REPLACE FUNCTION claim_pick_rows(p_types text[], p_limit integer)
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
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
    IF EXISTS (SELECT 1 FROM claim_floor f WHERE f.type = ANY(p_types)) THEN
        v_ready := claim_pick_floored(p_types, p_limit);
    END IF;
    IF v_ready IS NULL THEN
        v_ready := ARRAY(
            SELECT p.id
            FROM job p
            WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= p.created_at
              AND p.tenant IS NULL AND p.start_at <= now() AND p.type = ANY(p_types)
            ORDER BY p.priority DESC, p.created_at, p.id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED);
    END IF;
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

-- The ready jobs (job_claim_idx) of `p_types` past their floors, in claim order: NULL when a
-- type has none (the plain walk then). Types' floors combine to the lowest of each level; a
-- level one type lists and another does not gets the other's `upto` too.
CREATE FUNCTION claim_pick_floored(p_types text[], p_limit integer)
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_upto   timestamptz;
    v_levels integer[];
    v_ats    timestamptz[];
    v_ids    uuid[] := '{}';
    v_hi     bigint := 2147483647;
    v_lo     bigint;
    v_n      integer;
BEGIN
    SELECT min(f.upto) INTO v_upto FROM claim_floor f WHERE f.type = ANY(p_types)
    HAVING count(*) = cardinality(p_types);
    IF v_upto IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(array_agg(x.l ORDER BY x.l DESC), '{}'),
           coalesce(array_agg(x.a ORDER BY x.l DESC), '{}')
    INTO v_levels, v_ats
    FROM (SELECT u.l, least(min(u.a), v_upto) AS a
          FROM claim_floor f, unnest(f.levels, f.ats) AS u(l, a)
          WHERE f.type = ANY(p_types)
          GROUP BY u.l) x;
    v_n := cardinality(v_levels);
    FOR i IN 1 .. v_n + 1 LOOP
        v_lo := CASE WHEN i <= v_n THEN v_levels[i]::bigint + 1 ELSE -2147483648 END;
        IF v_lo <= v_hi THEN
            v_ids := v_ids || ARRAY(
                SELECT p.id FROM job p
                WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= p.created_at
                  AND p.tenant IS NULL AND p.start_at <= now() AND p.type = ANY(p_types)
                  AND p.priority BETWEEN v_lo AND v_hi AND p.created_at >= v_upto
                ORDER BY p.priority DESC, p.created_at, p.id
                LIMIT p_limit - cardinality(v_ids)
                FOR UPDATE SKIP LOCKED);
        END IF;
        EXIT WHEN i > v_n OR cardinality(v_ids) >= p_limit;
        v_ids := v_ids || ARRAY(
            SELECT p.id FROM job p
            WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= p.created_at
              AND p.tenant IS NULL AND p.start_at <= now() AND p.type = ANY(p_types)
              AND p.priority = v_levels[i] AND p.created_at >= v_ats[i]
            ORDER BY p.priority DESC, p.created_at, p.id
            LIMIT p_limit - cardinality(v_ids)
            FOR UPDATE SKIP LOCKED);
        EXIT WHEN cardinality(v_ids) >= p_limit;
        v_hi := v_levels[i]::bigint - 1;
    END LOOP;
    RETURN v_ids;
END $$;
