-- pgq_supervisor schema, version 26 (issue 40, item 2): every delayed job is announced when
-- it is written, whoever writes it.
-- A supervisor learned when the earliest delayed job of its types comes due by asking
-- (next_due) once per poll_interval: a retry's backoff, a snooze or a workflow's sleep written
-- by a child after that question waited for the next one (a 0.5 s backoff started 2 s late on
-- an idle queue), and so did a job enqueued with a start_at. Now each statement that makes
-- jobs pending with a start_at in the future (an enqueue, a retry, a snooze, a sleep, a reset
-- or release to a later time, users' own SQL) notifies pgq_job_due once per type, with the
-- seconds until the earliest of them and the type: `<seconds> <type>`. The seconds are counted
-- from the end of the statement; the commit and the delivery come after it, so they can make
-- the wake-up late (by as long as the writer's transaction stays open after the statement),
-- never early, and a supervisor's clock need not agree with the server's.
-- A supervisor serving the type arms its due-wake timer for that time. Like
-- pgq_job_available it is a hint: the poll still asks next_due, and a wake-up that finds
-- nothing claims nothing.
-- The insert trigger of 0001/0005 already reads the statement's new rows; the update trigger
-- is a statement trigger over the new rows, like the bundle counters' of 0024 (the same
-- transition table: PostgreSQL captures it once per statement for both).

CREATE OR REPLACE FUNCTION job_notify_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify('pgq_job_available', t.type)
    FROM (SELECT DISTINCT n.type FROM new_jobs n
          WHERE n.state = 'pending' AND n.waiting_on = 0 AND n.start_at <= now()) t;
    PERFORM pg_notify('pgq_job_due', round(extract(epoch FROM min(n.start_at)
                                                          - clock_timestamp()), 3) || ' ' || n.type)
    FROM new_jobs n
    WHERE n.state = 'pending' AND n.waiting_on = 0 AND n.start_at > now()
    GROUP BY n.type;
    RETURN NULL;
END $$;

CREATE FUNCTION job_notify_due() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify('pgq_job_due', round(extract(epoch FROM min(n.start_at)
                                                          - clock_timestamp()), 3) || ' ' || n.type)
    FROM due_new_rows n
    WHERE n.state = 'pending' AND n.waiting_on = 0 AND n.start_at > now()
    GROUP BY n.type;
    RETURN NULL;
END $$;

CREATE TRIGGER job_notify_due AFTER UPDATE ON job
    REFERENCING NEW TABLE AS due_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION job_notify_due();
