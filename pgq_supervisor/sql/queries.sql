-- Every statement the runtime executes, as named blocks. `{schema}` is replaced by the quoted
-- schema identifier (psycopg.sql); parameters are %(name)s placeholders.

-- name: enqueue
-- One job. A unique_key already held by an unfinished job makes this insert nothing and return
-- no row (the trigger job_unique_take of schema/0027 takes the key, or drops the row; it does
-- not fire for a job without a key). A job with dependencies goes in waiting (waiting_on > 0:
-- out of the claim's index) until link_dependencies counts them.
INSERT INTO {schema}.job (id, type, payload, priority, start_at, max_retry_count, unique_key,
                          origin, timeout, depends_on, on_dependency_failure, waiting_on,
                          concurrency_key, tenant, trace_context)
VALUES (%(id)s, %(type)s, %(payload)s, %(priority)s, coalesce(%(start_at)s, now()),
        %(max_retry_count)s, %(unique_key)s, %(origin)s, %(timeout)s, %(depends_on)s::uuid[],
        %(on_dependency_failure)s, coalesce(cardinality(%(depends_on)s::uuid[]), 0),
        %(concurrency_key)s, %(tenant)s, %(trace_context)s)
RETURNING id

-- name: enqueue_many
-- Many jobs in one statement from parallel arrays; ids are made by the client so the caller
-- gets them back in input order. The statement-level trigger notifies once per type.
-- `depends_ons[i]` is job i's dependencies as an array literal (arrays of arrays must be
-- rectangular), NULL for none. A job whose unique_key is held is not inserted (the trigger
-- job_unique_take of schema/0027); the client refuses a key repeated within a batch.
INSERT INTO {schema}.job (id, bundle_id, type, payload, priority, start_at, max_retry_count,
                          unique_key, origin, timeout, depends_on, on_dependency_failure,
                          waiting_on, concurrency_key, tenant, trace_context)
SELECT n.id, %(bundle_id)s, n.type, n.payload, n.priority, coalesce(n.start_at, now()),
       n.max_retry_count, n.unique_key, n.origin, n.timeout, n.depends_on::uuid[], n.on_failure,
       coalesce(cardinality(n.depends_on::uuid[]), 0), n.concurrency_key, n.tenant,
       %(trace_context)s
FROM unnest(%(ids)s::uuid[], %(types)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
            %(start_ats)s::timestamptz[], %(max_retry_counts)s::int[], %(unique_keys)s::text[],
            %(origins)s::text[], %(timeouts)s::float8[], %(depends_ons)s::text[],
            %(on_dependency_failures)s::text[], %(concurrency_keys)s::text[],
            %(tenants)s::text[])
     AS n(id, type, payload, priority, start_at, max_retry_count, unique_key, origin, timeout,
          depends_on, on_failure, concurrency_key, tenant)
RETURNING id

-- name: link_dependencies
-- Right after inserting jobs with dependencies, in the same transaction: one edge per
-- (jobs[i], deps[i]). See schema/0005.
SELECT {schema}.link_dependencies(%(jobs)s::uuid[], %(deps)s::uuid[])

-- name: unfinished_by_unique_keys
-- The unfinished job holding each key (schema/0027).
SELECT unique_key, job_id AS id FROM {schema}.job_unique
WHERE unique_key = ANY(%(keys)s::text[])

-- name: unique_holders
-- Dedup windows (schema/0018): the job holding each key, the keys locked until the caller's
-- transaction ends.
SELECT unique_key, id
FROM {schema}.unique_holders(%(keys)s::text[], %(windows)s::float8[], %(states)s::text[])

-- name: debounce_holder
-- Debounce (schema/0019): replace the pending holder of the key, or name the running one; no
-- row: the key is free. The key stays locked until the caller's transaction ends.
SELECT action, id
FROM {schema}.debounce_holder(%(key)s::text, %(payload)s::jsonb, %(start_at)s::timestamptz,
                              %(priority)s::int)

-- name: set_debounce_key
-- The job just inserted to wait behind the running holder of the key holds the key in
-- debounce_key (job_unique lets one unfinished job hold unique_key, schema/0027). A definer
-- function (schema/0030): the producer may not UPDATE job rows.
SELECT {schema}.debounce_wait(%(id)s::uuid, %(key)s::text)

-- name: age_priorities
-- Priority aging (aging.py): each pending job of the type that has waited `every` seconds since
-- it was enqueued or last raised gets one more priority, up to `max_priority`; at most `limit`
-- per run (the next run takes the rest). Rows a claim holds are skipped (it is taking them),
-- and the update re-checks the wait, so supervisors that run it at once raise a job once.
WITH aged AS (
    SELECT j.id FROM {schema}.job j
    WHERE j.state = 'pending' AND j.type = %(type)s AND j.priority < %(max_priority)s
      AND j.updated_at <= now() - make_interval(secs => %(every)s)
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {schema}.job j SET priority = j.priority + 1, updated_at = now()
WHERE j.id = ANY(ARRAY(SELECT a.id FROM aged a)) AND j.state = 'pending'
  AND j.updated_at <= now() - make_interval(secs => %(every)s)
RETURNING j.id

-- name: ordered_link
-- Strict order per key (schema/0019): right after inserting jobs with an ordered_key, in the
-- same transaction and in their enqueue order, give each its key (waiting behind the key's
-- head, if any).
SELECT {schema}.ordered_link(l.id, l.key)
FROM unnest(%(ids)s::uuid[], %(keys)s::text[]) WITH ORDINALITY AS l(id, key, n)
ORDER BY l.n

-- name: insert_bundle
INSERT INTO {schema}.job_bundle (id, type, origin, num_jobs, on_complete)
VALUES (%(id)s, %(type)s, %(origin)s, %(num_jobs)s, %(on_complete)s)
RETURNING id, type, origin, num_jobs, num_jobs_stopped, on_complete, created_at, updated_at

-- name: claim
-- Takes up to `limit` eligible jobs of the served types, highest priority then oldest, skipping
-- rows other workers hold, and marks them running under a fresh lease. The rows come back in
-- that order (RETURNING has none of its own), the order the worker runs them in, but that the
-- jobs of different tenants (schema/0021) take turns: `turn` numbers each tenant's jobs (those
-- without one are one tenant), so a small tenant's job is not run behind a big one's batch.
-- claim_pick (last defined in schema/0008) routes the claim through pauses, limits and rates;
-- claim_pick_rows (schema/0009) locks the rows, walking job_claim_idx in order with its plan
-- pinned and merging in the delayed jobs come due from job_delayed_idx. The update then finds
-- them by primary key (a join to a CTE here made the planner hash-join a sequential scan of the
-- whole table). A job enqueued without max_retry_count gets its handler's default here.
WITH claimed AS (
    UPDATE {schema}.job j
    SET state = 'running', started_at = now(), worker_alive_at = now(), worker_id = %(worker_id)s,
        lease = %(lease)s, updated_at = now(),
        max_retry_count = coalesce(
            j.max_retry_count,
            (%(max_retry_counts)s::int[])[array_position(%(types)s::text[], j.type)])
    -- The sub-select makes claim_pick run once (an InitPlan): it is volatile, and called in
    -- the WHERE clause directly it would run for every row of the table.
    -- The state is checked again here: claim_pick picks under its own, later snapshot, and a
    -- job reset (terminal -> pending) in between would otherwise be reached through its older,
    -- terminal version and overwritten to running (found by the stress test). The check is
    -- spelled through the timestamps (the CHECKs make "never started, never stopped" mean
    -- pending) because `state = 'pending'` lets the planner walk the whole job_claim_idx
    -- instead of the primary key (PostgreSQL 18 did).
    WHERE j.id = ANY((SELECT {schema}.claim_pick(%(types)s::text[], %(limit)s::int,
                                                 %(lease)s::uuid))::uuid[])
      AND j.started_at IS NULL AND j.stopped_at IS NULL
    RETURNING j.id, j.type, j.payload, j.priority, j.current_retry_count + 1 AS attempt,
              j.max_retry_count, j.timeout, j.bundle_id, j.lease, j.created_at,
              j.depends_on AS dependencies, j.trace_context, j.tenant,
              -- CASE: a job without dependencies never runs the sub-select
              CASE WHEN j.depends_on IS NOT NULL THEN
                  (SELECT jsonb_object_agg(d.id, d.result) FROM {schema}.job d
                   WHERE d.id = ANY(j.depends_on))
              END AS dependency_results
)
SELECT c.id, c.type, c.payload, c.priority, c.attempt, c.max_retry_count, c.timeout,
       c.bundle_id, c.lease, c.dependencies, c.dependency_results, c.trace_context
FROM (SELECT c.*, row_number() OVER (PARTITION BY c.priority, c.tenant
                                      ORDER BY c.created_at, c.id) AS turn
      FROM claimed c) c
ORDER BY c.priority DESC, c.turn, c.created_at, c.id

-- name: heartbeat
-- One beat of a child (schema/0025): its own row in `worker`, keyed by the worker_id its jobs
-- carry, is made fresh, and the jobs it holds are kept alive by it; no job row is written.
-- `ids` and `leases` go in pairs (a job and the lease the child holds it under). Returns the
-- pairs still running under that lease in this statement's snapshot; a job missing from the
-- result is no longer this lease's. The owner is read from the jobs held (a beat holding none
-- writes nothing: the child holds nothing to keep alive).
-- While a supervisor of a version before 25 is registered (child_beats false: a rolling
-- upgrade), its rescuer judges jobs by worker_alive_at alone, so the beat also writes that, as
-- before 25: without waiting for a row lock (SKIP LOCKED: a row the child's own completion
-- holds is being settled, and the two would deadlock otherwise). The updates run whether or
-- not they are read (a data-modifying CTE always runs to completion).
WITH held AS MATERIALIZED (
    SELECT j.id, j.lease, j.worker_id FROM {schema}.job j
    JOIN unnest(%(ids)s::uuid[], %(leases)s::uuid[]) AS h(id, lease)
      ON h.id = j.id AND h.lease = j.lease
    WHERE j.id = ANY(%(ids)s::uuid[]) AND j.state = 'running'
),
beat AS (
    INSERT INTO {schema}.worker AS w (id, alive_at)
    SELECT DISTINCT h.worker_id, now() FROM held h
    ON CONFLICT (id) DO UPDATE SET alive_at = excluded.alive_at
),
legacy AS (
    SELECT j.id FROM {schema}.job j
    WHERE j.id = ANY(ARRAY(SELECT h.id FROM held h))
      AND EXISTS (SELECT 1 FROM {schema}.supervisor s WHERE NOT s.child_beats)
    FOR NO KEY UPDATE SKIP LOCKED
),
beaten AS (
    UPDATE {schema}.job j SET worker_alive_at = now()
    WHERE j.id = ANY(ARRAY(SELECT l.id FROM legacy l))
)
SELECT h.id, h.lease FROM held h

