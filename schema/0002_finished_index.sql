-- pgq_supervisor schema, version 2: finding finished jobs by age, for retention.
-- Pruning (the supervisor's retain_succeeded / retain_failed, and `purge`) looks finished jobs up
-- by state and stopped_at; without an index every round reads the whole table, which is what a
-- retention window keeps large. Only finished rows are in it (stopped_at is set exactly when a
-- job is terminal), so enqueues, claims and retries never touch it, heartbeats stay HOT, and a
-- job adds one entry when it finishes.
CREATE INDEX job_finished_idx ON job (state, stopped_at) WHERE stopped_at IS NOT NULL;
