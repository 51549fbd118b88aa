-- pgq_supervisor schema, version 29 (issue 35, step 4): the job table partitioned by its id,
-- opt-in. Ids are time-ordered (schema 0012: the first 48 bits are the Unix time in
-- milliseconds), so a range of ids is a range of enqueue times. In a partitioned job table,
-- finished jobs leave by the partition: a supervisor drops a partition whose every job is
-- finished and past its retention window (job_partition_expire, below), instead of deleting
-- its rows one by one and leaving vacuum a second pass over each. A partition is never dropped
-- while a job in it is unfinished; the few finished jobs in it that are still within their
-- window (failed and cancelled jobs are kept longer than succeeded ones) are carried into the
-- default partition, with their ids.
--
-- This migration changes no table: it adds the functions. `python -m pgq_supervisor
-- partition` (job_partition_convert) converts the table, with the supervisors stopped. Not
-- the default yet: every statement over a partitioned job table plans and locks each of its
-- partitions and their indexes, and the no-op drain at 2 procs measured 0.73x of the one
-- table's with four partitions (docs/storage.md); the claim has to read a narrow table of its
-- own (step 3) before this is the default.

-- The lowest id made in `p_at`'s millisecond: a partition bound.
CREATE FUNCTION id_floor(p_at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE SET search_path FROM CURRENT AS $$
    SELECT encode(substring(int8send(floor(extract(epoch FROM p_at) * 1000)::bigint) FROM 3)
                  || '\x00000000000000000000'::bytea, 'hex')::uuid
$$;

-- When an id was made (its first 48 bits), the inverse of id_floor.
CREATE FUNCTION id_time(p_id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE SET search_path FROM CURRENT AS $$
    SELECT to_timestamp(('x' || left(replace(p_id::text, '-', ''), 12))::bit(48)::bigint
                        / 1000.0)
$$;

-- Whether job is the partitioned table (job_partition_convert made it so).
CREATE FUNCTION job_partitioned() RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT relkind = 'p' FROM pg_class WHERE oid = 'job'::regclass
$$;

-- ---- partition maintenance (a supervisor's pruner calls these; docs/storage.md) ---------------

-- The tables that hold job's rows: job itself, or its partitions (what sizes and statistics
-- are summed over: a partitioned table holds none of its own).
CREATE FUNCTION job_tables() RETURNS SETOF regclass
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT c.oid::regclass
    FROM pg_class c
    WHERE c.relkind = 'r'
      AND (c.oid = 'job'::regclass
           OR c.oid IN (SELECT t.relid FROM pg_partition_tree('job'::regclass) t))
$$;

-- job's partitions and their bounds: `lo` NULL for MINVALUE, both NULL for the default one.
CREATE FUNCTION job_partitions(OUT name text, OUT lo uuid, OUT hi uuid, OUT is_default boolean)
RETURNS SETOF record
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT c.relname::text,
           (regexp_match(b.expr, 'FROM \(''([0-9a-f-]+)''\)'))[1]::uuid,
           (regexp_match(b.expr, 'TO \(''([0-9a-f-]+)''\)'))[1]::uuid,
           b.expr = 'DEFAULT'
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) b
    WHERE i.inhparent = 'job'::regclass
$$;

-- One maintainer at a time per schema (an advisory lock held to the end of the transaction).
CREATE FUNCTION job_partition_lock() RETURNS boolean
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '.job_partition'))
$$;