-- name: worker_gone
-- A child's row, when it leaves (its heartbeat stops); rows of children killed before that go
-- with supervisor_register's sweep.
DELETE FROM {schema}.worker WHERE id = %(id)s

-- name: succeed
-- Fenced batch completion. Returns the ids it completed; the rest had lost their lease.
-- pgq_job_stopped carries the ids, at most 200 per notification (payloads stop at 8000 bytes).
-- The inner join to `sent` is what runs the notify: a CTE that is not data-modifying runs only
-- if read, and an unused LEFT JOIN would be pruned.
-- `waiting` locks the jobs that wait on the batch, in id order, before any row of the batch
-- is touched (the condition on no column of `j` is a one-time filter, so none of it runs first):
-- the dependency trigger (schema/0005) would otherwise lock them row by row, in batch order,
-- and two batches completing dependencies of the same jobs could deadlock. A probe of the
-- (usually empty) job_dependency index per job; the jobs found are read by primary key
-- (`= ANY(ARRAY(...))`, not a join, which the planner may hash over the whole table).
-- `gone`: the jobs of ephemeral types (Registry.handler(ephemeral=True)) are deleted instead,
-- fenced the same way, unless one is in a bundle (its on_complete would never fire if the
-- bundle emptied) or has dependents (they read its result, and deleting a job that is still
-- running dooms them: schema/0005): those succeed as usual, and retention deletes them later.
-- `updated` leaves the deleted ones alone; `done` is both. A success clears an earlier
-- attempt's error_msg and error_data (its entry in `attempts` keeps them).
WITH waiting AS (
    SELECT w.id FROM {schema}.job w
    WHERE w.id = ANY(ARRAY(SELECT e.job_id FROM {schema}.job_dependency e
                           WHERE e.depends_on = ANY(%(ids)s::uuid[])))
      AND w.state = 'pending' AND w.waiting_on > 0
    ORDER BY w.id
    FOR NO KEY UPDATE
),
gone AS (
    DELETE FROM {schema}.job j
    WHERE j.id = ANY(%(ephemeral)s::uuid[]) AND j.state = 'running' AND j.lease = %(done_lease)s
      AND j.bundle_id IS NULL AND NOT j.has_dependents
    RETURNING j.id
),
updated AS (
    UPDATE {schema}.job j
    SET state = 'succeeded', stopped_at = now(), worker_alive_at = NULL, lease = NULL,
        result = r.result, error_msg = NULL, error_data = NULL, updated_at = now()
    FROM unnest(%(ids)s::uuid[], %(results)s::jsonb[]) AS r(id, result)
    WHERE j.id = r.id AND j.state = 'running' AND j.lease = %(done_lease)s
      AND j.id <> ALL(ARRAY(SELECT g.id FROM gone g))
      AND (SELECT count(*) FROM waiting) >= 0
    RETURNING j.id
),
done AS (
    SELECT u.id FROM updated u UNION ALL SELECT g.id FROM gone g
),
sent AS (
    SELECT count(pg_notify('pgq_job_stopped', c.ids)) AS n
    FROM (SELECT string_agg(k.id::text, ',') AS ids
          FROM (SELECT id, (row_number() OVER () - 1) / 200 AS chunk FROM done) k
          GROUP BY k.chunk) c
)
SELECT d.id
FROM done d CROSS JOIN sent

-- name: succeed_and_claim
-- `succeed` of batch k and `claim` of batch k+1 in one statement, one commit: half the round
-- trips of a busy worker. `done` and `sent` are succeed's, `claimed` is claim's, word for word
-- but for the filter that orders them (a test keeps them so); the two updates touch disjoint
-- rows (running vs pending).
-- One row: `done_ids`, the jobs whose success landed (reading `sent` there runs the notify),
-- then the claimed batch in claim order, one array per field of a claimed job (all NULL when
-- nothing was claimed); the lease is the statement's own. Cheaper than a row per job here:
-- carrying done_ids on a first row took a join and a sort of every row (measured).
-- array_agg takes its input in the sorted subquery's order (PostgreSQL keeps it for an
-- aggregate without GROUP BY; a test checks it).
-- `waiting`: the jobs that wait on these, locked first in id order, as in `succeed`.
WITH waiting AS (
    SELECT w.id FROM {schema}.job w
    WHERE w.id = ANY(ARRAY(SELECT e.job_id FROM {schema}.job_dependency e
                           WHERE e.depends_on = ANY(%(ids)s::uuid[])))
      AND w.state = 'pending' AND w.waiting_on > 0
    ORDER BY w.id
    FOR NO KEY UPDATE
),
gone AS (
    DELETE FROM {schema}.job j
    WHERE j.id = ANY(%(ephemeral)s::uuid[]) AND j.state = 'running' AND j.lease = %(done_lease)s
      AND j.bundle_id IS NULL AND NOT j.has_dependents
    RETURNING j.id
),
updated AS (
    UPDATE {schema}.job j
    SET state = 'succeeded', stopped_at = now(), worker_alive_at = NULL, lease = NULL,
        result = r.result, error_msg = NULL, error_data = NULL, updated_at = now()
    FROM unnest(%(ids)s::uuid[], %(results)s::jsonb[]) AS r(id, result)
    WHERE j.id = r.id AND j.state = 'running' AND j.lease = %(done_lease)s
      AND j.id <> ALL(ARRAY(SELECT g.id FROM gone g))
      AND (SELECT count(*) FROM waiting) >= 0
    RETURNING j.id
),
done AS (
    SELECT u.id FROM updated u UNION ALL SELECT g.id FROM gone g
),
sent AS (
    SELECT count(pg_notify('pgq_job_stopped', c.ids)) AS n
    FROM (SELECT string_agg(k.id::text, ',') AS ids
          FROM (SELECT id, (row_number() OVER () - 1) / 200 AS chunk FROM done) k
          GROUP BY k.chunk) c
),
claimed AS (
    UPDATE {schema}.job j
    SET state = 'running', started_at = now(), worker_alive_at = now(), worker_id = %(worker_id)s,
        lease = %(lease)s, updated_at = now(),
        max_retry_count = coalesce(
            j.max_retry_count,
            (%(max_retry_counts)s::int[])[array_position(%(types)s::text[], j.type)])
    -- `WHERE (SELECT count(*) FROM done) >= 0`, always true, runs the completion before
    -- claim_pick: a volatile function sees what its calling statement has written so far, so
    -- a concurrency limit counts the jobs completed here as finished and their slots as free
    -- (counted as running, a full batch under a limit came back as a sliver of one, or empty).
    -- The dependents the completion releases are released by an AFTER trigger, at the end of
    -- the statement: this claim does not see them, and updates no row a trigger has changed.
    WHERE j.id = ANY((SELECT {schema}.claim_pick(%(types)s::text[], %(limit)s::int,
                                                 %(lease)s::uuid)
                      WHERE (SELECT count(*) FROM done) >= 0)::uuid[])
      AND j.started_at IS NULL AND j.stopped_at IS NULL
    RETURNING j.id, j.type, j.payload, j.priority, j.current_retry_count + 1 AS attempt,
              j.max_retry_count, j.timeout, j.bundle_id, j.lease, j.created_at,
              j.depends_on AS dependencies, j.trace_context, j.tenant,
              -- CASE: a job without dependencies never runs the sub-select
              CASE WHEN j.depends_on IS NOT NULL THEN
                  (SELECT jsonb_object_agg(d.id, d.result) FROM {schema}.job d
                   WHERE d.id = ANY(j.depends_on))
              END AS dependency_results
)
SELECT (SELECT coalesce(array_agg(d.id), ARRAY[]::uuid[]) FROM done d CROSS JOIN sent)
           AS done_ids,
       array_agg(c.id) AS id, array_agg(c.type) AS type, array_agg(c.payload) AS payload,
       array_agg(c.priority) AS priority, array_agg(c.attempt) AS attempt,
       array_agg(c.max_retry_count) AS max_retry_count, array_agg(c.timeout) AS timeout,
       array_agg(c.bundle_id) AS bundle_id,
       -- jsonb: array_agg cannot stack uuid[] of different lengths (or NULL ones)
       array_agg(to_jsonb(c.dependencies)) AS dependencies,
       array_agg(c.dependency_results) AS dependency_results,
       array_agg(c.trace_context) AS trace_context
FROM (SELECT * FROM (SELECT c.*, row_number() OVER (PARTITION BY c.priority, c.tenant
                                                     ORDER BY c.created_at, c.id) AS turn
                     FROM claimed c) c
      ORDER BY c.priority DESC, c.turn, c.created_at, c.id) c

-- name: end_attempt
-- A failed attempt: retry after `delay` seconds if allowed and attempts are left, else failed.
-- `waiting`: the jobs that wait on these, locked first in id order, as in `succeed`.
WITH waiting AS (
    SELECT w.id FROM {schema}.job w
    WHERE w.id = ANY(ARRAY(SELECT e.job_id FROM {schema}.job_dependency e
                           WHERE e.depends_on = ANY(%(ids)s::uuid[])))
      AND w.state = 'pending' AND w.waiting_on > 0
    ORDER BY w.id
    FOR NO KEY UPDATE
)
SELECT job_id, job_type, new_state, retry_count
FROM {schema}.end_attempt(%(ids)s::uuid[], %(lease)s::uuid, %(worker_id)s::text, %(error)s::text,
                          %(error_data)s::jsonb, %(kind)s::text, %(allow_retry)s::boolean,
                          %(delay)s::float8)
WHERE (SELECT count(*) FROM waiting) >= 0

-- name: snooze
-- The handler snoozed its job (pgq.Snooze): back to pending after `delay` seconds without
-- counting an attempt, fenced by the lease; past `max_snoozes`, failed (schema/0017). A single
-- row, so no dependents need locking first as end_attempt's batches do.
SELECT job_id, job_type, new_state, retry_count
FROM {schema}.snooze_job(%(id)s::uuid, %(lease)s::uuid, %(delay)s::float8, %(max_snoozes)s::int,
                         %(error)s::text)

-- name: release
-- Back to pending without consuming an attempt. NULL filters match everything.
SELECT id FROM {schema}.release_jobs(%(ids)s::uuid[], %(lease)s::uuid, %(worker_id)s::text) AS id

-- name: rescue
-- Jobs whose heartbeat is older than dead_after by the database clock lost their worker: end
-- that attempt as a worker death. SKIP LOCKED makes concurrent rescuers (and a worker finishing
-- right now) safe; what is skipped is looked at again next round.
SELECT job_id, job_type, new_state, retry_count
FROM {schema}.end_attempt(
    ARRAY(SELECT j.id FROM {schema}.job j
          WHERE j.state = 'running'
            AND {schema}.job_alive_at(j.state, j.worker_alive_at, j.worker_id)
                < now() - make_interval(secs => %(dead_after)s)
          ORDER BY j.id
          LIMIT %(limit)s
          FOR UPDATE SKIP LOCKED),
    NULL, NULL, %(error)s, NULL, 'rescued', true, 0)

