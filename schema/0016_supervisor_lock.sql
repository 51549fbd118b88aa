-- pgq_supervisor schema, version 16: a dead supervisor's jobs come back in seconds.
--
-- Each supervisor holds a session-level advisory lock, keyed (supervisor_lock_space(),
-- hashtext(its id)), on its LISTEN connection (the one connection that must be a real session,
-- even behind PgBouncer), and says so in its row: `locked_on`, the server_epoch() of the server
-- that granted it. When its process dies, PostgreSQL ends the session and frees the lock at
-- once; another supervisor that finds a row locked on the server it is talking to now, whose
-- lock nobody holds, reclaims the running jobs of that supervisor's children (their worker_id
-- starts with its id and a colon) as worker deaths, without waiting for dead_after.
-- A lock can also be freed while the pod lives (its LISTEN session ended by the server, a
-- proxy's idle timeout, a pooler that closed its server connection, a crash-restart of the
-- server; or only the supervisor process died while its children finish their jobs): so a
-- job is taken back only once its heartbeat has also gone quiet, for 1.5 times the rescuer's
-- heartbeat_interval (queries.sql, rescue_orphans). Live children keep their jobs.
-- locked_on NULL (an older version, or a supervisor whose LISTEN connection is down) and a
-- row locked on another epoch (written before a restart or a failover freed every lock, until
-- its supervisor takes its lock again and says so) are left to the heartbeat timeout.
ALTER TABLE supervisor ADD COLUMN locked_on text;

-- This server's life: its postmaster's start and its WAL timeline (a promoted standby has a
-- new one). Every lock was freed when it last changed. A primary's only (it reads the WAL
-- insert position).
CREATE FUNCTION server_epoch() RETURNS text
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    -- as a number: text of a timestamptz follows each session's TimeZone and DateStyle
    SELECT extract(epoch FROM pg_postmaster_start_time())::text || ' timeline '
           || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)
$$;

-- The first key of every supervisor lock of this schema. A hash collision with another
-- supervisor's second key only makes a dead one look alive: its jobs wait for dead_after.
CREATE FUNCTION supervisor_lock_space() RETURNS integer
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT hashtext('pgq_supervisor:' || current_schema())
$$;

-- The second keys of the supervisor locks of this schema that some session holds now (in this
-- database): a supervisor whose hashtext(id) is not among them has lost its session. One read
-- of pg_locks (it takes every lock partition's LWLock) for a whole look, not one per row.
CREATE FUNCTION supervisor_locks_held() RETURNS SETOF oid
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT l.objid FROM pg_catalog.pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                        WHERE d.datname = current_database())
      AND l.classid = supervisor_lock_space()::oid
$$;
