-- pgq_supervisor schema, version 4: progress a running handler reports.
-- Written by the worker's heartbeat thread, fenced by the lease and throttled (a few writes a
-- second per job at most). No index includes it, so a progress write stays a HOT update, like
-- a heartbeat, and the claim index never sees it. NULL until the handler first reports; reset
-- and retry clear it (a fresh run starts from nothing); a retried attempt keeps the last
-- attempt's value until it reports its own.
ALTER TABLE job ADD COLUMN progress jsonb;