-- name: cancel
-- A pending or running job ends cancelled, in this one statement. The row lock makes the
-- database the referee: a worker's success (or failure) racing it either commits first (then
-- this finds the job finished and refuses) or waits and finds its lease gone. A running job's
-- worker is fenced out (lease and heartbeat cleared; worker_id stays, as for every ended job,
-- so the supervisor's poll can find what to stop), its attempt is recorded as `cancelled`, and
-- pgq_job_cancel tells the supervisor whose child holds it to stop it. Never retried. One row:
-- the state the job was in and whether this cancelled it; no row for an unknown id.
WITH target AS (
    SELECT id, state, worker_id FROM {schema}.job WHERE id = %(id)s FOR NO KEY UPDATE
),
done AS (
    UPDATE {schema}.job j
    SET state = 'cancelled', stopped_at = now(), worker_alive_at = NULL, lease = NULL,
        attempts = CASE WHEN t.state = 'running'
                        THEN j.attempts || jsonb_build_array(jsonb_build_object(
                            'attempt', j.current_retry_count + 1, 'kind', 'cancelled',
                            'error', 'cancelled', 'worker', j.worker_id,
                            'started_at', j.started_at, 'at', now()))
                        ELSE j.attempts END,
        updated_at = now()
    FROM target t
    WHERE j.id = t.id AND t.state IN ('pending', 'running')
    RETURNING j.id, t.state, t.worker_id
),
stopped_sent AS (
    SELECT count(pg_notify('pgq_job_stopped', d.id::text)) AS n FROM done d
),
cancel_sent AS (
    SELECT count(pg_notify('pgq_job_cancel',
                           json_build_object('job_id', d.id, 'worker_id', d.worker_id)::text)) AS n
    FROM done d WHERE d.state = 'running'
)
SELECT t.state, d.id IS NOT NULL AS cancelled, t.worker_id
FROM target t
LEFT JOIN done d ON d.id = t.id
CROSS JOIN stopped_sent
CROSS JOIN cancel_sent

-- name: cancelled_among
-- The supervisor's poll behind pgq_job_cancel: which of the jobs its children hold now were
-- cancelled (by primary key, a handful of ids). The state is compared as text so that no index
-- on state can serve it: with few cancelled jobs in its statistics the planner would otherwise
-- walk the cancelled range of job_unusual_created_idx (schema/0010), which grows with them.
SELECT id FROM {schema}.job WHERE id = ANY(%(ids)s::uuid[]) AND state::text = 'cancelled'

-- name: reset
-- A finished job back to pending with a fresh retry budget; a running one only when forced
-- (its worker is fenced out because the lease is cleared). The attempt history is kept.
WITH done AS (
    UPDATE {schema}.job
    SET state = 'pending', current_retry_count = 0, start_at = now(), started_at = NULL,
        stopped_at = NULL, worker_alive_at = NULL, worker_id = NULL, lease = NULL,
        result = NULL, error_msg = NULL, error_data = NULL, progress = NULL,
        snoozes = 0,
        updated_at = now()
    WHERE id = %(id)s
      AND (state IN ('succeeded', 'failed', 'cancelled') OR (%(force)s AND state = 'running'))
    RETURNING id, type
)
SELECT d.id, pg_notify('pgq_job_available', d.type) FROM done d

-- name: retry_failed
-- Every failed job (of one type, or all) back to pending with a fresh retry budget.
WITH done AS (
    UPDATE {schema}.job
    SET state = 'pending', current_retry_count = 0, start_at = now(), started_at = NULL,
        stopped_at = NULL, worker_alive_at = NULL, worker_id = NULL, lease = NULL,
        result = NULL, error_msg = NULL, error_data = NULL, progress = NULL,
        snoozes = 0,
        updated_at = now()
    WHERE state = 'failed' AND (%(type)s::text IS NULL OR type = %(type)s)
    RETURNING id, type
)
SELECT count(*), (SELECT count(pg_notify('pgq_job_available', t.type))
                  FROM (SELECT DISTINCT type FROM done) t)
FROM done

-- name: get_job
SELECT id, bundle_id, type, payload, priority, origin, state, max_retry_count,
       current_retry_count, start_at, started_at, stopped_at,
       {schema}.job_alive_at(state, worker_alive_at, worker_id) AS worker_alive_at, worker_id,
       timeout, unique_key, result, error_msg, error_data, attempts, created_at, updated_at,
       progress, waiting_on, depends_on, on_dependency_failure, has_dependents, concurrency_key,
       trace_context, snoozes, debounce_key, ordered_key, workflow_parent, tenant
FROM {schema}.job WHERE id = %(id)s

-- name: job_states
-- The state of many jobs at once (a waiter's re-check); unknown ids have no row.
SELECT id, state FROM {schema}.job WHERE id = ANY(%(ids)s::uuid[])

-- name: unserved_types
-- Of a waiter's jobs, the types of those still pending that no supervisor seen within
-- `seen_within` seconds serves, and the types those supervisors serve (`wait`'s timeout
-- names both: a misspelt type waits forever). Read once, at the timeout: a few ids on the
-- primary key and the few supervisor rows.
SELECT
  ARRAY(
    SELECT DISTINCT j.type
    FROM {schema}.job j
    WHERE j.id = ANY(%(ids)s::uuid[]) AND j.state = 'pending'
      AND NOT EXISTS (
        SELECT FROM {schema}.supervisor s
        WHERE j.type = ANY(s.types)
          AND s.seen_at > now() - make_interval(secs => %(seen_within)s))
    ORDER BY j.type) AS unserved,
  ARRAY(
    SELECT DISTINCT t
    FROM {schema}.supervisor s, unnest(s.types) t
    WHERE s.seen_at > now() - make_interval(secs => %(seen_within)s)
    ORDER BY t) AS served

-- name: get_jobs
SELECT id, bundle_id, type, payload, priority, origin, state, max_retry_count,
       current_retry_count, start_at, started_at, stopped_at,
       {schema}.job_alive_at(state, worker_alive_at, worker_id) AS worker_alive_at, worker_id,
       timeout, unique_key, result, error_msg, error_data, attempts, created_at, updated_at,
       progress, waiting_on, depends_on, on_dependency_failure, has_dependents, concurrency_key,
       trace_context, snoozes, debounce_key, ordered_key, workflow_parent, tenant
FROM {schema}.job WHERE id = ANY(%(ids)s::uuid[])

-- name: set_progress
-- Fenced: only jobs still running under the lease given with each value are written, so a
-- stale worker writes nothing. No indexed column changes: a HOT update. Each job written is
-- named on pgq_job_progress (a waiter follows it); `sent` runs the notify, as in `succeed`.
-- Never waits for a row lock, as `heartbeat` (on the same connection; the same deadlock with
-- a batch completion): a job whose row another transaction holds is being settled, and its
-- value is dropped, as it would be once the completion lands.
WITH mine AS (
    SELECT j.id FROM {schema}.job j
    WHERE j.id = ANY(%(ids)s::uuid[]) AND j.state = 'running'
    FOR NO KEY UPDATE SKIP LOCKED
),
done AS (
    UPDATE {schema}.job j SET progress = p.progress
    FROM unnest(%(ids)s::uuid[], %(leases)s::uuid[], %(progress)s::jsonb[])
         AS p(id, lease, progress)
    WHERE j.id = p.id AND j.state = 'running' AND j.lease = p.lease
      AND j.id = ANY(ARRAY(SELECT m.id FROM mine m))
    RETURNING j.id
),
sent AS (
    SELECT count(pg_notify('pgq_job_progress', d.id::text)) AS n FROM done d
)
SELECT d.id FROM done d CROSS JOIN sent

-- name: job_state
SELECT state FROM {schema}.job WHERE id = %(id)s

-- name: get_bundle
SELECT id, type, origin, num_jobs, num_jobs_stopped, on_complete, created_at, updated_at
FROM {schema}.job_bundle WHERE id = %(id)s

-- name: list_jobs
SELECT id, bundle_id, type, payload, priority, origin, state, max_retry_count,
       current_retry_count, start_at, started_at, stopped_at,
       {schema}.job_alive_at(state, worker_alive_at, worker_id) AS worker_alive_at, worker_id,
       timeout, unique_key, result, error_msg, error_data, attempts, created_at, updated_at,
       progress, waiting_on, depends_on, on_dependency_failure, has_dependents, concurrency_key,
       trace_context, snoozes, debounce_key, ordered_key, workflow_parent, tenant
FROM {schema}.job
WHERE state = %(state)s AND (%(type)s::text IS NULL OR type = %(type)s)
ORDER BY updated_at DESC
LIMIT %(limit)s

-- name: delete_finished
-- Batched so a large purge never holds many locks; the delete trigger keeps bundle counters true.
-- The batch is found on job_finished_idx and deleted by primary key: `= ANY(ARRAY(...))` rather
-- than a join, which under a generic plan (row estimate: a tenth of the table) hashes the whole table.
DELETE FROM {schema}.job
WHERE id = ANY(ARRAY(
    SELECT id FROM {schema}.job
    WHERE state = ANY(%(states)s::{schema}.job_state[])
      AND stopped_at < now() - make_interval(secs => %(older_than)s)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED))

-- name: prune_finished
-- The supervisor's retention: delete_finished, but, where the job table is partitioned
-- (schema/0029, `partition`), for the jobs of the partitions that leave whole, which
-- job_partition_expire drops instead: those of the drop zone, ids
-- made in the last `zone` seconds (partitions.drop_zone). What is left to rows: the default
-- partition's jobs (carried from a dropped partition, or with an id out of every range), the
-- jobs of job_legacy (the table before 0029: its jobs of every age until it can leave), and
-- those of a partition that a job still to run holds back past the zone.
DELETE FROM {schema}.job
WHERE id = ANY(ARRAY(
    SELECT id FROM {schema}.job
    WHERE state = ANY(%(states)s::{schema}.job_state[])
      AND stopped_at < now() - make_interval(secs => %(older_than)s)
      -- each sub-select runs once (an InitPlan), not once a row
      AND ((SELECT NOT {schema}.job_partitioned())
           OR id < (SELECT {schema}.id_floor(now() - make_interval(secs => %(zone)s)))
           OR tableoid = (SELECT to_regclass(quote_ident(%(schema)s::text) || '.job_default'))
           OR tableoid = (SELECT to_regclass(quote_ident(%(schema)s::text) || '.job_legacy')))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED))

-- name: partition_lock_timeout
-- For the conversion's transaction: how long it waits for the job table's lock.
SELECT set_config('lock_timeout', %(lock_timeout)s::text || 'ms', true)

-- name: partition_convert
-- Partition the job table (schema/0029: opt-in, `partition`); false when it is already.
SELECT {schema}.job_partition_convert(make_interval(secs => %(interval)s), %(ahead)s)

-- name: partition_ensure
-- The partitions of the next `ahead` intervals (schema/0029); NULL: another supervisor has it.
SELECT {schema}.job_partition_ensure(make_interval(secs => %(interval)s), %(ahead)s)

-- name: partition_clean
SELECT partition, outcome, hi, 0 AS carried, jobs
FROM {schema}.job_partition_clean(make_interval(secs => %(succeeded)s::float8),
                                  make_interval(secs => %(failed)s::float8), %(after)s::uuid,
                                  %(count)s)

-- name: partition_expire
SELECT partition, outcome, carried, hi, 0::bigint AS jobs
FROM {schema}.job_partition_expire(make_interval(secs => %(succeeded)s::float8),
                                   make_interval(secs => %(failed)s::float8), %(max_carry)s,
                                   make_interval(secs => %(lock_timeout)s), %(after)s::uuid)

-- name: delete_empty_bundles
DELETE FROM {schema}.job_bundle b
WHERE b.num_jobs = 0 AND b.created_at < now() - make_interval(secs => %(older_than)s)

-- name: queue_stats
SELECT type, state, count(*)::int AS count,
       (count(*) FILTER (WHERE state = 'pending' AND waiting_on = 0
                               AND start_at <= now()))::int AS ready,
       extract(epoch FROM now() - min(start_at) FILTER (
           WHERE state = 'pending' AND waiting_on = 0
             AND start_at <= now()))::float8 AS oldest_ready_age,
       (count(*) FILTER (WHERE waiting_on > 0))::int AS waiting
FROM {schema}.job
GROUP BY type, state
ORDER BY type, state

-- name: depth
-- Jobs a claim could take now: what an autoscaler should size workers for. The definition is
-- the SQL function (schema/0014), which KEDA's trigger calls too; NULL counts every type.
SELECT {schema}.depth(VARIADIC %(types)s::text[])

-- name: next_due
-- Seconds until the earliest delayed job of the served types becomes eligible (a waiting job
-- becomes eligible when its last dependency succeeds, which notifies). `start_at > created_at`
-- leaves out only jobs that were due when inserted, and lets job_delayed_idx serve the query.
SELECT extract(epoch FROM min(start_at) - now())::float8 FROM {schema}.job
WHERE state = 'pending' AND waiting_on = 0 AND start_at > now() AND start_at > created_at
  AND type = ANY(%(types)s::text[])

-- name: now
SELECT now()

-- name: connection_limits
-- What this session's role may open on this server, for the supervisor's connection budget at
-- start (supervisor/budget.py judges it). Superusers pass the role's and the database's limits
-- and may use the reserved slots; reserved_connections exists from PostgreSQL 16 (NULL before)
-- and binds roles outside pg_use_reserved_connections. The counts leave out this session (the
-- caller closes it before the supervisor connects) and what has slots of its own (autovacuum,
-- auxiliary processes: no role; the replication launcher: no database). Without
-- pg_read_all_stats a role cannot see other roles' backend_type: their sessions with a role and
-- a database count, so a parallel worker or a logical WAL sender of theirs counts as one too.
WITH counted AS (
  SELECT a.usesysid, a.datid FROM pg_stat_activity a
  WHERE a.pid <> pg_backend_pid()
    AND (a.backend_type = 'client backend'
         OR (a.backend_type IS NULL AND a.usesysid IS NOT NULL AND a.datid IS NOT NULL))
)
SELECT current_user::text AS role, current_database()::text AS database,
       current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int AS superuser_reserved,
       coalesce(current_setting('reserved_connections', true)::int, 0) AS reserved,
       r.rolsuper AS superuser,
       EXISTS (SELECT 1 FROM pg_roles u WHERE u.rolname = 'pg_use_reserved_connections'
               AND pg_has_role(u.oid, 'MEMBER')) AS may_use_reserved,
       r.rolconnlimit AS role_limit,
       d.datconnlimit AS database_limit,
       (SELECT count(*) FROM counted)::int AS server_used,
       (SELECT count(*) FROM counted c WHERE c.usesysid = r.oid)::int AS role_used,
       (SELECT count(*) FROM counted c WHERE c.datid = d.oid)::int AS database_used
FROM pg_roles r, pg_database d
WHERE r.rolname = current_user AND d.datname = current_database()

-- name: active_stats
-- Pending and running jobs per type, for metrics; reads only the partial indexes' rows.
SELECT type, state, count(*)::int AS count,
       (count(*) FILTER (WHERE state = 'pending' AND waiting_on = 0
                               AND start_at <= now()))::int AS ready,
       extract(epoch FROM now() - min(start_at) FILTER (
           WHERE state = 'pending' AND waiting_on = 0
             AND start_at <= now()))::float8 AS oldest_ready_age,
       (count(*) FILTER (WHERE waiting_on > 0))::int AS waiting
FROM {schema}.job
WHERE state IN ('pending', 'running')
GROUP BY type, state
ORDER BY type, state

-- name: summary_by_origin
-- Per type and state for the jobs of one origin: count, mean run time, attempts made.
SELECT type, state, count(*)::int AS jobs,
       avg(extract(epoch FROM stopped_at - started_at))::float8 AS mean_seconds,
       -- snoozes are kept in the history but are not attempts
       sum((SELECT count(*) FROM jsonb_array_elements(attempts) a
            WHERE a ->> 'kind' IS DISTINCT FROM 'snoozed'))::int AS failed_attempts
FROM {schema}.job
WHERE origin = %(origin)s
GROUP BY type, state
ORDER BY type, state

-- name: durable_commit
-- This transaction commits synchronously whatever the session says.
SET LOCAL synchronous_commit = on

-- name: begin_implicit
-- Sent only to open the implicit transaction of a connection without autocommit that has sent
-- nothing yet (psycopg BEGINs before it), so that db.atomic's savepoint lands inside it.
SELECT

-- name: no_jit
-- For the reads that count the queue (metrics, status): JIT compiling them took 450 ms of CPU,
-- far more than the counting it would speed up (measured: an unanalyzed type_limit is taken
-- for a thousand rows, which prices its per-type counts past jit_above_cost).
SET LOCAL jit = off

-- name: asynchronous_commit
-- For the session of a worker's own bookkeeping (see db.connect).
SET synchronous_commit = off

-- name: enqueue_copy
-- The bulk fast path (no unique_key, no start_at in the batch): COPY skips the per-row
-- executor work of INSERT ... SELECT unnest. Triggers still fire once per statement.
COPY {schema}.job (id, bundle_id, type, payload, priority, max_retry_count, origin, timeout,
                   trace_context, concurrency_key, tenant)
FROM STDIN

-- name: schedule_declare
-- A supervisor's schedules (sorted by name: concurrent declarations lock rows in one order).
-- A new row's created_at starts it: only ticks after it are due. The definition columns are
-- for the CLI; the code's definition is what fires.
INSERT INTO {schema}.schedule AS s (name, type, cron, every, timezone, priority, catch_up,
                                     payload)
SELECT * FROM unnest(%(names)s::text[], %(types)s::text[], %(crons)s::text[],
                     %(everys)s::interval[], %(timezones)s::text[], %(priorities)s::int[],
                     %(catch_ups)s::int[], %(payloads)s::jsonb[])
ORDER BY 1
ON CONFLICT (name) DO UPDATE
SET type = excluded.type, cron = excluded.cron, every = excluded.every,
    timezone = excluded.timezone, priority = excluded.priority, catch_up = excluded.catch_up,
    payload = excluded.payload, declared_at = now()
RETURNING name, created_at, last_tick, now() AS now, paused_at IS NOT NULL AS paused

-- name: schedule_states
-- Where the named schedules stand, with the database's clock (the ticks' time base).
SELECT name, created_at, last_tick, now() AS now, paused_at IS NOT NULL AS paused
FROM {schema}.schedule
WHERE name = ANY(%(names)s::text[])

-- name: schedule_enqueue
-- Enqueue one tick of a schedule, exactly once however many supervisors try: the UPDATE moves
-- last_tick forward to the tick, and a concurrent one waits for the row, then finds last_tick
-- no longer before the tick and inserts nothing. The job starts at its tick; its unique_key
-- (periodic:NAME@TICK) records the tick for good (a retry or a release moves start_at).
-- A paused schedule (schema/0015) enqueues nothing and keeps its last_tick.
WITH advanced AS (
    UPDATE {schema}.schedule SET last_tick = %(tick)s, last_job_id = %(id)s
    WHERE name = %(name)s AND (last_tick IS NULL OR last_tick < %(tick)s)
      AND paused_at IS NULL
    RETURNING name
)
-- the tick's key held by an unfinished job: nothing is inserted (job_unique_take, 0027)
INSERT INTO {schema}.job (id, type, payload, priority, start_at, unique_key, origin)
SELECT %(id)s, %(type)s, %(payload)s, %(priority)s, %(tick)s, %(unique_key)s, 'periodic:' || name
FROM advanced
RETURNING id

-- name: schedules_list
-- Every schedule a supervisor declared, for the CLI and the dashboard.
SELECT name, type, cron, every, timezone, priority, catch_up, created_at, declared_at,
       last_tick, last_job_id, now() AS now, payload, paused_at, paused_by
FROM {schema}.schedule
ORDER BY name

-- name: schedule_pause
-- Idempotent: no row when the schedule is unknown or paused already.
UPDATE {schema}.schedule SET paused_at = now(), paused_by = %(paused_by)s
WHERE name = %(name)s AND paused_at IS NULL
RETURNING name

-- name: schedule_resume
-- The ticks missed while paused are skipped: last_tick moves to now (schedule_enqueue then
-- enqueues only ticks after it). No row when the schedule is unknown or not paused.
UPDATE {schema}.schedule
SET paused_at = NULL, paused_by = NULL, last_tick = greatest(last_tick, now())
WHERE name = %(name)s AND paused_at IS NOT NULL
RETURNING name

-- name: schedule_run_now
-- One job as a tick of the schedule would enqueue it, due now, outside its ticks: no
-- unique_key (a tick's key names its tick), last_tick unchanged. No row for an unknown schedule.
-- A schedule declared before schema 15 has no stored payload until a supervisor declares it
-- again: its job gets JSON null, as its ticks did then (job.payload is NOT NULL).
INSERT INTO {schema}.job (id, type, payload, priority, origin)
SELECT %(id)s, s.type, coalesce(s.payload, 'null'::jsonb), s.priority, 'periodic:' || s.name || ' (run now)'
FROM {schema}.schedule s
WHERE s.name = %(name)s
RETURNING id

-- name: pause_type
-- Idempotent: pausing a paused type changes nothing and returns no row.
INSERT INTO {schema}.type_pause (type, paused_by, reason)
VALUES (%(type)s, %(paused_by)s, %(reason)s)
ON CONFLICT (type) DO NOTHING
RETURNING paused_at

-- name: set_tenant_weight
-- Fair claims (schema/0021): a tenant's weight within a type, read by the next claims.
INSERT INTO {schema}.tenant_weight (type, tenant, weight)
VALUES (%(type)s, %(tenant)s, %(weight)s)
ON CONFLICT (type, tenant) DO UPDATE SET weight = excluded.weight, updated_at = now()

-- name: resume_type
-- Idempotent: no row when the type was not paused. The notification wakes the workers of the
-- type at once (it is sent when this commits).
WITH done AS (
    DELETE FROM {schema}.type_pause WHERE type = %(type)s RETURNING type
)
SELECT d.type, pg_notify('pgq_job_available', d.type) IS NULL AS notified FROM done d

-- name: type_controls
-- Every paused or rate-limited type: since when and why it is paused, its rate, and how many
-- starts its window allows now.
SELECT coalesce(p.type, r.type) AS type, p.paused_at, p.paused_by, p.reason,
       r.max_starts, r.period, r.free AS free_starts
FROM {schema}.type_pause p
FULL JOIN (SELECT t.type, t.max_starts, t.period,
                  ({schema}.rate_window(t.max_starts, t.period, t.buckets, t.counts)).free
           FROM {schema}.type_rate t) r ON r.type = p.type
ORDER BY 1

-- name: sync_rates
-- The rates of the served types as this supervisor's handlers declare them: rows of served
-- types without a rate go, the others are written (the last supervisor started wins). A new
-- period renumbers the buckets, so its counts start over.
WITH wanted AS (
    SELECT w.type, w.max_starts, w.period
    FROM unnest(%(rated)s::text[], %(max_starts)s::int[], %(periods)s::float8[])
         AS w(type, max_starts, period)
),
dropped AS (
    DELETE FROM {schema}.type_rate t
    WHERE t.type = ANY(%(served)s::text[]) AND t.type <> ALL(%(rated)s::text[])
    RETURNING t.type
)
INSERT INTO {schema}.type_rate AS t (type, max_starts, period)
SELECT w.type, w.max_starts, w.period FROM wanted w WHERE (SELECT count(*) FROM dropped) >= 0
ORDER BY w.type
ON CONFLICT (type) DO UPDATE
SET max_starts = excluded.max_starts, period = excluded.period,
    buckets = CASE WHEN t.period = excluded.period THEN t.buckets ELSE ARRAY[]::bigint[] END,
    counts = CASE WHEN t.period = excluded.period THEN t.counts ELSE ARRAY[]::int[] END,
    updated_at = now()
WHERE (t.max_starts, t.period) IS DISTINCT FROM (excluded.max_starts, excluded.period)

-- name: rate_next_due
-- Seconds until a start frees up for the first of the served, unpaused rated types whose
-- window is full now (NULL: none is). The supervisor wakes a child then; nothing notifies it.
SELECT min(r.free_in)::float8
FROM (SELECT t.type, (w).free, (w).free_in
      FROM (SELECT t.type, {schema}.rate_window(t.max_starts, t.period, t.buckets, t.counts) AS w
            FROM {schema}.type_rate t WHERE t.type = ANY(%(types)s::text[])) t) r
WHERE r.free = 0 AND NOT EXISTS (SELECT 1 FROM {schema}.type_pause p WHERE p.type = r.type)

-- name: sync_limits
-- The concurrency limits of the served types as this supervisor's handlers declare them, as
-- sync_rates: rows of served types without a limit go, the others are written (the last
-- supervisor started wins).
WITH dropped AS (
    DELETE FROM {schema}.type_limit l
    WHERE l.type = ANY(%(served)s::text[]) AND l.type <> ALL(%(limited)s::text[])
    RETURNING l.type
)
INSERT INTO {schema}.type_limit AS l (type, global_concurrency, key_concurrency)
SELECT w.type, w.global_concurrency, w.key_concurrency
FROM unnest(%(limited)s::text[], %(global_concurrencies)s::int[], %(key_concurrencies)s::int[])
     AS w(type, global_concurrency, key_concurrency)
WHERE (SELECT count(*) FROM dropped) >= 0
ORDER BY w.type
ON CONFLICT (type) DO UPDATE
SET global_concurrency = excluded.global_concurrency,
    key_concurrency = excluded.key_concurrency, updated_at = now()
WHERE (l.global_concurrency, l.key_concurrency)
      IS DISTINCT FROM (excluded.global_concurrency, excluded.key_concurrency)

-- name: type_limits
-- Every limited type: its limits, its running jobs, its ready jobs (claimable but for the
-- limits and pauses), and how many of those wait because their key is at its limit.
SELECT l.type, l.global_concurrency, l.key_concurrency,
       (SELECT count(*) FROM {schema}.job r
        WHERE r.state = 'running' AND r.type = l.type)::int AS running,
       (SELECT count(*) FROM {schema}.job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= now()
          AND p.type = l.type)::int AS ready,
       (SELECT count(*) FROM {schema}.job p
        WHERE p.state = 'pending' AND p.waiting_on = 0 AND p.start_at <= now()
          AND p.type = l.type AND l.key_concurrency IS NOT NULL
          AND p.concurrency_key IN (
              SELECT r.concurrency_key FROM {schema}.job r
              WHERE r.state = 'running' AND r.type = l.type AND r.concurrency_key IS NOT NULL
              GROUP BY r.concurrency_key
              HAVING count(*) >= l.key_concurrency))::int AS key_held
FROM {schema}.type_limit l
ORDER BY l.type

-- name: supervisor_register
-- A supervisor's row, upserted on its "register" timer (schema/0010). Rows of supervisors not
-- seen for an hour (killed, never cleaned up) go at the same time, and so do the rows of
-- children not beaten for an hour (schema/0025: a child killed before its heartbeat said
-- goodbye). child_beats: its children beat their own rows, and its rescuer reads them.
WITH gone AS (
    DELETE FROM {schema}.supervisor
    WHERE seen_at < now() - interval '1 hour' AND id <> %(id)s
    RETURNING id
),
workers_gone AS (
    DELETE FROM {schema}.worker WHERE alive_at < now() - interval '1 hour'
    RETURNING id
)
INSERT INTO {schema}.supervisor (id, host, pid, procs, types, started_at, seen_at, children,
                                 locked_on, child_beats)
SELECT %(id)s, %(host)s, %(pid)s, %(procs)s, %(types)s::text[], %(started_at)s, now(),
       %(children)s::jsonb, %(locked_on)s, true
WHERE (SELECT count(*) FROM gone) >= 0 AND (SELECT count(*) FROM workers_gone) >= 0
ON CONFLICT (id) DO UPDATE
SET procs = excluded.procs, seen_at = excluded.seen_at, children = excluded.children,
    locked_on = excluded.locked_on

-- name: supervisor_lock
-- This supervisor's session-level lock (schema/0016), taken on its LISTEN connection: the
-- server's epoch if taken, NULL if a session still holds it (the previous connection, not yet
-- ended by the server).
SELECT CASE WHEN pg_try_advisory_lock({schema}.supervisor_lock_space(), hashtext(%(id)s))
            THEN {schema}.server_epoch() END

-- name: supervisors_gone
-- The other supervisors that said they held their lock on this server, in its present epoch,
-- and whose lock nobody holds now: their session ended (their process died, most often; see
-- rescue_orphans for when it did not). (A restart or a failover freed every lock at once: a
-- row written before it names another epoch until its supervisor, if alive, takes its lock
-- again and says so.) pg_locks is read once (supervisor_locks_held), not once per row.
SELECT s.id FROM {schema}.supervisor s
WHERE s.locked_on = {schema}.server_epoch() AND s.id <> %(id)s
  AND hashtext(s.id)::oid NOT IN (SELECT {schema}.supervisor_locks_held())

-- name: rescue_orphans
-- The running jobs of supervisors `ids` whose locks are still free in this statement (one that
-- took its lock back meanwhile keeps its jobs) end as worker deaths, but only those whose
-- heartbeat is also older than %(quiet)s seconds (1.5 heartbeat intervals: a beat was missed,
-- the next one late): a lock is
-- freed too when a living pod's LISTEN session ends (the server or a proxy ended it, a pooler
-- closed its server connection, the server crashed and restarted) or when only the supervisor
-- process died while its children finish their jobs; children that still beat keep their
-- jobs. A gone supervisor's row goes once none of its jobs is left running, so the next look
-- finds it no more. A job held by another transaction (its worker finishing it right now, or
-- another rescuer) is skipped: the next look or the heartbeat timeout covers it.
WITH gone AS MATERIALIZED (
    SELECT s.id, s.id || ':' AS prefix FROM {schema}.supervisor s
    WHERE s.id = ANY(%(ids)s::text[]) AND s.locked_on = {schema}.server_epoch()
      AND hashtext(s.id)::oid NOT IN (SELECT {schema}.supervisor_locks_held())
),
orphans AS MATERIALIZED (
    SELECT j.id, g.id AS supervisor
    FROM {schema}.job j JOIN gone g ON starts_with(j.worker_id, g.prefix)
    WHERE j.state = 'running'
),
-- the heartbeat's age is judged here, on the row this statement locks (read committed checks
-- it again on a row version a beat wrote meanwhile)
taken AS MATERIALIZED (
    SELECT j.id FROM {schema}.job j
    WHERE j.id IN (SELECT o.id FROM orphans o) AND j.state = 'running'
      AND {schema}.job_alive_at(j.state, j.worker_alive_at, j.worker_id)
          < now() - make_interval(secs => %(quiet)s)
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
),
forgotten AS (
    DELETE FROM {schema}.supervisor s USING gone g
    WHERE s.id = g.id
      AND NOT EXISTS (SELECT 1 FROM orphans o
                      WHERE o.supervisor = g.id AND o.id NOT IN (SELECT t.id FROM taken t))
)
SELECT job_id, job_type, new_state, retry_count
FROM {schema}.end_attempt(
    ARRAY(SELECT t.id FROM taken t ORDER BY t.id), NULL, NULL, %(error)s, NULL, 'rescued', true, 0)

