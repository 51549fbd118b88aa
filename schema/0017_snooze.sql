-- pgq_supervisor schema, version 17 (issue 24): a handler may snooze its job (raise or return
-- pgq.Snooze(seconds)): the job goes back to pending, due after the delay, without counting an
-- attempt. `snoozes` counts them since the job was enqueued or last reset, against the type's
-- max_snoozes; each snooze is also kept in the attempt history (kind 'snoozed', its delay).
-- Adding a NOT NULL column with a constant default rewrites nothing (PostgreSQL >= 11).
ALTER TABLE job ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
ALTER TABLE job ADD CONSTRAINT job_snoozes_range CHECK (snoozes >= 0);

-- Snooze the job `p_id` held under `p_lease` (fenced as end_attempt: nothing happens to a job
-- the worker no longer holds). Within `p_max_snoozes`: back to pending, due in `p_delay`
-- seconds, the attempt number unchanged. Past it: ends the attempt as end_attempt does with
-- kind 'permanent' and `p_error` (failed, no retry: a handler that keeps snoozing is waiting
-- for something that does not come, and retrying would wait the same way).
-- Rows as end_attempt's (no row: the lease was lost).
CREATE FUNCTION snooze_job(p_id uuid, p_lease uuid, p_delay double precision,
                           p_max_snoozes integer, p_error text)
RETURNS TABLE(job_id uuid, job_type text, new_state job_state, retry_count integer)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r record;
BEGIN
    UPDATE job j SET
        state = 'pending',
        snoozes = j.snoozes + 1,
        start_at = now() + make_interval(secs => p_delay),
        started_at = NULL, worker_id = NULL, worker_alive_at = NULL, lease = NULL,
        attempts = j.attempts || jsonb_build_array(jsonb_build_object(
            'attempt', j.current_retry_count + 1, 'kind', 'snoozed', 'delay', p_delay,
            'snooze', j.snoozes + 1, 'worker', j.worker_id, 'started_at', j.started_at,
            'at', now())),
        updated_at = now()
    WHERE j.id = p_id AND j.state = 'running' AND j.lease = p_lease AND j.snoozes < p_max_snoozes
    RETURNING j.id, j.type, j.state, j.current_retry_count INTO r;
    IF FOUND THEN
        job_id := r.id; job_type := r.type; new_state := r.state; retry_count := r.current_retry_count;
        IF p_delay <= 0 THEN
            PERFORM pg_notify('pgq_job_available', r.type);
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM end_attempt(ARRAY[p_id], p_lease, NULL, p_error,
                                           jsonb_build_object('exception', 'Snooze'),
                                           'permanent', false, 0);
END $$;
