-- pgq_supervisor schema, version 20 (issue 26): durable workflows. A workflow is a job whose
-- handler replays from the start on every run; what it already did is read back from
-- workflow_step, one row per step in the order the code reached them (seq), so a replay returns
-- the stored result instead of running the step again. A step row is written fenced by the
-- job's lease (workflow_record, queries.sql), and a step that writes through `conn` commits its
-- effects in the same transaction as its row: (job_id, seq) is the primary key, so a stale
-- worker's second write of one step fails and rolls its effects back.
CREATE TABLE workflow_step (
    job_id uuid NOT NULL REFERENCES job (id) ON DELETE CASCADE,
    seq integer NOT NULL CHECK (seq >= 0),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    kind text NOT NULL CHECK (kind IN ('step', 'sleep', 'wait', 'enqueue', 'patch')),
    -- succeeded/failed end a step; retrying (a failed try, due again at wake_at), sleeping and
    -- waiting are the workflow's current pause
    state text NOT NULL CHECK (state IN ('succeeded', 'failed', 'retrying', 'sleeping', 'waiting',
                                   'timed_out')),
    result jsonb,
    error text,
    tries integer NOT NULL DEFAULT 0 CHECK (tries >= 0),
    wake_at timestamptz,  -- a sleep's end, a wait's deadline (NULL: none)
    duration double precision,  -- seconds its function took, the last try
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (job_id, seq)
);

-- The workflows paused now (sleeping, waiting, retrying a step), for the metrics: the paused
-- rows only, a handful per workflow asleep, whatever its history's length.
CREATE INDEX workflow_step_paused_idx ON workflow_step (job_id)
    WHERE state IN ('sleeping', 'waiting', 'retrying');

-- Signals sent to a job (pgq.signal), kept until the job is deleted: one sent before its wait
-- is reached is there when it is. The first signal of a name wins.
CREATE TABLE workflow_signal (
    job_id uuid NOT NULL REFERENCES job (id) ON DELETE CASCADE,
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    payload jsonb,
    sent_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);

-- A workflow's child (ctx.enqueue): its end is signalled to the parent as 'job:<child id>'.
ALTER TABLE job ADD COLUMN workflow_parent uuid;

-- Send the signal `p_name` to the job `p_job`: kept (false if that name was already sent), and
-- the job made due now if it is pending, waiting for that name. The job's row is locked first:
-- a worker putting the job to sleep (workflow_suspend) either finished before (we see it
-- pending and wake it) or waits for our commit and then sees the signal. NULL: no such job.
CREATE FUNCTION workflow_signal(p_job uuid, p_name text, p_payload jsonb)
RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    j record;
BEGIN
    SELECT id, type, state INTO j FROM job WHERE id = p_job FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO workflow_signal (job_id, name, payload) VALUES (p_job, p_name, p_payload)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF j.state = 'pending' AND EXISTS (
        SELECT 1 FROM workflow_step s
        WHERE s.job_id = p_job AND s.name = p_name AND s.state = 'waiting'
    ) THEN
        UPDATE job SET start_at = now(), updated_at = now()
        WHERE id = p_job AND start_at > now();
        PERFORM pg_notify('pgq_job_available', j.type);
    END IF;
    RETURN true;
END $$;

-- A child's end wakes its parent workflow. Row trigger on children only (WHEN), so other
-- completions pay nothing but the WHEN test.
CREATE FUNCTION workflow_child_ended() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM workflow_signal(NEW.workflow_parent, 'job:' || NEW.id::text,
                            jsonb_build_object('state', NEW.state, 'result', NEW.result,
                                               'error', NEW.error_msg));
    RETURN NULL;
END $$;

CREATE TRIGGER job_workflow_child_ended AFTER UPDATE OF state ON job FOR EACH ROW
    WHEN (NEW.workflow_parent IS NOT NULL AND NEW.state <> OLD.state
          AND NEW.state IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION workflow_child_ended();

-- The workflow `p_id` held under `p_lease` sleeps or waits: pending again, due in `p_delay`
-- seconds, no attempt counted (as snooze_job, without its limit: a workflow may sleep as often
-- as its code says). Waiting for the signal `p_wait`: if it was sent meanwhile (the row lock
-- taken by the UPDATE orders us after any workflow_signal that held it, and the next
-- statement's snapshot sees its commit), due now. Rows as end_attempt's; none: lease lost.
CREATE FUNCTION workflow_suspend(p_id uuid, p_lease uuid, p_delay double precision, p_wait text)
RETURNS TABLE(job_id uuid, job_type text, new_state job_state, retry_count integer)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r record;
    due timestamptz;
BEGIN
    UPDATE job j SET
        state = 'pending',
        start_at = now() + make_interval(secs => p_delay),
        started_at = NULL, worker_id = NULL, worker_alive_at = NULL, lease = NULL,
        updated_at = now()
    WHERE j.id = p_id AND j.state = 'running' AND j.lease = p_lease
    RETURNING j.id, j.type, j.state, j.current_retry_count, j.start_at INTO r;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    due := r.start_at;
    IF p_wait IS NOT NULL AND EXISTS (
        SELECT 1 FROM workflow_signal s WHERE s.job_id = p_id AND s.name = p_wait
    ) THEN
        UPDATE job SET start_at = now() WHERE id = p_id;
        due := now();
    END IF;
    IF due <= now() THEN
        PERFORM pg_notify('pgq_job_available', r.type);
    END IF;
    job_id := r.id; job_type := r.type; new_state := r.state; retry_count := r.current_retry_count;
    RETURN NEXT;
END $$;