-- name: supervisor_unregister
DELETE FROM {schema}.supervisor WHERE id = %(id)s

-- name: supervisors_list
-- Every registered supervisor, the longest running first; `seen_ago` in seconds by the
-- database's clock (a reader judges staleness by it).
SELECT id, host, pid, procs, types, started_at, seen_at, children,
       extract(epoch FROM now() - seen_at)::float8 AS seen_ago
FROM {schema}.supervisor
ORDER BY started_at, id

-- name: jobs_page
-- The dashboard's job list: newest first, one page after the keyset (before_at, before_id),
-- never OFFSET. Each filter is NULL for none; the web connections do not prepare statements,
-- so each query is planned with its values and a NULL filter folds away: the planner walks
-- job_created_idx, job_unusual_created_idx (failed, cancelled) or job_type_created_idx
-- backwards (a common state on job_created_idx: most rows are of one), or finds a
-- unique_key on job_unique_key_any_idx (schema/0010). A payload search (containment, @>)
-- has an index only where `dashboard-indexes --payload` made job_payload_idx; without it the
-- walk down job_created_idx reads rows until a page matches, so the caller bounds it with a
-- statement_timeout (web/jobs_view.py).
SELECT id, type, state, priority, unique_key, bundle_id, current_retry_count, max_retry_count,
       progress, error_msg, created_at, started_at, stopped_at, start_at, waiting_on, worker_id
