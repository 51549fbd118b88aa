-- Three group roles for the queue in schema pgq, each with what its job needs and no more.
-- Run it as the role that runs `migrate` (the schema's owner), in the queue's database; it
-- may be run again (after a `migrate`, say). Then give the roles to login roles:
--   CREATE ROLE app_worker LOGIN PASSWORD '...' IN ROLE pgq_worker;
DO $$
DECLARE
  r text;
BEGIN
  FOREACH r IN ARRAY ARRAY['pgq_worker', 'pgq_producer', 'pgq_dashboard'] LOOP
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
      EXECUTE format('CREATE ROLE %I NOLOGIN', r);
    END IF;
  END LOOP;
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO pgq_worker, pgq_producer, pgq_dashboard',
                 current_database());
END $$;
GRANT USAGE ON SCHEMA pgq TO pgq_worker, pgq_producer, pgq_dashboard;

-- The worker (`run`: the supervisor and its children; `migrate` when nothing is pending):
-- reads and writes the queue's rows and runs its functions; LISTEN, NOTIFY and advisory
-- locks need no grant. No DDL, no other schema.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgq TO pgq_worker;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgq TO pgq_worker;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgq TO pgq_worker;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgq
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO pgq_worker;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgq GRANT USAGE, SELECT ON SEQUENCES TO pgq_worker;

-- The producer (pgq.enqueue and its options, enqueue_bundle, get_job, wait, signal): reads
-- the queue; inserts jobs, bundles, dependencies and signals. An enqueue's own triggers and
-- options (dependencies, ordering, debounce, tenants) update job rows and a tenant's cursor,
-- so it may UPDATE those. It deletes nothing, and may not touch supervisors, workers,
-- pauses, rates, limits or schedules.
GRANT SELECT ON ALL TABLES IN SCHEMA pgq TO pgq_producer;
GRANT INSERT, UPDATE ON pgq.job, pgq.job_bundle, pgq.job_dependency, pgq.fair_cursor,
  pgq.workflow_signal TO pgq_producer;
GRANT INSERT ON pgq.job_unique TO pgq_producer;  -- an enqueue's unique_key is taken there
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgq TO pgq_producer;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgq TO pgq_producer;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgq GRANT SELECT ON TABLES TO pgq_producer;

-- The dashboard, read-only (`dashboard --read-only`): reads everything, writes nothing.
GRANT SELECT ON ALL TABLES IN SCHEMA pgq TO pgq_dashboard;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgq TO pgq_dashboard;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgq GRANT SELECT ON TABLES TO pgq_dashboard;
