-- pgq_supervisor schema, version 9: delayed jobs out of the claim's way: the earliest due one
-- found without a scan, and claims that no longer walk past jobs due later.
-- The supervisor asks on every poll when the earliest delayed job of its types is due
-- (next_due). Through job_claim_idx that reads every pending row; with a million jobs due
-- over the next day, a poll read a million rows. A job whose start_at is after its created_at
-- was delayed when enqueued or put back by a retry, a reset or a release: only those rows are
-- in this index (jobs enqueued to run at once, most of them, are not, so enqueues and claims of
-- those pay nothing for it: their start_at is the enqueue's now(), their created_at the clock
-- during the insert, never earlier), ordered by start_at, with the type alongside. next_due
-- states the same predicate (a job not delayed that way was due when it was inserted), descends
-- to now() and reads forward to the first row of a served type.
CREATE INDEX job_delayed_idx ON job (start_at, type)
    WHERE state = 'pending' AND waiting_on = 0 AND start_at > created_at;

-- The claim walks job_claim_idx in order, skipping rows not due yet. Delayed jobs used to sit
-- in it among the ready ones: a day's worth of jobs due tomorrow, enqueued before the ready
-- ones, was walked (and each row read from the heap) by every claim. Now job_claim_idx holds
-- only jobs that were due when inserted (start_at <= created_at: they never have to be
-- skipped), and claim_pick_rows takes the rest, delayed jobs that have come due (and retried,
-- reset or released ones), from job_delayed_idx: a range read up to now() of rows that are due,
-- ordered by the claim's order. The two picks, each at most p_limit rows, merge in that order.
-- The claim's order and its locking (FOR UPDATE SKIP LOCKED on every row it considers) are
-- unchanged; rows of the merge beyond p_limit stay locked until the claim commits. The due
-- rows must be sorted, which enable_sort = off prices at 1e10: jit = off keeps that price from
-- buying a JIT compilation (150 ms) on every claim.
DROP INDEX job_claim_idx;
CREATE INDEX job_claim_idx ON job (priority DESC, created_at, id)
    WHERE state = 'pending' AND waiting_on = 0 AND start_at <= created_at;

CREATE OR REPLACE FUNCTION claim_pick_rows(p_types text[], p_limit integer) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_due uuid[];
    v_ready uuid[];
BEGIN
    v_due := ARRAY(
        SELECT p.id
        FROM job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at > p.created_at
          AND p.start_at <= now() AND p.type = ANY(p_types)
        ORDER BY p.priority DESC, p.created_at, p.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED);
    v_ready := ARRAY(
        SELECT p.id
        FROM job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= p.created_at
          AND p.start_at <= now() AND p.type = ANY(p_types)
        ORDER BY p.priority DESC, p.created_at, p.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED);
    IF cardinality(v_due) = 0 THEN
        RETURN v_ready;
    END IF;
    RETURN ARRAY(
        SELECT j.id FROM job j WHERE j.id = ANY(v_due || v_ready)
        ORDER BY j.priority DESC, j.created_at, j.id
        LIMIT p_limit);
END $$;


-- claim_pick_keyed (0008) walked job_claim_idx with the old predicate. It now walks the jobs
-- due when inserted on job_claim_idx in order, as before, and merges in, in claim order, the
-- delayed jobs of the type that have come due (from job_delayed_idx, sorted: few, unless a
-- burst came due together). A merge written out here rather than left to the planner: asked
-- to order the union of both, it sorts the whole backlog.
CREATE FUNCTION claim_pick_keyed_take(p_id uuid, p_key text, p_per_key integer,
                                      INOUT p_taken jsonb, OUT taken boolean)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    v_n integer := 0;
BEGIN
    taken := false;
    IF p_key IS NOT NULL THEN
        v_n := coalesce((p_taken ->> p_key)::int, 0);
        IF v_n >= p_per_key THEN
            RETURN;  -- its key is full: passed over (and every later job of the key)
        END IF;
    END IF;
    PERFORM 1 FROM job j WHERE j.id = p_id AND j.state = 'pending' AND j.waiting_on = 0
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- held by another transaction: skipped, and its key with it (FIFO within a key)
        IF p_key IS NOT NULL THEN
            p_taken := jsonb_set(p_taken, ARRAY[p_key], to_jsonb(p_per_key));
        END IF;
        RETURN;
    END IF;
    IF p_key IS NOT NULL THEN
        p_taken := jsonb_set(p_taken, ARRAY[p_key], to_jsonb(v_n + 1));
    END IF;
    taken := true;
END $$;

CREATE OR REPLACE FUNCTION claim_pick_keyed(p_type text, p_cap integer, p_per_key integer)
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    r       record;  -- the next job due when inserted (c_ready), if v_r
    d       record;  -- the next delayed job come due (c_due), if v_d
    v_r     boolean;
    v_d     boolean;
    v_id    uuid;
    v_key   text;
    v_ok    boolean;
    v_taken jsonb;  -- key -> jobs of that key running, or taken by this claim
    v_ids   uuid[] := '{}';
    c_ready CURSOR FOR
        SELECT p.id, p.concurrency_key AS key, p.priority, p.created_at
        FROM job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= p.created_at
          AND p.start_at <= now() AND p.type = p_type
        ORDER BY p.priority DESC, p.created_at, p.id;
    c_due CURSOR FOR
        SELECT p.id, p.concurrency_key AS key, p.priority, p.created_at
        FROM job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at > p.created_at
          AND p.start_at <= now() AND p.type = p_type
        ORDER BY p.priority DESC, p.created_at, p.id;
BEGIN
    SELECT coalesce(jsonb_object_agg(k.key, k.n), '{}') INTO v_taken
    FROM (SELECT j.concurrency_key AS key, count(*) AS n FROM job j
          WHERE j.state = 'running' AND j.type = p_type AND j.concurrency_key IS NOT NULL
          GROUP BY j.concurrency_key) k;
    OPEN c_ready;
    OPEN c_due;
    FETCH c_ready INTO r;
    v_r := FOUND;
    FETCH c_due INTO d;
    v_d := FOUND;
    -- the two walks merged in claim order
    WHILE v_r OR v_d LOOP
        IF v_d AND (NOT v_r OR ROW(-d.priority, d.created_at, d.id)
                                < ROW(-r.priority, r.created_at, r.id)) THEN
            v_id := d.id;
            v_key := d.key;
            FETCH c_due INTO d;
            v_d := FOUND;
        ELSE
            v_id := r.id;
            v_key := r.key;
            FETCH c_ready INTO r;
            v_r := FOUND;
        END IF;
        SELECT t.p_taken, t.taken INTO v_taken, v_ok
        FROM claim_pick_keyed_take(v_id, v_key, p_per_key, v_taken) t;
        IF v_ok THEN
            v_ids := v_ids || v_id;
            EXIT WHEN cardinality(v_ids) >= p_cap;
        END IF;
    END LOOP;
    RETURN v_ids;
END $$;