FROM {schema}.job
WHERE (%(state)s::{schema}.job_state IS NULL OR state = %(state)s::{schema}.job_state)
  AND (%(type)s::text IS NULL OR type = %(type)s::text)
  AND (%(unique_key)s::text IS NULL OR unique_key = %(unique_key)s::text)
  AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
  AND (%(bundle_id)s::uuid IS NULL OR bundle_id = %(bundle_id)s::uuid)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
  AND (%(before_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: job_page_record
-- get_job for the dashboard's job page: the payload and the result only when stored (TOAST,
-- maybe compressed; pg_column_size reads the header, decompressing nothing) in at most
-- `inline` bytes, else NULL (job_body_head reads the start of the one cut off).
SELECT id, bundle_id, type,
       CASE WHEN pg_column_size(payload) <= %(inline)s THEN payload END AS payload,
       priority, origin, state, max_retry_count,
       current_retry_count, start_at, started_at, stopped_at,
       {schema}.job_alive_at(state, worker_alive_at, worker_id) AS worker_alive_at, worker_id,
       timeout, unique_key,
       CASE WHEN pg_column_size(result) <= %(inline)s THEN result END AS result,
       error_msg, error_data, attempts, created_at, updated_at,
       progress, waiting_on, depends_on, on_dependency_failure, has_dependents, concurrency_key,
       trace_context, snoozes, debounce_key, ordered_key, workflow_parent, tenant
FROM {schema}.job WHERE id = %(id)s

-- name: job_body_head
-- The first `chars` characters of a job's payload and of its result as JSON text, each with
-- the whole text's size in bytes (NULL: no result). Decompresses both whole, once per
-- change: the dashboard keeps them by the job's updated_at.
SELECT left(payload::text, %(chars)s), octet_length(payload::text),
       left(result::text, %(chars)s), octet_length(result::text), updated_at
FROM {schema}.job WHERE id = %(id)s

-- name: job_body
-- A job's payload or result whole, as JSON text (the job page's link to what it cut).
SELECT CASE WHEN %(part)s = 'payload' THEN payload::text ELSE result::text END
FROM {schema}.job WHERE id = %(id)s

