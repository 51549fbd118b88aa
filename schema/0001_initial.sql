-- pgq_supervisor schema, version 1.
-- Runs with search_path set to the target schema (see pgq_supervisor/schema.py), so every
-- name here is unqualified; functions capture that search_path with SET search_path FROM CURRENT.

CREATE TYPE job_state AS ENUM ('pending', 'running', 'succeeded', 'failed', 'cancelled');

CREATE TABLE job_bundle (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    type             text NOT NULL CHECK (char_length(type) BETWEEN 1 AND 100),
    origin           text,
    num_jobs         integer NOT NULL CHECK (num_jobs >= 0),
    num_jobs_stopped integer NOT NULL DEFAULT 0,
    -- job type enqueued once, in the completing transaction, when the bundle completes
    on_complete      text CHECK (on_complete IS NULL OR char_length(on_complete) BETWEEN 1 AND 100),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_bundle_counter_range CHECK (num_jobs_stopped BETWEEN 0 AND num_jobs)
);

CREATE TABLE job (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    bundle_id           uuid REFERENCES job_bundle (id) ON DELETE CASCADE,
    type                text NOT NULL CHECK (char_length(type) BETWEEN 1 AND 100),
    payload             jsonb NOT NULL,
    priority            integer NOT NULL DEFAULT 0,
    origin              text,
    state               job_state NOT NULL DEFAULT 'pending',
    -- NULL until claimed means "the handler's default"; the claim fills it in
    max_retry_count     integer CHECK (max_retry_count >= 0),
    current_retry_count integer NOT NULL DEFAULT 0,
    start_at            timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    stopped_at          timestamptz,
    worker_alive_at     timestamptz,
    worker_id           text,
    -- fencing token: a new value on every claim; every worker write must present it
    lease               uuid,
    timeout             double precision CHECK (timeout IS NULL OR timeout > 0),
    unique_key          text,
    result              jsonb,
    error_msg           text,
    error_data          jsonb,
    -- one object per failed attempt: attempt, error, at, worker; never overwritten
    attempts            jsonb NOT NULL DEFAULT '[]'::jsonb,
    -- the claim's FIFO key: clock_timestamp(), not now(), so jobs enqueued by one transaction
    -- (or one bulk statement) keep their order instead of tying and falling back to random ids
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_retry_range CHECK (current_retry_count BETWEEN 0 AND max_retry_count),
    CONSTRAINT job_running_is_started
        CHECK ((state = 'running') = (started_at IS NOT NULL AND stopped_at IS NULL)),
    CONSTRAINT job_terminal_is_stopped
        CHECK ((state IN ('succeeded', 'failed', 'cancelled')) = (stopped_at IS NOT NULL)),
    CONSTRAINT job_pending_is_unclaimed
        CHECK (state <> 'pending' OR (started_at IS NULL AND worker_alive_at IS NULL
                                      AND worker_id IS NULL AND lease IS NULL)),
    CONSTRAINT job_heartbeat_only_running CHECK (worker_alive_at IS NULL OR state = 'running'),
    CONSTRAINT job_running_has_lease
        CHECK (state <> 'running' OR (lease IS NOT NULL AND worker_id IS NOT NULL
                                      AND worker_alive_at IS NOT NULL
                                      AND max_retry_count IS NOT NULL)),
    CONSTRAINT job_failed_has_error CHECK (state <> 'failed' OR error_msg IS NOT NULL)
);

-- The claim walks this index in order; type and start_at are filtered on the way.
-- Putting type first made type = ANY(...) claims scan and sort every pending row.
CREATE INDEX job_claim_idx ON job (priority DESC, created_at, id) WHERE state = 'pending';
CREATE UNIQUE INDEX job_unique_key_idx ON job (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('pending', 'running');
CREATE INDEX job_bundle_idx ON job (bundle_id) WHERE bundle_id IS NOT NULL;
-- Serves the rescuer and the reaper. No column here changes on a heartbeat, so heartbeats stay HOT.
CREATE INDEX job_running_idx ON job (worker_id) WHERE state = 'running';

-- Dead tuples slow the claim down; vacuum the queue table early and often.
ALTER TABLE job SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
                     autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_limit = 2000,
                     fillfactor = 90);

-- One notification per statement and job type, never one per row.
CREATE FUNCTION job_notify_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify('pgq_job_available', t.type)
    FROM (SELECT DISTINCT n.type FROM new_jobs n
          WHERE n.state = 'pending' AND n.start_at <= now()) t;
    RETURN NULL;
END $$;

CREATE TRIGGER job_notify_inserted AFTER INSERT ON job
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_notify_inserted();

-- Keeps num_jobs_stopped equal to the number of terminal jobs of the bundle, whatever path the
-- state changed by. The UPDATE takes a blocking row lock on the bundle (never SKIP LOCKED):
-- every completion must count. When the counter reaches num_jobs, the same transaction
-- notifies and enqueues the completion job, so the callback is durable and exactly-once.
CREATE FUNCTION job_bundle_count() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    b_id       uuid;
    d_stopped  integer := 0;
    d_jobs     integer := 0;
    was_done   boolean;
    b          job_bundle%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN
        b_id := OLD.bundle_id;
        d_jobs := -1;
        IF OLD.state IN ('succeeded', 'failed', 'cancelled') THEN
            d_stopped := -1;
        END IF;
    ELSE
        b_id := NEW.bundle_id;
        IF NEW.state IN ('succeeded', 'failed', 'cancelled') THEN
            d_stopped := 1;
        ELSE
            d_stopped := -1;
        END IF;
    END IF;

    SELECT * INTO b FROM job_bundle WHERE id = b_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;  -- the bundle itself is being deleted (cascade)
    END IF;
    was_done := b.num_jobs > 0 AND b.num_jobs_stopped = b.num_jobs;

    UPDATE job_bundle
    SET num_jobs_stopped = num_jobs_stopped + d_stopped,
        num_jobs = num_jobs + d_jobs,
        updated_at = now()
    WHERE id = b_id
    RETURNING * INTO b;

    IF NOT was_done AND b.num_jobs > 0 AND b.num_jobs_stopped = b.num_jobs THEN
        PERFORM pg_notify('pgq_bundle_stopped', b.id::text);
        IF b.on_complete IS NOT NULL THEN
            INSERT INTO job (type, payload, origin)
            VALUES (b.on_complete, jsonb_build_object('bundle_id', b.id),
                    coalesce(b.origin, 'bundle:' || b.type));
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER job_bundle_count_update AFTER UPDATE OF state ON job
    FOR EACH ROW
    WHEN (NEW.bundle_id IS NOT NULL
          AND (OLD.state IN ('succeeded', 'failed', 'cancelled'))
              IS DISTINCT FROM (NEW.state IN ('succeeded', 'failed', 'cancelled')))
    EXECUTE FUNCTION job_bundle_count();

