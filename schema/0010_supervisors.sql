-- pgq_supervisor schema, version 10: what the dashboard (pgq_supervisor.web) and the
-- `workers` command read.
--
-- supervisor: each running supervisor's row, upserted on a maintenance timer ("register",
-- every heartbeat_interval) and deleted on a clean exit; a row not seen for long is stale (its
-- supervisor was killed) and the next upsert of any supervisor deletes it after an hour.
CREATE TABLE supervisor (
    id         text PRIMARY KEY,
    host       text NOT NULL,
    pid        integer NOT NULL,
    procs      integer NOT NULL,
    types      text[] NOT NULL,
    started_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL DEFAULT now(),
    -- one object per child: index, pid, state, job_id, job_type, jobs_done
    children   jsonb NOT NULL DEFAULT '[]'
);

-- The jobs page lists newest first, by keyset (created_at, id), never OFFSET. A full index
-- costs every insert and every state change an entry (a state change is never a HOT update:
-- job_finished_idx and job_claim_idx cover state); two of them, (created_at, id) and (type,
-- created_at, id), cost the no-op drain a fifth of its throughput. So they are not created
-- here: `python -m pgq_supervisor dashboard-indexes` creates them (CONCURRENTLY) where the
-- dashboard's Jobs page must stay fast over millions of rows (queries.sql,
-- dashboard_index_created). What costs the hot path nothing stays: the state filter's index
-- is partial, of the states a job rarely ends in, failed and cancelled (what an on-call
-- engineer looks for), which pending -> running -> succeeded never writes; and the search by
-- unique_key over every state covers only jobs that have one.
CREATE INDEX job_unusual_created_idx ON job (state, created_at, id)
    WHERE state IN ('failed', 'cancelled');
-- search by unique_key over every state (job_unique_key_idx covers unfinished jobs only)
CREATE INDEX job_unique_key_any_idx ON job (unique_key) WHERE unique_key IS NOT NULL;

-- Each attempt in the history keeps its traceback (error_data keeps only the last one's), so
-- the dashboard shows every attempt's. As in 0001 otherwise.
CREATE OR REPLACE FUNCTION end_attempt(p_ids uuid[], p_lease uuid, p_worker text, p_error text,
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
                'worker', j.worker_id, 'started_at', j.started_at, 'at', now())
                || CASE WHEN p_error_data ? 'traceback'
                        THEN jsonb_build_object('traceback', p_error_data -> 'traceback')
                        ELSE '{}'::jsonb END),
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