-- name: job_dependencies
-- The jobs one job depends on, with where each stands (job_dependency_pkey).
SELECT j.id, j.type, j.state
FROM {schema}.job_dependency d JOIN {schema}.job j ON j.id = d.depends_on
WHERE d.job_id = %(id)s
ORDER BY j.created_at, j.id

-- name: job_dependents
-- The jobs that depend on one job (job_dependency_depends_on_idx), the first `limit`.
SELECT j.id, j.type, j.state
FROM {schema}.job_dependency d JOIN {schema}.job j ON j.id = d.job_id
WHERE d.depends_on = %(id)s
ORDER BY j.created_at, j.id
LIMIT %(limit)s

-- name: bundles_page
-- The newest bundles (a small table: bundles are deleted with their last job), each with its
-- completion job once complete, found as bundle_completion finds it (on job_pkey, from the
-- bundle's updated_at, `window` seconds on, else back to its creation): the page of bundles
-- first, then a few index entries for each complete one, never a scan of the job table.
WITH page AS (
    SELECT b.*,
           (lpad(to_hex(floor(extract(epoch FROM b.created_at) * 1000)::bigint), 12, '0')
            || repeat('0', 20))::uuid AS since,
           (lpad(to_hex(floor(extract(epoch FROM b.updated_at) * 1000)::bigint), 12, '0')
            || repeat('0', 20))::uuid AS done_from,
           (lpad(to_hex(floor(extract(epoch FROM b.updated_at
                                               + make_interval(secs => %(window)s))
                              * 1000)::bigint), 12, '0')
            || repeat('0', 20))::uuid AS done_until
    FROM {schema}.job_bundle b
    ORDER BY b.created_at DESC, b.id DESC
    LIMIT %(limit)s
)
SELECT b.id, b.type, b.origin, b.num_jobs, b.num_jobs_stopped, b.on_complete, b.created_at,
       b.updated_at, c.id AS completion_id, c.state AS completion_state
FROM page b
LEFT JOIN LATERAL (
    (SELECT j.id, j.state FROM {schema}.job j
     WHERE b.num_jobs > 0 AND b.num_jobs_stopped = b.num_jobs
       AND j.id >= b.done_from AND j.id < b.done_until AND j.type = b.on_complete
       AND j.payload @> jsonb_build_object('bundle_id', b.id::text)
     ORDER BY j.id
     LIMIT 1)
    UNION ALL
    (SELECT j.id, j.state FROM {schema}.job j
     WHERE b.num_jobs > 0 AND b.num_jobs_stopped = b.num_jobs
       AND j.id >= b.since AND j.id < b.done_from AND j.type = b.on_complete
       AND j.payload @> jsonb_build_object('bundle_id', b.id::text)
     ORDER BY j.id DESC
     LIMIT 1)
    LIMIT 1
) c ON true
ORDER BY b.created_at DESC, b.id DESC

-- name: bundle_completion
-- One complete bundle's completion job, on the primary key: the trigger that enqueues it
-- (schema/0001) sets the bundle's updated_at to its transaction's now() and gives the job an id
-- of the database's clock (new_id(), time-ordered) at or after it. So it is the first match
-- from `done_from` (updated_at's millisecond) on, `done_until` (a minute later) bounding that
-- walk; when a later change of the bundle (a member deleted) moved updated_at past it, the
-- newest match before `done_from`, back to the bundle's creation (`since`). A few index entries
-- either way, not a scan of the job table, whose (type, created_at) index is opt-in.
(SELECT j.id, j.type, j.state FROM {schema}.job j
 WHERE j.id >= %(done_from)s AND j.id < %(done_until)s AND j.type = %(type)s
   AND j.payload @> jsonb_build_object('bundle_id', %(id)s::text)
 ORDER BY j.id
 LIMIT 1)
UNION ALL
(SELECT j.id, j.type, j.state FROM {schema}.job j
 WHERE j.id >= %(since)s AND j.id < %(done_from)s AND j.type = %(type)s
   AND j.payload @> jsonb_build_object('bundle_id', %(id)s::text)
 ORDER BY j.id DESC
 LIMIT 1)
LIMIT 1

-- name: throughput
-- Jobs finished per minute over the last `minutes` minutes, succeeded and failed, on
-- job_finished_idx (state, stopped_at); minutes with none have no row.
SELECT date_trunc('minute', stopped_at) AS minute,
       (count(*) FILTER (WHERE state = 'succeeded'))::int AS succeeded,
       (count(*) FILTER (WHERE state = 'failed'))::int AS failed
FROM {schema}.job
WHERE state IN ('succeeded', 'failed')
  AND stopped_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
GROUP BY 1
ORDER BY 1

-- name: type_throughput
-- One type's jobs finished per bucket of `bucket` seconds over the last `window` seconds, on
-- job_finished_idx (state, stopped_at); the window bounds the rows read. Empty buckets have
-- no row.
SELECT date_bin(make_interval(secs => %(bucket)s), stopped_at, '2000-01-01 00:00+00') AS minute,
       (count(*) FILTER (WHERE state = 'succeeded'))::int AS succeeded,
       (count(*) FILTER (WHERE state = 'failed'))::int AS failed
FROM {schema}.job
WHERE state IN ('succeeded', 'failed') AND type = %(type)s
  AND stopped_at >= now() - make_interval(secs => %(window)s)
GROUP BY 1
ORDER BY 1

-- name: type_active
-- One type's unfinished jobs, each count on the partial index that holds its rows (as depth()
-- in schema/0014 does): a `state IN (...)` over the whole table would read every finished job.
-- Waiting jobs are found through their dependency rows (job_dependency_pkey leads with job_id).
-- Tenant jobs due when inserted are on job_tenant_idx (schema/0021), the others on job_claim_idx.
SELECT
    ((SELECT count(*) FROM {schema}.job
      WHERE state = 'pending' AND waiting_on = 0 AND start_at <= created_at AND tenant IS NULL
        AND type = %(type)s)
     + (SELECT count(*) FROM {schema}.job
        WHERE state = 'pending' AND waiting_on = 0 AND start_at <= created_at
          AND tenant IS NOT NULL AND type = %(type)s)
     + (SELECT count(*) FROM {schema}.job
        WHERE state = 'pending' AND waiting_on = 0 AND start_at > created_at
          AND start_at <= now() AND type = %(type)s))::int AS ready,
    (SELECT count(*) FROM {schema}.job
     WHERE state = 'pending' AND waiting_on = 0 AND start_at > created_at AND start_at > now()
       AND type = %(type)s)::int AS delayed,
    (SELECT count(*) FROM {schema}.job j
     WHERE j.state = 'pending' AND j.waiting_on > 0 AND j.type = %(type)s
       AND j.id IN (SELECT d.job_id FROM {schema}.job_dependency d))::int AS waiting,
    (SELECT count(*) FROM {schema}.job
     WHERE state = 'running' AND type = %(type)s)::int AS running,
    extract(epoch FROM now() - least(
        (SELECT min(start_at) FROM {schema}.job
         WHERE state = 'pending' AND waiting_on = 0 AND start_at <= created_at
           AND tenant IS NULL AND type = %(type)s),
        (SELECT min(start_at) FROM {schema}.job
         WHERE state = 'pending' AND waiting_on = 0 AND start_at <= created_at
           AND tenant IS NOT NULL AND type = %(type)s),
        (SELECT min(start_at) FROM {schema}.job
         WHERE state = 'pending' AND waiting_on = 0 AND start_at > created_at
           AND start_at <= now() AND type = %(type)s)))::float8 AS oldest_ready_age,
    (SELECT l.global_concurrency FROM {schema}.type_limit l WHERE l.type = %(type)s)
        AS global_concurrency,
    (SELECT l.key_concurrency FROM {schema}.type_limit l WHERE l.type = %(type)s)
        AS key_concurrency

-- name: type_durations
-- Run time (started_at to stopped_at, the last attempt's) percentiles of one type's jobs that
-- finished in the last `window` seconds, succeeded or failed; the same rows as type_throughput.
SELECT count(*)::int AS jobs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY s)::float8 AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY s)::float8 AS p95,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY s)::float8 AS p99,
       max(s)::float8 AS max
FROM (SELECT extract(epoch FROM stopped_at - started_at) AS s
      FROM {schema}.job
      WHERE state IN ('succeeded', 'failed') AND type = %(type)s AND started_at IS NOT NULL
        AND stopped_at >= now() - make_interval(secs => %(window)s)) d

