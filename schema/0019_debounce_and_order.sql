-- pgq_supervisor schema, version 19 (issue 24): debounce, and strict order per key (below).
-- Debounce: `enqueue(..., unique_key=K,
-- replace=True)` replaces the payload, start_at and priority of the pending job that holds K
-- instead of being ignored. A running holder is never touched: the new job is dropped (its id
-- is the running job's), or waits behind it (`replace_running="wait"`, the default): it is
-- inserted depending on the running job (it runs once that one ends, however it ends) and
-- holds K in `debounce_key`, since job_unique_key_idx lets one unfinished job hold
-- `unique_key`. Later debounced enqueues of K replace the payload of the job that waits.
ALTER TABLE job ADD COLUMN debounce_key text;
CREATE INDEX job_debounce_key_idx ON job (debounce_key)
    WHERE debounce_key IS NOT NULL AND state IN ('pending', 'running');

-- Under the key's lock (the advisory lock of unique_holders, schema/0018: windowed and
-- debounced producers of one key serialise on it, held to the end of the caller's
-- transaction), the job that holds K now:
--   ('replaced', id): a pending holder (the one waiting behind a running job first) now has
--     the new payload, start_at and priority;
--   ('running', id): the holder is running (untouched): the caller drops its job or makes it
--     wait behind this one;
--   no row: nobody holds K, insert the job.
-- The update re-checks `state = 'pending'` after waiting for a claim that holds the row: a job
-- claimed meanwhile is found running by the next statement (its own, newer snapshot).
CREATE FUNCTION debounce_holder(p_key text, p_payload jsonb, p_start_at timestamptz,
                                p_priority integer)
RETURNS TABLE(action text, id uuid)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    found_id uuid;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(current_schema() || ':unique:' || p_key, 0));
    UPDATE job j SET payload = p_payload, start_at = coalesce(p_start_at, now()),
                     priority = p_priority, updated_at = now()
    WHERE j.id = coalesce(
            (SELECT x.id FROM job x
             WHERE x.debounce_key = p_key AND x.state = 'pending' LIMIT 1),
            (SELECT x.id FROM job x WHERE x.unique_key = p_key AND x.state = 'pending'))
      AND j.state = 'pending'
    RETURNING j.id INTO found_id;
    IF found_id IS NOT NULL THEN
        action := 'replaced'; id := found_id; RETURN NEXT; RETURN;
    END IF;
    SELECT x.id INTO found_id FROM job x
    WHERE x.state = 'running' AND (x.unique_key = p_key OR x.debounce_key = p_key)
    ORDER BY x.created_at DESC LIMIT 1;
    IF found_id IS NOT NULL THEN
        action := 'running'; id := found_id; RETURN NEXT;
    END IF;
END $$;

-- Strict order per key: `enqueue(..., ordered_key=K)`. The jobs of one key run one at a time,
-- in enqueue order: the order in which their enqueues took the key's lock, kept as
-- `ordered_seq` (a sequence drawn under that lock; created_at cannot say it: it is each
-- transaction's start, and a producer that started first may link its job after another's).
-- Only the key's head (its earliest job that is pending, running or failed)
-- has waiting_on = 0; each job behind it waits with waiting_on = 1, out of job_claim_idx, so
-- the claim never looks at them and is unchanged. When the head succeeds, is cancelled or is
-- deleted, the next one (oldest first) is released; a failed head blocks the key until it is
-- reset (it runs again as the head) or deleted. Producers, releases and resets of a key
-- serialise on the key's advisory lock, so a job inserted behind a head that is finishing
-- meanwhile is either seen by that release or sees the head gone.
ALTER TABLE job ADD COLUMN ordered_key text;
ALTER TABLE job ADD COLUMN ordered_seq bigint;
ALTER TABLE job ADD CONSTRAINT job_ordered_key_length
    CHECK (ordered_key IS NULL OR char_length(ordered_key) BETWEEN 1 AND 200);
CREATE SEQUENCE job_ordered_seq;
CREATE INDEX job_ordered_idx ON job (ordered_key, ordered_seq)
    WHERE ordered_key IS NOT NULL AND state IN ('pending', 'running', 'failed');

CREATE FUNCTION ordered_lock(p_key text) RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || ':ordered:' || p_key, 0))
$$;

-- Does a job of the key other than `p_id` hold its head (running, failed, or pending and not
-- waiting)? Called under the key's lock.
CREATE FUNCTION ordered_blocked(p_key text, p_id uuid) RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT EXISTS (
        SELECT 1 FROM job x
        WHERE x.ordered_key = p_key AND x.id <> p_id
          AND x.state IN ('pending', 'running', 'failed')
          AND (x.state <> 'pending' OR x.waiting_on = 0))
$$;

-- Right after inserting the job `p_id` (in the same transaction): give it its key, waiting if
-- the key has a head already. Notifies nothing: the insert did.
CREATE FUNCTION ordered_link(p_id uuid, p_key text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM ordered_lock(p_key);
    UPDATE job SET ordered_key = p_key, ordered_seq = nextval('job_ordered_seq'),
                   waiting_on = waiting_on + ordered_blocked(p_key, p_id)::int
    WHERE id = p_id;
END $$;

-- A job leaves pending: it waits no more (job_waiting_only_pending). A finished job reset to
-- pending is enqueued again: last in its key's order, waiting if the key has a head.
CREATE FUNCTION job_ordered_state() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.state <> 'pending' THEN
        NEW.waiting_on := 0;
    ELSIF OLD.state IN ('succeeded', 'failed', 'cancelled') THEN
        PERFORM ordered_lock(NEW.ordered_key);
        NEW.ordered_seq := nextval('job_ordered_seq');
        NEW.waiting_on := ordered_blocked(NEW.ordered_key, NEW.id)::int;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER job_ordered_state BEFORE UPDATE OF state ON job FOR EACH ROW
    WHEN (new.ordered_key IS NOT NULL AND old.state IS DISTINCT FROM new.state)
    EXECUTE FUNCTION job_ordered_state();

-- The head left (succeeded, cancelled, or deleted while pending, running or failed): release
-- the next job of its key.
CREATE FUNCTION job_ordered_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    nxt record;
BEGIN
    PERFORM ordered_lock(OLD.ordered_key);
    SELECT j.id, j.type, j.start_at INTO nxt FROM job j
    WHERE j.ordered_key = OLD.ordered_key AND j.state = 'pending' AND j.waiting_on > 0
      AND j.id <> OLD.id
    ORDER BY j.ordered_seq
    LIMIT 1
    FOR NO KEY UPDATE;
    IF nxt.id IS NOT NULL AND NOT ordered_blocked(OLD.ordered_key, OLD.id) THEN
        UPDATE job SET waiting_on = waiting_on - 1, updated_at = now() WHERE id = nxt.id;
        IF nxt.start_at <= now() THEN
            PERFORM pg_notify('pgq_job_available', nxt.type);
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER job_ordered_release AFTER UPDATE OF state ON job FOR EACH ROW
    WHEN (old.ordered_key IS NOT NULL AND old.waiting_on = 0
          AND old.state IN ('pending', 'running')
          AND new.state IN ('succeeded', 'cancelled'))
    EXECUTE FUNCTION job_ordered_release();
CREATE TRIGGER job_ordered_release_deleted AFTER DELETE ON job FOR EACH ROW
    WHEN (old.ordered_key IS NOT NULL AND old.waiting_on = 0
          AND old.state IN ('pending', 'running', 'failed'))
    EXECUTE FUNCTION job_ordered_release();
