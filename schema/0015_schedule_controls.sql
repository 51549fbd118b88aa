-- pgq_supervisor schema, version 15: what the dashboard's Schedules page acts on.
--
-- payload: the schedule's payload as its supervisor last declared it, so that "run now" (from
-- the dashboard, with no registry at hand) enqueues the job a tick would. NULL until a
-- supervisor declares the schedule again after this migration (each does at start).
-- paused_at, paused_by: a paused schedule enqueues nothing (schedule_enqueue moves last_tick
-- only when paused_at IS NULL); resuming moves last_tick to now, so the ticks missed while
-- paused are skipped, not caught up.
ALTER TABLE schedule
    ADD COLUMN payload jsonb,
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN paused_by text;