-- name: type_names
-- The job types worth offering in a filter, without reading the job table: those a supervisor
-- serves, those running (job_running_idx holds the running jobs only), and those with a pause,
-- a rate, a limit or a schedule. A type nobody serves any more is typed in the address
-- (?type=NAME) or reached from its page. (Pending jobs are not read: a deep backlog would
-- make every Jobs page count it.)
SELECT type FROM {schema}.job WHERE state = 'running'
UNION SELECT unnest(types) FROM {schema}.supervisor
UNION SELECT type FROM {schema}.type_pause
UNION SELECT type FROM {schema}.type_rate
UNION SELECT type FROM {schema}.type_limit
UNION SELECT type FROM {schema}.schedule
ORDER BY 1

-- name: running_on
-- The running jobs (claimed: started_at is the claim's time) of the given workers, for the
-- Workers page to name the ones a child holds without having started them and to time the one
-- in hand (a few rows: job_running_idx holds the running jobs only).
SELECT id, type, state, worker_id, started_at
FROM {schema}.job
WHERE state = 'running' AND worker_id = ANY(%(workers)s::text[])
ORDER BY started_at, id

-- name: statement_time_limit
-- For the rest of the transaction: the Jobs page bounds a search no index serves with it.
SELECT set_config('statement_timeout', %(ms)s, true)

-- name: job_partitioned
-- Whether the job table is the partitioned one (schema/0029, opt-in: `partition`).
SELECT {schema}.job_partitioned()

-- name: dashboard_index_missing
-- The partitions of the job table (schema/0029) that have no part of the opt-in index
-- %(index)s yet (a partition made after it has its own: the parent's indexes are made on it).
SELECT c.relname::text
FROM pg_catalog.pg_inherits i
JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass(quote_ident(%(schema)s::text) || '.job')
  AND NOT EXISTS (
      SELECT FROM pg_catalog.pg_inherits x
      JOIN pg_catalog.pg_index ix ON ix.indexrelid = x.inhrelid
      WHERE x.inhparent = to_regclass(quote_ident(%(schema)s::text) || '.' || %(index)s::text)
        AND ix.indrelid = c.oid)
ORDER BY c.relname

-- name: delete_job
-- One finished job, by id; no row when it is unknown or not finished. The delete triggers
-- keep its bundle's counters and its dependents true, as for a purge.
DELETE FROM {schema}.job
WHERE id = %(id)s AND state IN ('succeeded', 'failed', 'cancelled')
RETURNING id

-- ---- schema-dump (admin/schema.py): the schema read back from the catalogs ----------------
-- Each schema_dump_* block but the first two returns (name, definition): one complete
-- statement per object, ordered by name in the "C" collation (the default collations of
-- servers differ, e.g. on where "_" sorts). They run after schema_dump_search_path, so the
-- pg_get_*def functions print the schema's own names unqualified, as the migrations write them.

-- name: health_backends
-- Sessions of this database whose transaction has been open longer than `older_than` seconds
-- and holds a snapshot or an xid: vacuum may not remove a row version they might still see, in
-- the job table or any other. And every backend holding an xmin outside any transaction
-- (xact_start NULL, transaction_age NULL): a walsender whose standby sends hot_standby_feedback
-- without a slot; vacuum.py judges it by its xmin's age. The farthest behind first (a healthy
-- standby's walsender, a few transactions behind, comes last).
SELECT a.pid, coalesce(a.usename::text, '') AS user_name, a.application_name,
       coalesce(a.state, '') AS state, a.backend_type::text AS backend_type,
       extract(epoch FROM now() - a.xact_start)::float8 AS transaction_age,
       age(coalesce(a.backend_xmin, a.backend_xid))::int AS xmin_age,
       left(coalesce(a.query, ''), 200) AS query
FROM pg_catalog.pg_stat_activity a
WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
  AND a.pid <> pg_backend_pid()
  AND (a.datname = current_database() OR a.datname IS NULL)
  AND (a.xact_start IS NULL OR a.xact_start < now() - make_interval(secs => %(older_than)s))
ORDER BY age(coalesce(a.backend_xmin, a.backend_xid)) DESC, a.xact_start
LIMIT 10

-- name: health_slots
-- Every replication slot: one with an xmin holds the horizon of every database (a standby's
-- hot_standby_feedback), a catalog_xmin that of the catalogs (logical decoding); an inactive
-- one also keeps WAL from restart_lsn on (`retained_bytes`).
SELECT s.slot_name::text AS name, s.slot_type AS slot_type, s.active,
       age(s.xmin)::int AS xmin_age, age(s.catalog_xmin)::int AS catalog_xmin_age,
       pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                            ELSE pg_current_wal_lsn() END, s.restart_lsn)::float8
           AS retained_bytes
FROM pg_catalog.pg_replication_slots s
ORDER BY s.slot_name

-- name: health_prepared
-- Prepared transactions (two-phase commit) never finished: each holds the horizon and its locks
-- until someone runs COMMIT PREPARED or ROLLBACK PREPARED.
SELECT p.gid, p.owner::text AS owner, p.database::text AS database,
       extract(epoch FROM now() - p.prepared)::float8 AS age,
       age(p.transaction)::int AS xmin_age
FROM pg_catalog.pg_prepared_xacts p
ORDER BY p.prepared

-- name: health_table
-- The job table's vacuum state, summed over its partitions where it has some (schema/0029): the statistics
-- collector's counts (approximate), its size with indexes and TOAST, its last vacuum of each
-- kind, and its autovacuum options (a partitioned table's: its partitions', the default
-- partition's).
SELECT sum(s.n_live_tup)::bigint AS live_tuples, sum(s.n_dead_tup)::bigint AS dead_tuples,
       sum(pg_total_relation_size(c.oid))::bigint AS total_bytes,
       sum(pg_relation_size(c.oid))::bigint AS table_bytes,
       max(s.last_vacuum) AS last_vacuum, max(s.last_autovacuum) AS last_autovacuum,
       sum(s.autovacuum_count)::bigint AS autovacuum_count,
       coalesce((SELECT d.reloptions FROM pg_catalog.pg_class d
                 WHERE d.oid = coalesce(
                     to_regclass(quote_ident(%(schema)s::text) || '.job_default'),
                     to_regclass(quote_ident(%(schema)s::text) || '.job'))),
                ARRAY[]::text[]) AS options,
       count(*)::int AS partitions
FROM {schema}.job_tables() t
JOIN pg_catalog.pg_class c ON c.oid = t
JOIN pg_catalog.pg_stat_all_tables s ON s.relid = c.oid
HAVING count(*) > 0

-- name: health_settings
-- The server's autovacuum settings, and the timeouts that end forgotten transactions.
SELECT name, setting || coalesce(unit, '') AS value FROM pg_catalog.pg_settings
WHERE name IN ('autovacuum', 'autovacuum_naptime', 'autovacuum_vacuum_scale_factor',
               'autovacuum_vacuum_threshold', 'autovacuum_vacuum_cost_limit',
               'autovacuum_vacuum_cost_delay', 'idle_in_transaction_session_timeout')
ORDER BY name

-- name: schema_dump_search_path
SET LOCAL search_path TO {schema}, pg_catalog

-- name: schema_dump_version
-- The newest migration applied, as its file is named (0013_stripe_choice).
SELECT lpad(version::text, 4, '0') || '_' || name
FROM {schema}.schema_version
ORDER BY version DESC
LIMIT 1

-- name: schema_dump_types
-- Enums (labels in their order), domains, composite types and ranges (their subtype); any other
-- kind as a comment naming it, so that it still shows in a diff. Array types and the row types
-- of tables come with what they belong to; an extension's types are the extension's.
SELECT t.typname AS name,
       CASE t.typtype
           WHEN 'e' THEN 'CREATE TYPE ' || quote_ident(t.typname) || ' AS ENUM ('
                || coalesce((SELECT string_agg(quote_literal(e.enumlabel), ', '
                                               ORDER BY e.enumsortorder)
                             FROM pg_enum e WHERE e.enumtypid = t.oid), '') || ');'
           WHEN 'd' THEN 'CREATE DOMAIN ' || quote_ident(t.typname) || ' AS '
                || format_type(t.typbasetype, t.typtypmod)
                || coalesce(' DEFAULT ' || pg_get_expr(t.typdefaultbin, 0), '')
                || CASE WHEN t.typnotnull THEN ' NOT NULL' ELSE '' END
                || coalesce((SELECT string_agg(' CONSTRAINT ' || quote_ident(o.conname) || ' '
                                               || pg_get_constraintdef(o.oid, true),
                                               '' ORDER BY o.conname COLLATE "C")
                             FROM pg_constraint o
                             WHERE o.contypid = t.oid AND o.contype <> 'n'), '') || ';'
           WHEN 'c' THEN 'CREATE TYPE ' || quote_ident(t.typname) || ' AS ('
                || coalesce((SELECT string_agg(quote_ident(a.attname) || ' '
                                               || format_type(a.atttypid, a.atttypmod),
                                               ', ' ORDER BY a.attnum)
                             FROM pg_attribute a
                             WHERE a.attrelid = t.typrelid AND a.attnum > 0
                               AND NOT a.attisdropped), '') || ');'
           WHEN 'r' THEN 'CREATE TYPE ' || quote_ident(t.typname) || ' AS RANGE (SUBTYPE = '
                || (SELECT format_type(r.rngsubtype, NULL) FROM pg_range r
                    WHERE r.rngtypid = t.oid) || ');'
           ELSE '-- type ' || quote_ident(t.typname) || ' (typtype ' || t.typtype::text || ')'
       END AS definition
FROM pg_type t
JOIN pg_namespace n ON n.oid = t.typnamespace
LEFT JOIN pg_class c ON c.oid = t.typrelid
WHERE n.nspname = %(schema)s
  AND t.typcategory <> 'A' AND t.typtype <> 'm'  -- arrays; a range's multirange
  AND (c.relkind IS NULL OR c.relkind = 'c')
  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_type'::regclass
                  AND d.objid = t.oid AND d.deptype = 'e')
ORDER BY t.typname COLLATE "C"

-- name: schema_dump_sequences
-- Sequences, but those of identity columns (shown on their column).
SELECT c.relname AS name,
       'CREATE SEQUENCE ' || quote_ident(c.relname) || ' AS ' || format_type(s.seqtypid, NULL)
       || ' INCREMENT BY ' || s.seqincrement || ' MINVALUE ' || s.seqmin
       || ' MAXVALUE ' || s.seqmax || ' START WITH ' || s.seqstart || ' CACHE ' || s.seqcache
       || CASE WHEN s.seqcycle THEN ' CYCLE' ELSE '' END || ';' AS definition
FROM pg_sequence s
JOIN pg_class c ON c.oid = s.seqrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s
  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                  AND d.objid = c.oid AND d.deptype = 'i')
ORDER BY c.relname COLLATE "C"

