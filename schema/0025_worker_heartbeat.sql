-- pgq_supervisor schema, version 25 (issue 35, storage, step 2): heartbeats per child, not per job.
-- A child's heartbeat thread rewrote worker_alive_at on every job it held, once a second: a
-- version of the job's wide row per held job per beat, HOT only when the row's page had room
-- (one beat in five, benchmarks/lifecycle_wal.py: 430 B of WAL a job a beat). Now it beats
-- one row of its own, `worker` (one per child incarnation, keyed by the worker_id its jobs
-- carry), and a running job is alive while the later of its claim's stamp (worker_alive_at,
-- written by the claim as before) and its owner's alive_at is younger than dead_after. The
-- rescuers (queries.sql: rescue, rescue_orphans) and the readers of worker_alive_at (get_job,
-- show, the dashboard) take that later time; the column itself is the claim's.
-- A supervisor of a version before this one judges jobs by worker_alive_at alone: while one
-- is registered (a rolling upgrade), children also beat their jobs' rows as before. New
-- supervisors say they know better (child_beats); an old one's row says nothing (false).
CREATE TABLE worker (
    id       text PRIMARY KEY CHECK (char_length(id) BETWEEN 1 AND 200),
    alive_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 20);  -- room on the page: each beat is a HOT update (nothing indexes alive_at)

ALTER TABLE supervisor ADD COLUMN child_beats boolean NOT NULL DEFAULT false;

-- When a running job was last known alive: the later of its claim's stamp and its owner's
-- last beat (NULL for a job that is not running). What users' own SQL should read where it
-- read worker_alive_at: SELECT pgq.job_alive_at(j.state, j.worker_alive_at, j.worker_id) ...
CREATE FUNCTION job_alive_at(p_state job_state, p_alive timestamptz, p_worker text)
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT CASE WHEN p_state = 'running' THEN
        greatest(p_alive, (SELECT w.alive_at FROM worker w WHERE w.id = p_worker))
    END
$$;
