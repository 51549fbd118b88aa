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
-- reads and writes the queue's rows and runs its functions (the job table's partitions are
-- made and dropped by definer functions, schema 0029); LISTEN, NOTIFY and advisory locks
-- need no grant. No DDL, no other schema.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgq TO pgq_worker;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgq TO pgq_worker;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgq TO pgq_worker;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgq
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO pgq_worker;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgq GRANT USAGE, SELECT ON SEQUENCES TO pgq_worker;

-- The producer (pgq.enqueue and its options, enqueue_bundle, get_job, wait, signal): reads
-- the queue; inserts jobs (only the columns an enqueue sets) and bundles; an insert's
-- triggers take a unique_key and a tenant's cursor row. It updates and deletes nothing: what
-- an enqueue writes to job rows after inserting them (dependencies, order, debounce) and
-- signal's wake run in SECURITY DEFINER functions (schema 0030), which act only on jobs its
-- transaction just enqueued, or as the debounce and signal rules allow. It may not touch
-- supervisors, workers, pauses, rates, limits or schedules. Run again, this takes back what
-- an earlier version of this file granted (UPDATE on job rows): roll out producers of this
-- version first.
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA pgq FROM pgq_producer;
GRANT SELECT ON ALL TABLES IN SCHEMA pgq TO pgq_producer;
GRANT INSERT (id, bundle_id, type, payload, priority, start_at, max_retry_count, unique_key,
  origin, timeout, depends_on, on_dependency_failure, waiting_on, concurrency_key, tenant,
  trace_context) ON pgq.job TO pgq_producer;
GRANT INSERT ON pgq.job_bundle, pgq.job_unique, pgq.fair_cursor TO pgq_producer;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgq TO pgq_producer;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgq TO pgq_producer;
REVOKE EXECUTE ON FUNCTION pgq.job_partition_ensure(interval, integer),
  pgq.job_partition_clean(interval, interval, uuid, boolean),
  pgq.job_partition_expire(interval, interval, integer, interval, uuid) FROM pgq_producer;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgq GRANT SELECT ON TABLES TO pgq_producer;

-- The dashboard, read-only (`dashboard --read-only`): reads everything, writes nothing, so
-- not the functions that write as their owner.
GRANT SELECT ON ALL TABLES IN SCHEMA pgq TO pgq_dashboard;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgq TO pgq_dashboard;
REVOKE EXECUTE ON FUNCTION pgq.link_dependencies(uuid[], uuid[]), pgq.ordered_link(uuid, text),
  pgq.debounce_wait(uuid, text), pgq.debounce_holder(text, jsonb, timestamptz, integer),
  pgq.workflow_signal(uuid, text, jsonb), pgq.job_partition_ensure(interval, integer),
  pgq.job_partition_clean(interval, interval, uuid, boolean),
  pgq.job_partition_expire(interval, interval, integer, interval, uuid) FROM pgq_dashboard;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgq GRANT SELECT ON TABLES TO pgq_dashboard;