-- name: schema_dump_tables
-- Each table: its columns in their order (type, collation when not the type's, identity or
-- generation, default, NOT NULL), then its constraints by kind (primary key, unique, foreign
-- key, check, exclusion) and name, then its storage options. PostgreSQL 18 also keeps each
-- NOT NULL as a constraint (contype 'n'); 15 does not: they are shown on their columns only.
SELECT c.relname AS name,
       'CREATE ' || CASE c.relpersistence WHEN 'u' THEN 'UNLOGGED ' ELSE '' END
       || 'TABLE ' || quote_ident(c.relname) || E' (\n'
       || coalesce((SELECT string_agg('    ' || l.line, E',\n'
                                      ORDER BY l.part, l.ord, l.name COLLATE "C")
                    FROM (SELECT 1 AS part, a.attnum::int AS ord, ''::text AS name,
                                 rpad(quote_ident(a.attname),
                                      max(length(quote_ident(a.attname))) OVER ())
                                 || ' ' || format_type(a.atttypid, a.atttypmod)
                                 || CASE WHEN a.attcollation <> t.typcollation
                                         THEN ' COLLATE ' || a.attcollation::regcollation::text
                                         ELSE '' END
                                 || CASE a.attidentity
                                        WHEN 'a' THEN ' GENERATED ALWAYS AS IDENTITY'
                                        WHEN 'd' THEN ' GENERATED BY DEFAULT AS IDENTITY'
                                        ELSE '' END
                                 || CASE WHEN a.attgenerated <> ''
                                         THEN ' GENERATED ALWAYS AS ('
                                              || pg_get_expr(d.adbin, d.adrelid) || ')'
                                              || CASE a.attgenerated WHEN 's' THEN ' STORED'
                                                                     ELSE ' VIRTUAL' END
                                         ELSE coalesce(' DEFAULT '
                                                       || pg_get_expr(d.adbin, d.adrelid), '')
                                    END
                                 || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END AS line
                          FROM pg_attribute a
                          JOIN pg_type t ON t.oid = a.atttypid
                          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                          WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                          UNION ALL
                          SELECT 2, CASE o.contype WHEN 'p' THEN 1 WHEN 'u' THEN 2 WHEN 'f' THEN 3
                                                   WHEN 'c' THEN 4 ELSE 5 END,
                                 o.conname::text,
                                 'CONSTRAINT ' || quote_ident(o.conname) || ' '
                                 || pg_get_constraintdef(o.oid, true)
                          FROM pg_constraint o
                          WHERE o.conrelid = c.oid AND o.contype <> 'n'
                            AND o.conparentid = 0) l), '')  -- not a partition's own copy
       || E'\n)'
       || CASE WHEN c.relkind = 'p' THEN ' PARTITION BY ' || pg_get_partkeydef(c.oid) ELSE '' END
       || coalesce(E'\nWITH (' || array_to_string(c.reloptions, ', ') || ')', '') || ';'
       AS definition
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p')
  AND NOT c.relispartition  -- job's partitions are named by date: their parent shows them
ORDER BY c.relname COLLATE "C"

-- name: schema_dump_indexes
-- Indexes by table, then name, but those of primary key, unique and exclusion constraints
-- (the table shows the constraint). An index a failed CREATE INDEX CONCURRENTLY left
-- behind is marked.
SELECT i.relname AS name,
       pg_get_indexdef(i.oid, 0, true) || ';'
       || CASE WHEN x.indisvalid THEN '' ELSE '  -- INVALID' END AS definition
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = i.relnamespace
WHERE n.nspname = %(schema)s AND NOT t.relispartition
  AND NOT EXISTS (SELECT FROM pg_constraint o WHERE o.conrelid = x.indrelid
                  AND o.conindid = x.indexrelid AND o.contype IN ('p', 'u', 'x'))
ORDER BY t.relname COLLATE "C", i.relname COLLATE "C"

-- name: schema_dump_triggers
-- Triggers by table, then name (not the internal ones that enforce foreign keys).
SELECT g.tgname AS name, pg_get_triggerdef(g.oid, true) || ';' AS definition
FROM pg_trigger g
JOIN pg_class t ON t.oid = g.tgrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = %(schema)s AND NOT g.tgisinternal AND NOT t.relispartition
ORDER BY t.relname COLLATE "C", g.tgname COLLATE "C"

-- name: schema_dump_views
-- Views and materialized views. pg_get_viewdef is the one printer whose text changed between
-- the versions the suite runs on: from 16 on, a view over one table no longer qualifies its
-- columns (15: "SELECT extra.n", 18: "SELECT n"). The schema has no view; one added would make
-- the dump differ between server versions, unless normalised here then.
SELECT c.relname AS name,
       'CREATE ' || CASE c.relkind WHEN 'm' THEN 'MATERIALIZED ' ELSE '' END || 'VIEW '
       || quote_ident(c.relname) || E' AS\n' || pg_get_viewdef(c.oid, true) AS definition
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('v', 'm')
ORDER BY c.relname COLLATE "C"

-- name: schema_dump_functions
-- Every function as pg_get_functiondef prints it, by name and arguments, but for two lines that
-- would name the schema: the first, rebuilt with the name unqualified (pg_get_functiondef
-- always qualifies it), and the search_path a migration's function captured (SET search_path
-- FROM CURRENT: the schema, pg_catalog, then pg_temp), written back as the migrations write it.
-- Aggregates have no such definition: a comment names them. Not shown: an extension's
-- functions, and those a type made for itself (a range's constructors).
SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' AS name,
       CASE WHEN p.prokind = 'a'
            THEN '-- aggregate ' || quote_ident(p.proname)
                 || '(' || pg_get_function_identity_arguments(p.oid) || ')'
            ELSE 'CREATE OR REPLACE '
                 || CASE p.prokind WHEN 'p' THEN 'PROCEDURE ' ELSE 'FUNCTION ' END
                 || quote_ident(p.proname) || '(' || pg_get_function_arguments(p.oid) || ')'
                 || rtrim(replace(substr(f.def, strpos(f.def, E'\n')),
                                  E'\n SET search_path TO ''' || replace(n.nspname, '''', '''''')
                                  || E''', ''pg_catalog'', ''pg_temp''\n',
                                  E'\n SET search_path FROM CURRENT\n'), E'\n') || ';'
       END AS definition
FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
CROSS JOIN LATERAL (SELECT CASE WHEN p.prokind <> 'a' THEN pg_get_functiondef(p.oid) END AS def) f
WHERE n.nspname = %(schema)s
  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                  AND d.objid = p.oid AND d.deptype IN ('e', 'i'))
ORDER BY p.proname COLLATE "C", pg_get_function_identity_arguments(p.oid) COLLATE "C"

-- name: workflow_history
-- A workflow's steps in the order its code reached them, read once at the start of each run
-- (schema/0020); `wake_in`: seconds to a sleep's end or a wait's deadline, by the database's
-- clock (negative: passed).
SELECT seq, name, kind, state, result, error, tries,
       extract(epoch FROM wake_at - now())::float8 AS wake_in
FROM {schema}.workflow_step WHERE job_id = %(id)s ORDER BY seq

-- name: workflow_signals
-- The signals sent to a job so far, by name (a wait reached after its signal finds it here).
SELECT name, payload FROM {schema}.workflow_signal WHERE job_id = %(id)s

-- name: workflow_record
-- Write step `seq` of a workflow, only while the job is running under `lease` (fencing, as
-- every worker write). A step row already there is updated unless it succeeded: that is a
-- second writer of the same step (a stale worker, or a rescue's next run) and gets no row, so
-- the caller rolls back what it did in the transaction. `wake_at`, or `wake_in` seconds from
-- now, starts a sleep or a wait's deadline.
INSERT INTO {schema}.workflow_step AS s
    (job_id, seq, name, kind, state, result, error, tries, wake_at, duration, finished_at)
SELECT %(id)s, %(seq)s, %(name)s, %(kind)s, %(state)s, %(result)s::jsonb, %(error)s,
       %(tries)s, coalesce(%(wake_at)s::timestamptz, now() + make_interval(secs => %(wake_in)s::float8)),
       %(duration)s::float8, CASE WHEN %(finished)s THEN now() END
FROM {schema}.job j
WHERE j.id = %(id)s AND j.state = 'running' AND j.lease = %(lease)s
ON CONFLICT (job_id, seq) DO UPDATE
SET state = excluded.state, result = excluded.result, error = excluded.error,
    tries = excluded.tries, wake_at = coalesce(excluded.wake_at, s.wake_at),
    duration = excluded.duration, finished_at = excluded.finished_at
WHERE s.state <> 'succeeded' AND s.name = excluded.name AND s.kind = excluded.kind
RETURNING seq, extract(epoch FROM wake_at - now())::float8 AS wake_in

-- name: workflow_suspend
-- The workflow sleeps or waits: pending again in `delay` seconds, no attempt counted, fenced by
-- the lease; waiting for the signal `wait`, due at once if it came meanwhile (schema/0020).
SELECT job_id, job_type, new_state, retry_count
FROM {schema}.workflow_suspend(%(id)s::uuid, %(lease)s::uuid, %(delay)s::float8, %(wait)s::text)

-- name: workflow_signal
-- pgq.signal: kept, and the job woken if it waits for it; NULL: no such job.
SELECT {schema}.workflow_signal(%(id)s::uuid, %(name)s::text, %(payload)s::jsonb)

-- name: workflow_adopt
-- A child enqueued by a workflow step: its end is signalled to the workflow.
UPDATE {schema}.job SET workflow_parent = %(parent)s WHERE id = %(id)s

-- name: workflow_steps
-- A workflow's steps as `show` and the dashboard list them.
SELECT seq, name, kind, state, result, error, tries, wake_at, duration, started_at, finished_at
FROM {schema}.workflow_step WHERE job_id = %(id)s ORDER BY seq

-- name: workflows_paused
-- Pending workflows by type and what they are paused on (their last step: sleeping, waiting,
-- retrying), for pgq_workflows_paused; reads workflow_step_paused_idx's rows only.
SELECT j.type, s.state, count(*)::int
FROM {schema}.workflow_step s JOIN {schema}.job j ON j.id = s.job_id
WHERE s.state IN ('sleeping', 'waiting', 'retrying') AND j.state = 'pending'
GROUP BY 1, 2

-- name: horizon_held
-- Seconds the oldest snapshot of another session of this database (or a prepared transaction)
-- has been held: while it is held, vacuum can remove no row version made since (0: none).
SELECT coalesce(extract(epoch FROM now() - least(
           (SELECT min(a.xact_start) FROM pg_catalog.pg_stat_activity a
            WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
              AND a.datname = current_database()),
           (SELECT min(p.prepared) FROM pg_catalog.pg_prepared_xacts p
            WHERE p.database = current_database()))), 0)::float8

-- name: claim_floor_refresh
-- The claim floors of the types (schema/0022): walked past their dead prefix; `full` from the
-- start of the index. Returns how many types were walked.
SELECT {schema}.claim_floor_refresh(%(types)s::text[], %(full)s::boolean)

-- name: claim_floor_clear
-- The horizon moved on: the types' claims walk from the start again.
SELECT {schema}.claim_floor_clear(%(types)s::text[])
