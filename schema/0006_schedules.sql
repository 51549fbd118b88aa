-- pgq_supervisor schema, version 6: periodic schedules.
-- One row per schedule a supervisor declared (its definition, for the CLI) and the last tick
-- enqueued. The row is the referee between supervisors: a tick is enqueued by the statement
-- that moves last_tick forward to it (UPDATE ... WHERE last_tick < tick, with the job's INSERT
-- in the same statement), so however many supervisors try, each tick passes once. Rows of
-- schedules removed from the code are kept (the CLI shows them); nothing fires for them.
CREATE TABLE schedule (
    name text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 100),
    type text NOT NULL CHECK (char_length(type) BETWEEN 1 AND 100),
    cron text,
    every interval,
    timezone text NOT NULL,
    priority integer NOT NULL,
    catch_up integer NOT NULL CHECK (catch_up >= 0),
    -- ticks before this are not due: a new schedule starts with its next tick
    created_at timestamptz NOT NULL DEFAULT now(),
    -- when a supervisor last declared it (started with it in its registry)
    declared_at timestamptz NOT NULL DEFAULT now(),
    last_tick timestamptz,
    last_job_id uuid,  -- no foreign key: finished jobs are pruned
    CONSTRAINT schedule_cron_or_every CHECK ((cron IS NULL) <> (every IS NULL))
);