CREATE TRIGGER job_bundle_count_delete AFTER DELETE ON job
    FOR EACH ROW WHEN (OLD.bundle_id IS NOT NULL)
    EXECUTE FUNCTION job_bundle_count();

-- Ends the current attempt of running jobs as a failure: back to pending after retry_delay while
-- attempts are left and p_allow_retry, else failed. The error is appended to the attempt
-- history. Filters: p_lease (a worker's own write: fencing) and p_worker (the reaper).
-- Returns the jobs it changed; notifies pgq_job_available for those that are eligible again at
-- once and pgq_job_stopped (ids, at most 200 per payload) for those that failed for good.
CREATE FUNCTION end_attempt(p_ids uuid[], p_lease uuid, p_worker text, p_error text,
                            p_error_data jsonb, p_kind text, p_allow_retry boolean,
                            p_retry_delay double precision)
RETURNS TABLE (job_id uuid, job_type text, new_state job_state, retry_count integer)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r record;
    ready text[] := ARRAY[]::text[];
    stopped uuid[] := ARRAY[]::uuid[];
BEGIN
    FOR r IN
        UPDATE job j SET
            state = CASE WHEN p_allow_retry AND j.current_retry_count < j.max_retry_count
                         THEN 'pending' ELSE 'failed' END::job_state,
            current_retry_count = j.current_retry_count
                + (p_allow_retry AND j.current_retry_count < j.max_retry_count)::int,
            start_at = CASE WHEN p_allow_retry AND j.current_retry_count < j.max_retry_count
                            THEN now() + make_interval(secs => p_retry_delay) ELSE j.start_at END,
            started_at = CASE WHEN p_allow_retry AND j.current_retry_count < j.max_retry_count
                              THEN NULL ELSE j.started_at END,
            stopped_at = CASE WHEN p_allow_retry AND j.current_retry_count < j.max_retry_count
                              THEN NULL ELSE now() END,
            worker_id = CASE WHEN p_allow_retry AND j.current_retry_count < j.max_retry_count
                             THEN NULL ELSE j.worker_id END,
            worker_alive_at = NULL,
            lease = NULL,
            error_msg = p_error,
            error_data = p_error_data,
            attempts = j.attempts || jsonb_build_array(jsonb_build_object(
                'attempt', j.current_retry_count + 1, 'kind', p_kind, 'error', p_error,
                'worker', j.worker_id, 'started_at', j.started_at, 'at', now())),
            updated_at = now()
        WHERE j.id = ANY(p_ids) AND j.state = 'running'
          AND (p_lease IS NULL OR j.lease = p_lease)
          AND (p_worker IS NULL OR j.worker_id = p_worker)
        RETURNING j.id, j.type, j.state, j.current_retry_count, j.start_at
    LOOP
        job_id := r.id; job_type := r.type; new_state := r.state;
        retry_count := r.current_retry_count;
        IF r.state = 'pending' AND r.start_at <= now() THEN
            ready := array_append(ready, r.type);
        ELSIF r.state = 'failed' THEN
            stopped := array_append(stopped, r.id);
        END IF;
        RETURN NEXT;
    END LOOP;
    PERFORM pg_notify('pgq_job_available', t.type) FROM (SELECT DISTINCT unnest(ready) AS type) t;
    PERFORM pg_notify('pgq_job_stopped', string_agg(k.id::text, ','))
    FROM (SELECT id, (row_number() OVER () - 1) / 200 AS chunk FROM unnest(stopped) AS id) k
    GROUP BY k.chunk;
END $$;

-- Puts running jobs back to pending without consuming an attempt (graceful shutdown, jobs a
-- dead child had claimed but not started). Same filters as end_attempt; p_ids NULL = all.
CREATE FUNCTION release_jobs(p_ids uuid[], p_lease uuid, p_worker text)
RETURNS SETOF uuid
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r record;
    ready text[] := ARRAY[]::text[];
BEGIN
    FOR r IN
        UPDATE job j SET state = 'pending', start_at = now(), started_at = NULL,
                         worker_alive_at = NULL, worker_id = NULL, lease = NULL,
                         updated_at = now()
        WHERE j.state = 'running'
          AND (p_ids IS NULL OR j.id = ANY(p_ids))
          AND (p_lease IS NULL OR j.lease = p_lease)
          AND (p_worker IS NULL OR j.worker_id = p_worker)
        RETURNING j.id, j.type
    LOOP
        ready := array_append(ready, r.type);
        RETURN NEXT r.id;
    END LOOP;
    PERFORM pg_notify('pgq_job_available', t.type) FROM (SELECT DISTINCT unnest(ready) AS type) t;
END $$;