-- A partition's indexes named after the job table's (job_claim_idx: <partition>_claim_idx), so
-- that a plan names the index it walks the same way in every partition.
CREATE FUNCTION job_partition_name_indexes(p_partition text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_index  text;
    v_parent text;
BEGIN
    FOR v_index, v_parent IN
        SELECT c.relname, p.relname
        FROM pg_index x
        JOIN pg_class c ON c.oid = x.indexrelid
        JOIN pg_inherits i ON i.inhrelid = x.indexrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE x.indrelid = to_regclass(quote_ident(current_schema()) || '.' || quote_ident(p_partition))
    LOOP
        IF v_index <> p_partition || '_' || substr(v_parent, 5) THEN
            EXECUTE format('ALTER INDEX %I RENAME TO %I', v_index,
                           p_partition || '_' || substr(v_parent, 5));
        END IF;
    END LOOP;
END $$;

-- Makes the partitions of the intervals from the last one made (or from now) until
-- `p_ahead` intervals from now, each a range of ids [id_floor(start), id_floor(end)). Returns
-- the names made; NULL when another session is doing it. A range the default partition
-- already holds rows of (a client's clock hours ahead) is left to it, said in a notice. The
-- ATTACH locks the default partition, which every claim reads: waited for at most half a
-- second (a claim queued behind it waits as long), else the round stops and the next one,
-- a minute later, tries again (the partitions are made hours ahead).
CREATE FUNCTION job_partition_ensure(p_interval interval, p_ahead integer) RETURNS text[]
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_from timestamptz;
    v_to   timestamptz;
    v_name  text;
    v_made  text[] := '{}';
    v_saved text;
BEGIN
    IF NOT job_partitioned() OR NOT job_partition_lock() THEN
        RETURN NULL;
    END IF;
    SELECT greatest(max(id_time(p.hi)), date_bin(p_interval, now(), timestamptz 'epoch'))
    INTO v_from FROM job_partitions() p;
    v_saved := current_setting('lock_timeout');
    PERFORM set_config('lock_timeout', '500ms', true);
    WHILE v_from < now() + p_interval * p_ahead LOOP
        v_to := date_bin(p_interval, v_from, timestamptz 'epoch') + p_interval;
        v_name := 'job_p' || to_char(v_from AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS');
        BEGIN
            EXECUTE format(
                'CREATE TABLE %I (LIKE job INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'
                ' WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.01,'
                ' autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.02,'
                ' autovacuum_vacuum_cost_limit = 2000)', v_name);
            EXECUTE format('ALTER TABLE job ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                           v_name, id_floor(v_from), id_floor(v_to));
            PERFORM job_partition_name_indexes(v_name);
            v_made := v_made || v_name;
        EXCEPTION
            WHEN check_violation THEN
                RAISE NOTICE '%: the default partition holds jobs of this range; left to it',
                             v_name;
            WHEN lock_not_available THEN
                RAISE NOTICE '%: the job table is busy; the next round makes it', v_name;
                EXIT;
        END;
        v_from := v_to;
    END LOOP;
    PERFORM set_config('lock_timeout', v_saved, true);
    RETURN v_made;
END $$;

-- Whether a job with an id in [p_lo, p_hi) is unfinished: pending (ready, delayed, waiting on
-- its ordered key or on dependencies) or running. Each probe is served by a partial index
-- (job_running_idx, job_claim_idx, job_tenant_idx, job_delayed_idx, job_ordered_idx) or by
-- job_dependency's key: a job waits on dependencies only while it has edges (its waiting_on
-- counts them), so no probe reads the partition's finished rows.
CREATE FUNCTION job_partition_unfinished(p_lo uuid, p_hi uuid) RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT EXISTS (SELECT 1 FROM job j WHERE j.id >= p_lo AND j.id < p_hi
                   AND j.state = 'running')
        OR EXISTS (SELECT 1 FROM job j WHERE j.id >= p_lo AND j.id < p_hi
                   AND j.state = 'pending' AND j.waiting_on = 0
                   AND j.start_at <= j.created_at AND j.tenant IS NULL)
        OR EXISTS (SELECT 1 FROM job j WHERE j.id >= p_lo AND j.id < p_hi
                   AND j.state = 'pending' AND j.waiting_on = 0
                   AND j.start_at <= j.created_at AND j.tenant IS NOT NULL)
        OR EXISTS (SELECT 1 FROM job j WHERE j.id >= p_lo AND j.id < p_hi
                   AND j.state = 'pending' AND j.waiting_on = 0 AND j.start_at > j.created_at)
        OR EXISTS (SELECT 1 FROM job j WHERE j.id >= p_lo AND j.id < p_hi
                   AND j.ordered_key IS NOT NULL AND j.state = 'pending')
        OR EXISTS (SELECT 1 FROM job_dependency d JOIN job j ON j.id = d.job_id
                   WHERE d.job_id >= p_lo AND d.job_id < p_hi AND j.state = 'pending')
$$;

-- The partition retention looks at next: the oldest range partition above p_after whose
-- upper bound is older than p_succeeded (none while succeeded jobs are kept forever).
CREATE FUNCTION job_partition_next(p_succeeded interval, p_after uuid,
                                   OUT partition text, OUT lo uuid, OUT hi uuid)
RETURNS SETOF record
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT p.name, coalesce(p.lo, '00000000-0000-0000-0000-000000000000'), p.hi
    FROM job_partitions() p
    WHERE NOT p.is_default AND p_succeeded IS NOT NULL
      AND p.hi <= id_floor(now() - p_succeeded) AND (p_after IS NULL OR p.hi > p_after)
    ORDER BY p.hi
    LIMIT 1
$$;

-- Whether a finished job with an id in [p_lo, p_hi) is past its window: succeeded before
-- p_cut_s, failed or cancelled before p_cut_f (a NULL cut keeps that kind).
CREATE FUNCTION job_past(p_state job_state, p_stopped timestamptz, p_cut_s timestamptz,
                         p_cut_f timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path FROM CURRENT AS $$
    SELECT coalesce((p_state = 'succeeded' AND p_stopped < p_cut_s)
                    OR (p_state IN ('failed', 'cancelled') AND p_stopped < p_cut_f), false)
$$;

-- The first of retention's two transactions for a partition: the finished jobs in it whose
-- leaving has consequences (in a bundle, depended on, depending, ordered, with workflow rows)
-- are deleted as the pruner deletes them, with the triggers that keep bundles, dependencies
-- and ordered keys true (row locks only: the table lock comes in a transaction of its own, so
-- these locks and the bundle rows the triggers lock are not held while it waits).
-- Returns (partition, outcome, hi, jobs): outcome 'unfinished' (a job in it is still to run:
-- nothing done) or 'cleaned', then `jobs` is the number of jobs left in it (counted with
-- p_count, else the planner's estimate); no row when no partition is old enough.
CREATE FUNCTION job_partition_clean(p_succeeded interval, p_failed interval,
                                    p_after uuid DEFAULT NULL, p_count boolean DEFAULT false,
                                    OUT partition text, OUT outcome text, OUT hi uuid,
                                    OUT jobs bigint)
RETURNS SETOF record
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_lo    uuid;
    v_cut_s timestamptz := now() - p_succeeded;
    v_cut_f timestamptz := now() - p_failed;
BEGIN
    SELECT n.partition, n.lo, n.hi INTO partition, v_lo, hi
    FROM job_partition_next(p_succeeded, p_after) n;
    IF partition IS NULL THEN
        RETURN;
    END IF;
    IF job_partition_unfinished(v_lo, hi) THEN
        outcome := 'unfinished';
        RETURN NEXT;
        RETURN;
    END IF;
    -- found by index, not by a scan of the partition: in a bundle (job_bundle_idx), with an
    -- edge either way (job_dependency's keys), failed with an ordered key (job_ordered_idx;
    -- a succeeded or cancelled one released its key when it ended)
    DELETE FROM job j
    WHERE j.id = ANY(ARRAY(
            SELECT x.id FROM job x
            WHERE x.id >= v_lo AND x.id < hi AND x.bundle_id IS NOT NULL
            UNION
            SELECT d.job_id FROM job_dependency d WHERE d.job_id >= v_lo AND d.job_id < hi
            UNION
            SELECT d.depends_on FROM job_dependency d
            WHERE d.depends_on >= v_lo AND d.depends_on < hi
            UNION
            SELECT x.id FROM job x
            WHERE x.id >= v_lo AND x.id < hi AND x.ordered_key IS NOT NULL
              AND x.state IN ('pending', 'running', 'failed')))
      AND j.id >= v_lo AND j.id < hi AND job_past(j.state, j.stopped_at, v_cut_s, v_cut_f);
    DELETE FROM workflow_step s USING job j
    WHERE s.job_id >= v_lo AND s.job_id < hi AND s.job_id = j.id
      AND job_past(j.state, j.stopped_at, v_cut_s, v_cut_f);
    DELETE FROM workflow_signal s USING job j
    WHERE s.job_id >= v_lo AND s.job_id < hi AND s.job_id = j.id
      AND job_past(j.state, j.stopped_at, v_cut_s, v_cut_f);
    IF p_count THEN  -- a scan of the partition, without a lock that holds anyone back
        EXECUTE format('SELECT count(*) FROM %I', partition) INTO jobs;
    ELSE  -- the planner's estimate (ANALYZE's, autovacuum's)
        SELECT greatest(c.reltuples, 0)::bigint INTO jobs FROM pg_class c
        WHERE c.oid = to_regclass(quote_ident(current_schema()) || '.' || quote_ident(partition));
    END IF;
    outcome := 'cleaned';
    RETURN NEXT;
END $$;

-- The second: drops the partition job_partition_clean named (the oldest above p_after) if
-- every job in it is finished, and past its window or carried. Returns (partition, outcome,
-- carried, hi):
--   dropped       the partition is gone; `carried` finished jobs still within their window
--                 (failed and cancelled jobs are kept longer than succeeded ones) moved into
--                 the default partition first, with their ids, dependency edges and workflow
--                 rows (at most p_max_carry)
--   unfinished    a job in it is pending, waiting or running: kept (the pruner deletes its
--                 finished rows one by one once it is older than the drop zone)
--   kept          more than p_max_carry jobs in it are still within their window
--   busy          another maintainer has it, the table lock was not had within
--                 p_lock_timeout, or a job that needs a clean (above) is in it: tried again
--                 at the next round
-- No row when no partition is old enough. The check and the drop run under an ACCESS
-- EXCLUSIVE lock on job (DETACH takes one anyway), so nothing it checked changes before the
-- drop; every check is served by an index, not by a scan of the partition.
CREATE FUNCTION job_partition_expire(p_succeeded interval, p_failed interval,
                                     p_max_carry integer, p_lock_timeout interval,
                                     p_after uuid DEFAULT NULL,
                                     OUT partition text, OUT outcome text, OUT carried integer,
                                     OUT hi uuid)
RETURNS SETOF record
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_lo    uuid;
    v_cut_s timestamptz := now() - p_succeeded;
    v_cut_f timestamptz := now() - p_failed;
    v_carry uuid[];
    v_deps  job_dependency[];
    v_steps workflow_step[];
    v_sigs  workflow_signal[];
    v_saved text;
BEGIN
    SELECT n.partition, n.lo, n.hi INTO partition, v_lo, hi
    FROM job_partition_next(p_succeeded, p_after) n;
    IF partition IS NULL THEN
        RETURN;
    END IF;
    carried := 0;
    outcome := 'busy';
    IF NOT job_partition_lock() THEN
        RETURN NEXT;
        RETURN;
    END IF;
    BEGIN
        v_saved := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', (extract(epoch FROM p_lock_timeout) * 1000)::bigint
                                           || 'ms', true);
        LOCK TABLE job IN ACCESS EXCLUSIVE MODE;
        PERFORM set_config('lock_timeout', v_saved, true);
    EXCEPTION WHEN lock_not_available THEN
        RETURN NEXT;
        RETURN;
    END;

    IF job_partition_unfinished(v_lo, hi) THEN
        outcome := 'unfinished';
        RETURN NEXT;
        RETURN;
    END IF;
    -- finished within their window: carried (job_finished_idx)
    v_carry := ARRAY(
        SELECT j.id FROM job j
        WHERE j.id >= v_lo AND j.id < hi AND j.stopped_at IS NOT NULL
          AND j.state = 'succeeded' AND (v_cut_s IS NULL OR j.stopped_at >= v_cut_s)
        UNION ALL
        SELECT j.id FROM job j
        WHERE j.id >= v_lo AND j.id < hi AND j.stopped_at IS NOT NULL
          AND j.state IN ('failed', 'cancelled') AND (v_cut_f IS NULL OR j.stopped_at >= v_cut_f)
        LIMIT p_max_carry + 1);
    IF cardinality(v_carry) > p_max_carry THEN
        outcome := 'kept';
        RETURN NEXT;
        RETURN;
    END IF;
    -- a job that leaves with consequences and was finished or reset since the clean: the
    -- next round cleans it (job_bundle_idx, job_dependency's keys, job_ordered_idx, the
    -- workflow tables' keys)
    IF EXISTS (SELECT 1 FROM job j WHERE j.id >= v_lo AND j.id < hi
               AND j.bundle_id IS NOT NULL AND j.id <> ALL(v_carry))
       OR EXISTS (SELECT 1 FROM job_dependency d WHERE d.job_id >= v_lo AND d.job_id < hi
                  AND d.job_id <> ALL(v_carry))
       OR EXISTS (SELECT 1 FROM job_dependency d WHERE d.depends_on >= v_lo
                  AND d.depends_on < hi AND d.depends_on <> ALL(v_carry))
       OR EXISTS (SELECT 1 FROM job j WHERE j.id >= v_lo AND j.id < hi
                  AND j.ordered_key IS NOT NULL AND j.state IN ('pending', 'running', 'failed')
                  AND j.id <> ALL(v_carry))
       OR EXISTS (SELECT 1 FROM workflow_step s WHERE s.job_id >= v_lo AND s.job_id < hi
                  AND s.job_id <> ALL(v_carry))
       OR EXISTS (SELECT 1 FROM workflow_signal s WHERE s.job_id >= v_lo AND s.job_id < hi
                  AND s.job_id <> ALL(v_carry))
    THEN
        RETURN NEXT;
        RETURN;
    END IF;

    v_deps := ARRAY(SELECT d FROM job_dependency d
                    WHERE d.job_id = ANY(v_carry) OR d.depends_on = ANY(v_carry));
    v_steps := ARRAY(SELECT s FROM workflow_step s WHERE s.job_id = ANY(v_carry));
    v_sigs := ARRAY(SELECT s FROM workflow_signal s WHERE s.job_id = ANY(v_carry));
    DELETE FROM job_dependency d WHERE d.job_id = ANY(v_carry) OR d.depends_on = ANY(v_carry);
    DELETE FROM workflow_step s WHERE s.job_id = ANY(v_carry);
    DELETE FROM workflow_signal s WHERE s.job_id = ANY(v_carry);

    EXECUTE format('ALTER TABLE job DETACH PARTITION %I', partition);
    -- finished jobs, into the default partition: the insert triggers take no unique key
    EXECUTE format('INSERT INTO job SELECT * FROM %I WHERE id = ANY($1)', partition)
    USING v_carry;
    INSERT INTO job_dependency SELECT (d).* FROM unnest(v_deps) d
    WHERE EXISTS (SELECT 1 FROM job j WHERE j.id = (d).job_id)
      AND EXISTS (SELECT 1 FROM job j WHERE j.id = (d).depends_on);
    INSERT INTO workflow_step SELECT (s).* FROM unnest(v_steps) s;
    INSERT INTO workflow_signal SELECT (s).* FROM unnest(v_sigs) s;
    EXECUTE format('DROP TABLE %I', partition);
    outcome := 'dropped';
    carried := cardinality(v_carry);
    RETURN NEXT;
END $$;

-- ---- the conversion (opt-in: `python -m pgq_supervisor partition`) ---------------------------

-- Turns job into the partitioned table, in the caller's transaction, under its lock: the
-- table becomes the first partition, job_legacy, for every id made before now (one scan to
-- validate its bound, no copy), its indexes become the partitioned table's; rows with a
-- higher id (a client whose clock runs ahead; a version-4 id from before 0012) move into the
-- partition their id belongs to. The unique partial index on unique_key goes (a partitioned
-- table cannot have it: 0027 moved the rule into job_unique). Then the partitions of
-- `p_ahead` intervals of `p_interval`. False when job is partitioned already.
CREATE FUNCTION job_partition_convert(p_interval interval, p_ahead integer) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE
    v_name    text;
    v_def     text;
    v_fn      text;
    v_acl     aclitem[];
    v_grantee oid;
    v_priv    text;
BEGIN
    IF job_partitioned() THEN
        RETURN false;
    END IF;
    LOCK TABLE job IN ACCESS EXCLUSIVE MODE;
    -- What points at job: re-made against the partitioned table at the end.
    ALTER TABLE job_dependency DROP CONSTRAINT job_dependency_depends_on_fkey;
    ALTER TABLE job_dependency DROP CONSTRAINT job_dependency_job_id_fkey;
    ALTER TABLE workflow_signal DROP CONSTRAINT workflow_signal_job_id_fkey;
    ALTER TABLE workflow_step DROP CONSTRAINT workflow_step_job_id_fkey;

    -- The triggers are made again on the partitioned table (row triggers reach every partition).
    DROP TRIGGER job_bundle_count_delete ON job;
    DROP TRIGGER job_bundle_count_update ON job;
    DROP TRIGGER job_dependency_deleted ON job;
    DROP TRIGGER job_floor_requeue ON job;
    DROP TRIGGER job_notify_due ON job;
    DROP TRIGGER job_notify_inserted ON job;
    DROP TRIGGER job_ordered_release ON job;
    DROP TRIGGER job_ordered_release_deleted ON job;
    DROP TRIGGER job_ordered_state ON job;
    DROP TRIGGER job_recount_waiting ON job;
    DROP TRIGGER job_release_dependents ON job;
    DROP TRIGGER job_tenant_type ON job;
    DROP TRIGGER job_unique_deleted ON job;
    DROP TRIGGER job_unique_rehold ON job;
    DROP TRIGGER job_unique_release ON job;
    DROP TRIGGER job_unique_take ON job;
    DROP TRIGGER job_unique_truncated ON job;
    DROP TRIGGER job_workflow_child_ended ON job;

    DROP INDEX job_unique_key_idx;

    ALTER TABLE job RENAME TO job_legacy;
    ALTER TABLE job_legacy RENAME CONSTRAINT job_pkey TO job_legacy_pkey;
    FOR v_name IN SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
                  WHERE x.indrelid = 'job_legacy'::regclass AND NOT x.indisprimary LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', v_name, 'job_legacy_' || substr(v_name, 5));
    END LOOP;

    CREATE TABLE job (LIKE job_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (id);
    ALTER TABLE job ADD CONSTRAINT job_pkey PRIMARY KEY (id);
    ALTER TABLE job ADD CONSTRAINT job_bundle_id_fkey FOREIGN KEY (bundle_id)
        REFERENCES job_bundle (id) ON DELETE CASCADE;

    -- Jobs the ranges do not cover: carried from a dropped partition, or an id out of every range.
    CREATE TABLE job_default (LIKE job INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.01,
          autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.02,
          autovacuum_vacuum_cost_limit = 2000);
    ALTER TABLE job ATTACH PARTITION job_default DEFAULT;

    -- Every id from now on moves to the partition its id names (the default one, or one
    -- job_partition_ensure makes below); job_legacy keeps the rest, no row copied.
    CREATE TEMP TABLE job_moved ON COMMIT DROP AS
    SELECT * FROM job_legacy WHERE id >= id_floor(now());
    DELETE FROM job_legacy WHERE id >= id_floor(now());
    -- a validated bound: ATTACH then needs no scan of its own
    EXECUTE format('ALTER TABLE job_legacy ADD CONSTRAINT job_legacy_bound CHECK (id < %L)',
                   id_floor(now()));
    EXECUTE format('ALTER TABLE job ATTACH PARTITION job_legacy FOR VALUES FROM (MINVALUE) TO (%L)',
                   id_floor(now()));
    ALTER TABLE job_legacy DROP CONSTRAINT job_legacy_bound;

    -- The indexes: job_legacy's own are attached, not built again; job_default's are made.
    CREATE INDEX job_bundle_idx ON job (bundle_id) WHERE bundle_id IS NOT NULL;
    CREATE INDEX job_claim_idx ON job (priority DESC, created_at, id)
        WHERE state = 'pending' AND waiting_on = 0 AND start_at <= created_at AND tenant IS NULL;
    CREATE INDEX job_debounce_key_idx ON job (debounce_key)
        WHERE debounce_key IS NOT NULL AND state IN ('pending', 'running');
    CREATE INDEX job_delayed_idx ON job (start_at, type)
        WHERE state = 'pending' AND waiting_on = 0 AND start_at > created_at;
    CREATE INDEX job_finished_idx ON job (state, stopped_at) WHERE stopped_at IS NOT NULL;
    CREATE INDEX job_ordered_idx ON job (ordered_key, ordered_seq)
        WHERE ordered_key IS NOT NULL AND state IN ('pending', 'running', 'failed');
    CREATE INDEX job_running_idx ON job (lease) WHERE state = 'running';
    CREATE INDEX job_tenant_idx ON job (type, tenant, priority DESC, created_at, id)
        WHERE state = 'pending' AND waiting_on = 0 AND start_at <= created_at AND tenant IS NOT NULL;
    CREATE INDEX job_unique_finished_idx ON job (unique_key, created_at DESC)
        WHERE unique_key IS NOT NULL AND stopped_at IS NOT NULL;
    CREATE INDEX job_unique_key_any_idx ON job (unique_key) WHERE unique_key IS NOT NULL;
    CREATE INDEX job_unusual_created_idx ON job (state, created_at, id)
        WHERE state IN ('failed', 'cancelled');

    INSERT INTO job SELECT * FROM job_moved;

    -- The triggers, as 0024 to 0027 made them.
    CREATE TRIGGER job_bundle_count_delete AFTER DELETE ON job
        REFERENCING OLD TABLE AS bundle_old_rows
        FOR EACH STATEMENT EXECUTE FUNCTION job_bundle_count_deleted();
    CREATE TRIGGER job_bundle_count_update AFTER UPDATE ON job
        REFERENCING OLD TABLE AS bundle_old_rows NEW TABLE AS bundle_new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION job_bundle_count_updated();
    CREATE TRIGGER job_dependency_deleted BEFORE DELETE ON job
        FOR EACH ROW WHEN (old.has_dependents) EXECUTE FUNCTION job_dependency_deleted();
    CREATE TRIGGER job_floor_requeue BEFORE UPDATE OF waiting_on, priority, start_at ON job
        FOR EACH ROW WHEN (new.state = 'pending' AND new.waiting_on = 0 AND new.tenant IS NULL
                           AND new.start_at <= new.created_at
                           AND (old.waiting_on > 0 OR old.priority <> new.priority
                                OR old.start_at > old.created_at))
        EXECUTE FUNCTION job_floor_requeue();
    CREATE TRIGGER job_notify_due AFTER UPDATE ON job
        REFERENCING NEW TABLE AS due_new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION job_notify_due();
    CREATE TRIGGER job_notify_inserted AFTER INSERT ON job
        REFERENCING NEW TABLE AS new_jobs
        FOR EACH STATEMENT EXECUTE FUNCTION job_notify_inserted();
    CREATE TRIGGER job_ordered_release AFTER UPDATE OF state ON job
        FOR EACH ROW WHEN (old.ordered_key IS NOT NULL AND old.waiting_on = 0
                           AND old.state IN ('pending', 'running')
                           AND new.state IN ('succeeded', 'cancelled'))
        EXECUTE FUNCTION job_ordered_release();
    CREATE TRIGGER job_ordered_release_deleted AFTER DELETE ON job
        FOR EACH ROW WHEN (old.ordered_key IS NOT NULL AND old.waiting_on = 0
                           AND old.state IN ('pending', 'running', 'failed'))
        EXECUTE FUNCTION job_ordered_release();
    CREATE TRIGGER job_ordered_state BEFORE UPDATE OF state ON job
        FOR EACH ROW WHEN (new.ordered_key IS NOT NULL AND old.state IS DISTINCT FROM new.state)
        EXECUTE FUNCTION job_ordered_state();
    CREATE TRIGGER job_recount_waiting BEFORE UPDATE OF state ON job
        FOR EACH ROW WHEN (new.depends_on IS NOT NULL AND old.state IS DISTINCT FROM new.state)
        EXECUTE FUNCTION job_recount_waiting();
    CREATE TRIGGER job_release_dependents AFTER UPDATE OF state ON job
        FOR EACH ROW WHEN (new.has_dependents
                           AND (old.state IN ('succeeded', 'failed', 'cancelled'))
                               IS DISTINCT FROM (new.state IN ('succeeded', 'failed', 'cancelled')))
        EXECUTE FUNCTION job_release_dependents();
    CREATE TRIGGER job_tenant_type AFTER INSERT ON job
        FOR EACH ROW WHEN (new.tenant IS NOT NULL) EXECUTE FUNCTION job_tenant_type();
    CREATE TRIGGER job_unique_deleted AFTER DELETE ON job
        FOR EACH ROW WHEN (old.unique_key IS NOT NULL AND old.state IN ('pending', 'running'))
        EXECUTE FUNCTION job_unique_release();
    CREATE TRIGGER job_unique_rehold AFTER UPDATE OF state, unique_key ON job
        FOR EACH ROW WHEN (new.unique_key IS NOT NULL AND new.state IN ('pending', 'running')
                           AND (old.state NOT IN ('pending', 'running')
                                OR old.unique_key IS DISTINCT FROM new.unique_key))
        EXECUTE FUNCTION job_unique_hold();
    CREATE TRIGGER job_unique_release AFTER UPDATE OF state, unique_key ON job
        FOR EACH ROW WHEN (old.unique_key IS NOT NULL AND old.state IN ('pending', 'running')
                           AND (new.state NOT IN ('pending', 'running')
                                OR new.unique_key IS DISTINCT FROM old.unique_key))
        EXECUTE FUNCTION job_unique_release();
    CREATE TRIGGER job_unique_take BEFORE INSERT ON job
        FOR EACH ROW WHEN (new.unique_key IS NOT NULL AND new.state IN ('pending', 'running'))
        EXECUTE FUNCTION job_unique_take();
    CREATE TRIGGER job_unique_truncated AFTER TRUNCATE ON job
        FOR EACH STATEMENT EXECUTE FUNCTION job_unique_truncated();
    CREATE TRIGGER job_workflow_child_ended AFTER UPDATE OF state ON job
        FOR EACH ROW WHEN (new.workflow_parent IS NOT NULL AND new.state <> old.state
                           AND new.state IN ('succeeded', 'failed', 'cancelled'))
        EXECUTE FUNCTION workflow_child_ended();

    ALTER TABLE job_dependency ADD CONSTRAINT job_dependency_depends_on_fkey
        FOREIGN KEY (depends_on) REFERENCES job (id) ON DELETE CASCADE;
    ALTER TABLE job_dependency ADD CONSTRAINT job_dependency_job_id_fkey
        FOREIGN KEY (job_id) REFERENCES job (id) ON DELETE CASCADE;
    ALTER TABLE workflow_signal ADD CONSTRAINT workflow_signal_job_id_fkey
        FOREIGN KEY (job_id) REFERENCES job (id) ON DELETE CASCADE;
    ALTER TABLE workflow_step ADD CONSTRAINT workflow_step_job_id_fkey
        FOREIGN KEY (job_id) REFERENCES job (id) ON DELETE CASCADE;

    -- The privileges the table had (roles.sql's, users' own), on the table and its columns.
    FOR v_grantee, v_priv IN
        SELECT a.grantee, a.privilege_type
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
        WHERE c.oid = 'job_legacy'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON job TO %s', v_priv,
                       CASE WHEN v_grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(v_grantee)) END);
    END LOOP;
    FOR v_name, v_grantee, v_priv IN
        SELECT t.attname::text, a.grantee, a.privilege_type
        FROM pg_attribute t CROSS JOIN LATERAL aclexplode(t.attacl) a
        WHERE t.attrelid = 'job_legacy'::regclass AND t.attacl IS NOT NULL
    LOOP
        EXECUTE format('GRANT %s (%I) ON job TO %s', v_priv, v_name,
                       CASE WHEN v_grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(v_grantee)) END);
    END LOOP;

    -- A function that takes or returns the table's row type (enqueue_checked, job_fresh) has
    -- job_legacy's now (a function's types are types, not names): each made again with the
    -- partitioned table's, with the privileges it had.
    FOR v_fn, v_def, v_acl IN
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl
        FROM pg_proc p
        JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
        WHERE d.refclassid = 'pg_type'::regclass AND d.refobjid = 'job_legacy'::regtype
    LOOP
        EXECUTE 'DROP FUNCTION ' || v_fn;
        EXECUTE regexp_replace(v_def, '\mjob_legacy\M', 'job', 'g');
        v_fn := regexp_replace(v_fn, '\mjob_legacy\M', 'job', 'g');
        IF v_acl IS NOT NULL THEN
            EXECUTE 'REVOKE ALL ON FUNCTION ' || v_fn || ' FROM PUBLIC';
            FOR v_grantee IN SELECT a.grantee FROM aclexplode(v_acl) a
                             WHERE a.privilege_type = 'EXECUTE' LOOP
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', v_fn,
                               CASE WHEN v_grantee = 0 THEN 'PUBLIC'
                                    ELSE quote_ident(pg_get_userbyid(v_grantee)) END);
            END LOOP;
        END IF;
    END LOOP;
    PERFORM job_partition_name_indexes('job_default');
    PERFORM job_partition_ensure(p_interval, p_ahead);
    RETURN true;
END $fn$;

-- Partition maintenance runs as the schema's owner: it makes, detaches and drops partitions,
-- DDL a worker role may not run (pgq_supervisor/sql/roles.sql grants the worker these three,
-- and neither the producer nor the dashboard).
ALTER FUNCTION job_partition_ensure(interval, integer) SECURITY DEFINER;
ALTER FUNCTION job_partition_clean(interval, interval, uuid, boolean) SECURITY DEFINER;
ALTER FUNCTION job_partition_expire(interval, interval, integer, interval, uuid) SECURITY DEFINER;
REVOKE EXECUTE ON FUNCTION job_partition_ensure(interval, integer),
    job_partition_clean(interval, interval, uuid, boolean),
    job_partition_expire(interval, interval, integer, interval, uuid),
    job_partition_convert(interval, integer) FROM PUBLIC;
