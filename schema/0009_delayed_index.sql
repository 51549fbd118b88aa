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
