-- pgq_supervisor schema, version 9: finding the earliest delayed job without a scan.
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
