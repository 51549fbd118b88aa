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
-- On INSERT, the statement trigger of 0001/0005 (job_notify_inserted) already reads the new
-- rows: it now sends both notifications from one pass over them. On UPDATE a statement
-- trigger reads the new rows (captured once per statement for it and the bundle counters' of
-- 0024). Both send pgq_job_due through job_notify_due_of.

-- pgq_job_due for each type of `p_types` whose earliest delayed job is `p_due` (same order).
CREATE FUNCTION job_notify_due_of(p_types text[], p_due timestamptz[]) RETURNS void
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
    SELECT count(pg_notify('pgq_job_due',
                           round(extract(epoch FROM d.due - clock_timestamp()), 3) || ' ' || d.type))
    FROM unnest(p_types, p_due) AS d(type, due)
$$;

CREATE OR REPLACE FUNCTION job_notify_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    due_types text[];
    due_at    timestamptz[];
BEGIN
    WITH t AS (
        SELECT n.type, bool_or(n.start_at <= now()) AS ready,
               min(n.start_at) FILTER (WHERE n.start_at > now()) AS due
        FROM new_jobs n WHERE n.state = 'pending' AND n.waiting_on = 0
        GROUP BY n.type
    ), sent AS (
        SELECT count(pg_notify('pgq_job_available', t.type)) AS n FROM t WHERE t.ready
    )
    SELECT array_agg(t.type), array_agg(t.due) INTO due_types, due_at
    FROM t WHERE t.due IS NOT NULL AND (SELECT s.n FROM sent s) >= 0;
    IF due_types IS NOT NULL THEN
        PERFORM job_notify_due_of(due_types, due_at);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION job_notify_due() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    due_types text[];
    due_at    timestamptz[];
BEGIN
    SELECT array_agg(t.type), array_agg(t.due) INTO due_types, due_at
    FROM (SELECT n.type, min(n.start_at) AS due FROM due_new_rows n
          WHERE n.state = 'pending' AND n.waiting_on = 0 AND n.start_at > now()
          GROUP BY n.type) t;
    IF due_types IS NOT NULL THEN
        PERFORM job_notify_due_of(due_types, due_at);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER job_notify_due AFTER UPDATE ON job
    REFERENCING NEW TABLE AS due_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION job_notify_due();
