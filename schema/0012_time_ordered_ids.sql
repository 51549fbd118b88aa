-- pgq_supervisor schema, version 12: job and bundle ids made in the database are time-ordered
-- (version-7 UUIDs, RFC 9562), as those the library makes (db/params.py, time_ordered).
--
-- A state change is never a HOT update (job_claim_idx and job_finished_idx cover state), so
-- every claim and completion writes a new entry into every index of the job, the primary key
-- included. With random (version-4) ids those entries land on random leaves of an id index
-- that grows with the table: behind 5,000,000 finished jobs each one was a buffer miss and,
-- after a checkpoint, a full-page write, and the drain of a million jobs ran at 0.62 of its
-- pace on a fresh table. Time-ordered ids put the jobs being worked on at the index's right
-- edge, a few hot leaves. They still carry 74 random bits; they also tell when a job was made.
CREATE FUNCTION new_id() RETURNS uuid
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
    -- gen_random_uuid()'s bytes, the first six replaced by the Unix time in milliseconds and
    -- the version nibble turned from 4 (0100) into 7 (0111)
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp())
                                                     * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

ALTER TABLE job ALTER COLUMN id SET DEFAULT new_id();
ALTER TABLE job_bundle ALTER COLUMN id SET DEFAULT new_id();
