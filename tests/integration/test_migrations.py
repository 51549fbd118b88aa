"""Migrations: the migrated database is the declared schema; migrate is idempotent and safe."""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

import pgq_supervisor as pgq
from pgq_supervisor import db, schema, testing
from pgq_supervisor.db import Conn
from tests.support.db import count_rows, in_threads

# The declared schema, as PostgreSQL prints it back; "{s}" is the schema name.
JOB_COLUMNS = {
    "id": ("uuid", False),
    "bundle_id": ("uuid", True),
    "type": ("text", False),
    "payload": ("jsonb", False),
    "priority": ("integer", False),
    "origin": ("text", True),
    "state": ("job_state", False),
    "max_retry_count": ("integer", True),
    "current_retry_count": ("integer", False),
    "start_at": ("timestamp with time zone", False),
    "started_at": ("timestamp with time zone", True),
    "stopped_at": ("timestamp with time zone", True),
    "worker_alive_at": ("timestamp with time zone", True),
    "worker_id": ("text", True),
    "lease": ("uuid", True),
    "timeout": ("double precision", True),
    "unique_key": ("text", True),
    "result": ("jsonb", True),
    "error_msg": ("text", True),
    "error_data": ("jsonb", True),
    "attempts": ("jsonb", False),
    "progress": ("jsonb", True),
    "created_at": ("timestamp with time zone", False),
    "updated_at": ("timestamp with time zone", False),
    "waiting_on": ("integer", False),
    "trace_context": ("text", True),
    "depends_on": ("ARRAY", True),
    "on_dependency_failure": ("text", True),
    "has_dependents": ("boolean", False),
    "concurrency_key": ("text", True),
    "snoozes": ("integer", False),
    "debounce_key": ("text", True),
    "ordered_key": ("text", True),
    "ordered_seq": ("bigint", True),
    "workflow_parent": ("uuid", True),
    "tenant": ("text", True),
}
DEPENDENCY_COLUMNS = {
    "job_id": ("uuid", False),
    "depends_on": ("uuid", False),
}
BUNDLE_COLUMNS = {
    "id": ("uuid", False),
    "type": ("text", False),
    "origin": ("text", True),
    "num_jobs": ("integer", False),
    "num_jobs_stopped": ("integer", False),
    "on_complete": ("text", True),
    "created_at": ("timestamp with time zone", False),
    "updated_at": ("timestamp with time zone", False),
}
SCHEDULE_COLUMNS = {
    "name": ("text", False),
    "type": ("text", False),
    "cron": ("text", True),
    "every": ("interval", True),
    "timezone": ("text", False),
    "priority": ("integer", False),
    "catch_up": ("integer", False),
    "created_at": ("timestamp with time zone", False),
    "declared_at": ("timestamp with time zone", False),
    "last_tick": ("timestamp with time zone", True),
    "last_job_id": ("uuid", True),
    # 0015: what the dashboard's "run now" enqueues, and a schedule's pause
    "payload": ("jsonb", True),
    "paused_at": ("timestamp with time zone", True),
    "paused_by": ("text", True),
}
VERSION_COLUMNS = {
    "version": ("integer", False),
    "name": ("text", False),
    "applied_at": ("timestamp with time zone", False),
}
TYPE_PAUSE_COLUMNS = {
    "type": ("text", False),
    "paused_at": ("timestamp with time zone", False),
    "paused_by": ("text", True),
    "reason": ("text", True),
}
TYPE_RATE_COLUMNS = {
    "type": ("text", False),
    "max_starts": ("integer", False),
    "period": ("double precision", False),
    "buckets": ("ARRAY", False),
    "counts": ("ARRAY", False),
    "updated_at": ("timestamp with time zone", False),
}
TYPE_LIMIT_COLUMNS = {
    "type": ("text", False),
    "global_concurrency": ("integer", True),
    "key_concurrency": ("integer", True),
    "updated_at": ("timestamp with time zone", False),
}
TYPE_LIMIT_STRIPE_COLUMNS = {
    "type": ("text", False),
    "stripe": ("integer", False),
    "slots": ("integer", False),
    "leases": ("ARRAY", False),
}
FAIR_CURSOR_COLUMNS = {
    "type": ("text", False),
    "stripe": ("integer", False),
    "last_tenant": ("text", True),
}
# schema/0022: claim floors
CLAIM_FLOOR_COLUMNS = {
    "type": ("text", False),
    "levels": ("ARRAY", False),
    "ats": ("ARRAY", False),
    "upto": ("timestamp with time zone", False),
    "walked_at": ("timestamp with time zone", False),
}
TENANT_WEIGHT_COLUMNS = {
    "type": ("text", False),
    "tenant": ("text", False),
    "weight": ("integer", False),
    "updated_at": ("timestamp with time zone", False),
}
SUPERVISOR_COLUMNS = {
    "id": ("text", False),
    "host": ("text", False),
    "pid": ("integer", False),
    "procs": ("integer", False),
    "types": ("ARRAY", False),
    "started_at": ("timestamp with time zone", False),
    "seen_at": ("timestamp with time zone", False),
    "children": ("jsonb", False),
    "locked_on": ("text", True),
    "child_beats": ("boolean", False),
}
JOB_UNIQUE_COLUMNS = {  # schema/0027: the unique key held by an unfinished job
    "unique_key": ("text", False),
    "job_id": ("uuid", False),
}
WORKER_COLUMNS = {
    "id": ("text", False),
    "alive_at": ("timestamp with time zone", False),
}
INDEXES = {
    "job_pkey": "CREATE UNIQUE INDEX job_pkey ON {s}.job USING btree (id)",
    "job_bundle_pkey": "CREATE UNIQUE INDEX job_bundle_pkey ON {s}.job_bundle USING btree (id)",
    "schedule_pkey": "CREATE UNIQUE INDEX schedule_pkey ON {s}.schedule USING btree (name)",
    "schema_version_pkey": (
        "CREATE UNIQUE INDEX schema_version_pkey ON {s}.schema_version USING btree (version)"
    ),
    "job_claim_idx": (
        "CREATE INDEX job_claim_idx ON {s}.job USING btree (priority DESC, created_at, id)"
        " WHERE ((state = 'pending'::{s}.job_state) AND (waiting_on = 0)"
        " AND (start_at <= created_at) AND (tenant IS NULL))"
    ),
    "job_tenant_idx": (
        "CREATE INDEX job_tenant_idx ON {s}.job USING btree"
        " (type, tenant, priority DESC, created_at, id)"
        " WHERE ((state = 'pending'::{s}.job_state) AND (waiting_on = 0)"
        " AND (start_at <= created_at) AND (tenant IS NOT NULL))"
    ),
    "claim_floor_pkey": (
        "CREATE UNIQUE INDEX claim_floor_pkey ON {s}.claim_floor USING btree (type)"
    ),
    "fair_cursor_pkey": (
        "CREATE UNIQUE INDEX fair_cursor_pkey ON {s}.fair_cursor USING btree (type, stripe)"
    ),
    "tenant_weight_pkey": (
        "CREATE UNIQUE INDEX tenant_weight_pkey ON {s}.tenant_weight USING btree (type, tenant)"
    ),
    "job_unique_key_idx": (
        "CREATE UNIQUE INDEX job_unique_key_idx ON {s}.job USING btree (unique_key)"
        " WHERE ((unique_key IS NOT NULL) AND (state = ANY"
        " (ARRAY['pending'::{s}.job_state, 'running'::{s}.job_state])))"
    ),
    "job_bundle_idx": (
        "CREATE INDEX job_bundle_idx ON {s}.job USING btree (bundle_id)"
        " WHERE (bundle_id IS NOT NULL)"
    ),
    "job_running_idx": (
        "CREATE INDEX job_running_idx ON {s}.job USING btree (lease)"
        " WHERE (state = 'running'::{s}.job_state)"
    ),
    "job_dependency_pkey": (
        "CREATE UNIQUE INDEX job_dependency_pkey ON {s}.job_dependency USING btree"
        " (job_id, depends_on)"
    ),
    "job_dependency_depends_on_idx": (
        "CREATE INDEX job_dependency_depends_on_idx ON {s}.job_dependency USING btree (depends_on)"
    ),
    "type_pause_pkey": "CREATE UNIQUE INDEX type_pause_pkey ON {s}.type_pause USING btree (type)",
    "type_rate_pkey": "CREATE UNIQUE INDEX type_rate_pkey ON {s}.type_rate USING btree (type)",
    "type_limit_pkey": ("CREATE UNIQUE INDEX type_limit_pkey ON {s}.type_limit USING btree (type)"),
    "type_limit_stripe_pkey": (
        "CREATE UNIQUE INDEX type_limit_stripe_pkey ON {s}.type_limit_stripe USING btree"
        " (type, stripe)"
    ),
    "job_finished_idx": (
        "CREATE INDEX job_finished_idx ON {s}.job USING btree (state, stopped_at)"
        " WHERE (stopped_at IS NOT NULL)"
    ),
    "job_delayed_idx": (
        "CREATE INDEX job_delayed_idx ON {s}.job USING btree (start_at, type)"
        " WHERE ((state = 'pending'::{s}.job_state) AND (waiting_on = 0)"
        " AND (start_at > created_at))"
    ),
    "supervisor_pkey": "CREATE UNIQUE INDEX supervisor_pkey ON {s}.supervisor USING btree (id)",
    "job_unusual_created_idx": (
        "CREATE INDEX job_unusual_created_idx ON {s}.job USING btree (state, created_at, id)"
        " WHERE (state = ANY (ARRAY['failed'::{s}.job_state, 'cancelled'::{s}.job_state]))"
    ),
    "job_unique_key_any_idx": (
        "CREATE INDEX job_unique_key_any_idx ON {s}.job USING btree (unique_key)"
        " WHERE (unique_key IS NOT NULL)"
    ),
    "job_unique_finished_idx": (
        "CREATE INDEX job_unique_finished_idx ON {s}.job USING btree (unique_key, created_at DESC)"
        " WHERE ((unique_key IS NOT NULL) AND (stopped_at IS NOT NULL))"
    ),
    "job_ordered_idx": (
        "CREATE INDEX job_ordered_idx ON {s}.job USING btree (ordered_key, ordered_seq)"
        " WHERE ((ordered_key IS NOT NULL) AND (state = ANY (ARRAY['pending'::{s}.job_state,"
        " 'running'::{s}.job_state, 'failed'::{s}.job_state])))"
    ),
    "job_debounce_key_idx": (
        "CREATE INDEX job_debounce_key_idx ON {s}.job USING btree (debounce_key)"
        " WHERE ((debounce_key IS NOT NULL) AND (state = ANY (ARRAY['pending'::{s}.job_state,"
        " 'running'::{s}.job_state])))"
    ),
}
_TERMINAL = "ARRAY['succeeded'::{s}.job_state, 'failed'::{s}.job_state, 'cancelled'::{s}.job_state]"
CHECKS = {
    ("job", "job_type_check"): "CHECK (((char_length(type) >= 1) AND (char_length(type) <= 100)))",
    ("job", "job_max_retry_count_check"): "CHECK ((max_retry_count >= 0))",
    ("job", "job_snoozes_range"): "CHECK ((snoozes >= 0))",
    ("job", "job_tenant_length"): (
        "CHECK (((tenant IS NULL) OR ((char_length(tenant) >= 1)"
        " AND (char_length(tenant) <= 200))))"
    ),
    ("claim_floor", "claim_floor_check"): "CHECK ((cardinality(levels) = cardinality(ats)))",
    ("claim_floor", "claim_floor_type_check"): (
        "CHECK (((char_length(type) >= 1) AND (char_length(type) <= 100)))"
    ),
    ("fair_cursor", "fair_cursor_stripe_check"): "CHECK (((stripe >= 0) AND (stripe <= 7)))",
    ("fair_cursor", "fair_cursor_type_check"): (
        "CHECK (((char_length(type) >= 1) AND (char_length(type) <= 100)))"
    ),
    ("tenant_weight", "tenant_weight_tenant_check"): (
        "CHECK (((char_length(tenant) >= 1) AND (char_length(tenant) <= 200)))"
    ),
    ("tenant_weight", "tenant_weight_type_check"): (
        "CHECK (((char_length(type) >= 1) AND (char_length(type) <= 100)))"
    ),
    ("tenant_weight", "tenant_weight_weight_check"): (
        "CHECK (((weight >= 1) AND (weight <= 1000)))"
    ),
    ("job", "job_ordered_key_length"): (
        "CHECK (((ordered_key IS NULL) OR ((char_length(ordered_key) >= 1)"
        " AND (char_length(ordered_key) <= 200))))"
    ),
    ("job", "job_timeout_check"): (
        "CHECK (((timeout IS NULL) OR (timeout > (0)::double precision)))"
    ),
    ("job", "job_retry_range"): (
        "CHECK (((current_retry_count >= 0) AND (current_retry_count <= max_retry_count)))"
    ),
    ("job", "job_running_is_started"): (
        "CHECK (((state = 'running'::{s}.job_state) ="
        " ((started_at IS NOT NULL) AND (stopped_at IS NULL))))"
    ),
    ("job", "job_terminal_is_stopped"): (
        "CHECK (((state = ANY (" + _TERMINAL + ")) = (stopped_at IS NOT NULL)))"
    ),
    ("job", "job_pending_is_unclaimed"): (
        "CHECK (((state <> 'pending'::{s}.job_state) OR ((started_at IS NULL)"
        " AND (worker_alive_at IS NULL) AND (worker_id IS NULL) AND (lease IS NULL))))"
    ),
    ("job", "job_heartbeat_only_running"): (
        "CHECK (((worker_alive_at IS NULL) OR (state = 'running'::{s}.job_state)))"
    ),
    ("job", "job_running_has_lease"): (
        "CHECK (((state <> 'running'::{s}.job_state) OR ((lease IS NOT NULL)"
        " AND (worker_id IS NOT NULL) AND (worker_alive_at IS NOT NULL)"
        " AND (max_retry_count IS NOT NULL))))"
    ),
    ("job", "job_failed_has_error"): (
        "CHECK (((state <> 'failed'::{s}.job_state) OR (error_msg IS NOT NULL)))"
    ),
    ("job", "job_waiting_only_pending"): (
        "CHECK (((waiting_on = 0) OR (state = 'pending'::{s}.job_state)))"
    ),
    ("job", "job_waiting_on_range"): "CHECK ((waiting_on >= 0))",
    ("job", "job_dependency_failure_rule"): (
        "CHECK ((((depends_on IS NULL) AND (on_dependency_failure IS NULL))"
        " OR ((depends_on IS NOT NULL) AND (on_dependency_failure = ANY"
        " (ARRAY['cancel'::text, 'run'::text])))))"
    ),
    ("job_bundle", "job_bundle_type_check"): (
        "CHECK (((char_length(type) >= 1) AND (char_length(type) <= 100)))"
    ),
    ("job_bundle", "job_bundle_num_jobs_check"): "CHECK ((num_jobs >= 0))",
    ("job_bundle", "job_bundle_on_complete_check"): (
        "CHECK (((on_complete IS NULL) OR ((char_length(on_complete) >= 1)"
        " AND (char_length(on_complete) <= 100))))"
    ),
    ("job_bundle", "job_bundle_counter_range"): (
        "CHECK (((num_jobs_stopped >= 0) AND (num_jobs_stopped <= num_jobs)))"
    ),
    ("schedule", "schedule_name_check"): (
        "CHECK (((char_length(name) >= 1) AND (char_length(name) <= 100)))"
    ),
    ("schedule", "schedule_type_check"): (
        "CHECK (((char_length(type) >= 1) AND (char_length(type) <= 100)))"
    ),
    ("schedule", "schedule_catch_up_check"): "CHECK ((catch_up >= 0))",
    ("schedule", "schedule_cron_or_every"): "CHECK (((cron IS NULL) <> (every IS NULL)))",
    ("type_pause", "type_pause_type_check"): (
        "CHECK (((char_length(type) >= 1) AND (char_length(type) <= 100)))"
    ),
    ("type_rate", "type_rate_type_check"): (
        "CHECK (((char_length(type) >= 1) AND (char_length(type) <= 100)))"
    ),
    ("type_rate", "type_rate_max_starts_check"): "CHECK ((max_starts > 0))",
    ("type_rate", "type_rate_period_check"): "CHECK ((period > (0)::double precision))",
    ("job", "job_concurrency_key_length"): (
        "CHECK (((concurrency_key IS NULL) OR ((char_length(concurrency_key) >= 1)"
        " AND (char_length(concurrency_key) <= 200))))"
    ),
    ("type_limit", "type_limit_type_check"): (
        "CHECK (((char_length(type) >= 1) AND (char_length(type) <= 100)))"
    ),
    ("type_limit", "type_limit_global_concurrency_check"): "CHECK ((global_concurrency > 0))",
    ("type_limit", "type_limit_key_concurrency_check"): "CHECK ((key_concurrency > 0))",
    ("type_limit_stripe", "type_limit_stripe_stripe_check"): "CHECK ((stripe >= 0))",
    ("type_limit_stripe", "type_limit_stripe_slots_check"): "CHECK ((slots > 0))",
    ("type_limit", "type_limit_some"): (
        "CHECK (((global_concurrency IS NOT NULL) OR (key_concurrency IS NOT NULL)))"
    ),
}
TRIGGERS = {
    "job_tenant_type": (
        "CREATE TRIGGER job_tenant_type AFTER INSERT ON {s}.job FOR EACH ROW"
        " WHEN ((new.tenant IS NOT NULL)) EXECUTE FUNCTION {s}.job_tenant_type()"
    ),
    "job_ordered_state": (
        "CREATE TRIGGER job_ordered_state BEFORE UPDATE OF state ON {s}.job FOR EACH ROW"
        " WHEN (((new.ordered_key IS NOT NULL) AND (old.state IS DISTINCT FROM new.state)))"
        " EXECUTE FUNCTION {s}.job_ordered_state()"
    ),
    "job_ordered_release": (
        "CREATE TRIGGER job_ordered_release AFTER UPDATE OF state ON {s}.job FOR EACH ROW"
        " WHEN (((old.ordered_key IS NOT NULL) AND (old.waiting_on = 0)"
        " AND (old.state = ANY (ARRAY['pending'::{s}.job_state, 'running'::{s}.job_state]))"
        " AND (new.state = ANY (ARRAY['succeeded'::{s}.job_state, 'cancelled'::{s}.job_state]))))"
        " EXECUTE FUNCTION {s}.job_ordered_release()"
    ),
    "job_ordered_release_deleted": (
        "CREATE TRIGGER job_ordered_release_deleted AFTER DELETE ON {s}.job FOR EACH ROW"
        " WHEN (((old.ordered_key IS NOT NULL) AND (old.waiting_on = 0)"
        " AND (old.state = ANY (ARRAY['pending'::{s}.job_state, 'running'::{s}.job_state,"
        " 'failed'::{s}.job_state]))))"
        " EXECUTE FUNCTION {s}.job_ordered_release()"
    ),
    "job_notify_inserted": (
        "CREATE TRIGGER job_notify_inserted AFTER INSERT ON {s}.job REFERENCING NEW TABLE AS"
        " new_jobs FOR EACH STATEMENT EXECUTE FUNCTION {s}.job_notify_inserted()"
    ),
    "job_bundle_count_update": (
        "CREATE TRIGGER job_bundle_count_update AFTER UPDATE ON {s}.job REFERENCING OLD TABLE AS"
        " bundle_old_rows NEW TABLE AS bundle_new_rows FOR EACH STATEMENT"
        " EXECUTE FUNCTION {s}.job_bundle_count_updated()"
    ),
    "job_bundle_count_delete": (
        "CREATE TRIGGER job_bundle_count_delete AFTER DELETE ON {s}.job REFERENCING OLD TABLE AS"
        " bundle_old_rows FOR EACH STATEMENT EXECUTE FUNCTION {s}.job_bundle_count_deleted()"
    ),
    "job_release_dependents": (
        "CREATE TRIGGER job_release_dependents AFTER UPDATE OF state ON {s}.job FOR EACH ROW"
        " WHEN ((new.has_dependents AND ((old.state = ANY (" + _TERMINAL + "))"
        " IS DISTINCT FROM (new.state = ANY (" + _TERMINAL + ")))))"
        " EXECUTE FUNCTION {s}.job_release_dependents()"
    ),
    "job_dependency_deleted": (
        "CREATE TRIGGER job_dependency_deleted BEFORE DELETE ON {s}.job FOR EACH ROW"
        " WHEN (old.has_dependents) EXECUTE FUNCTION {s}.job_dependency_deleted()"
    ),
    "type_limit_restripe": (
        "CREATE TRIGGER type_limit_restripe AFTER INSERT OR UPDATE ON {s}.type_limit"
        " FOR EACH ROW EXECUTE FUNCTION {s}.type_limit_restripe()"
    ),
    "job_recount_waiting": (
        "CREATE TRIGGER job_recount_waiting BEFORE UPDATE OF state ON {s}.job FOR EACH ROW"
        " WHEN (((new.depends_on IS NOT NULL) AND (old.state IS DISTINCT FROM new.state)))"
        " EXECUTE FUNCTION {s}.job_recount_waiting()"
    ),
}
FUNCTIONS = {
    "end_attempt",
    "supervisor_lock_space",
    "server_epoch",
    "supervisor_locks_held",
    "release_jobs",
    "job_notify_inserted",
    "bundle_count_apply",
    "job_bundle_count_updated",
    "job_bundle_count_deleted",
    "claim_pick",
    "link_dependencies",
    "job_release_dependents",
    "job_recount_waiting",
    "job_dependency_deleted",
    "dependency_doom",
    "dependency_release",
    "dependency_notify",
    "claim_pick_rows",
    "claim_pick_rated",
    "rate_bucket",
    "rate_window",
    "claim_pick_keyed",
    "claim_pick_keyed_take",
    "claim_pick_limited",
    "limit_lock_space",
    "limit_stripe_key",
    "limit_lock_all",
    "limit_take_stripe",
    "type_limit_restripe",
    "new_id",
    "depth",
    "snooze_job",
    "unique_holders",
    "debounce_holder",
    "ordered_lock",
    "ordered_blocked",
    "ordered_link",
    "job_ordered_state",
    "job_ordered_release",
    "job_tenant_type",
    "claim_pick_fair",
}


# schema/0020: workflows
WORKFLOW_STEP_COLUMNS = {
    "job_id": ("uuid", False),
    "seq": ("integer", False),
    "name": ("text", False),
    "kind": ("text", False),
    "state": ("text", False),
    "result": ("jsonb", True),
    "error": ("text", True),
    "tries": ("integer", False),
    "wake_at": ("timestamp with time zone", True),
    "duration": ("double precision", True),
    "started_at": ("timestamp with time zone", False),
    "finished_at": ("timestamp with time zone", True),
}
WORKFLOW_SIGNAL_COLUMNS = {
    "job_id": ("uuid", False),
    "name": ("text", False),
    "payload": ("jsonb", True),
    "sent_at": ("timestamp with time zone", False),
}
INDEXES |= {
    "workflow_signal_pkey": (
        "CREATE UNIQUE INDEX workflow_signal_pkey ON {s}.workflow_signal USING btree (job_id, name)"
    ),
    "workflow_step_paused_idx": (
        "CREATE INDEX workflow_step_paused_idx ON {s}.workflow_step USING btree (job_id)"
        " WHERE (state = ANY (ARRAY['sleeping'::text, 'waiting'::text, 'retrying'::text]))"
    ),
    "workflow_step_pkey": (
        "CREATE UNIQUE INDEX workflow_step_pkey ON {s}.workflow_step USING btree (job_id, seq)"
    ),
}
_NAME_LENGTH = "CHECK (((length(name) >= 1) AND (length(name) <= 200)))"
INDEXES["worker_pkey"] = "CREATE UNIQUE INDEX worker_pkey ON {s}.worker USING btree (id)"
CHECKS |= {
    ("worker", "worker_id_check"): "CHECK (((char_length(id) >= 1) AND (char_length(id) <= 200)))",
    ("workflow_signal", "workflow_signal_name_check"): _NAME_LENGTH,
    ("workflow_step", "workflow_step_name_check"): _NAME_LENGTH,
    ("workflow_step", "workflow_step_kind_check"): (
        "CHECK ((kind = ANY (ARRAY['step'::text, 'sleep'::text, 'wait'::text, 'enqueue'::text,"
        " 'patch'::text])))"
    ),
    ("workflow_step", "workflow_step_seq_check"): "CHECK ((seq >= 0))",
    ("workflow_step", "workflow_step_state_check"): (
        "CHECK ((state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'retrying'::text,"
        " 'sleeping'::text, 'waiting'::text, 'timed_out'::text])))"
    ),
    ("workflow_step", "workflow_step_tries_check"): "CHECK ((tries >= 0))",
}
TRIGGERS |= {
    "job_workflow_child_ended": (
        "CREATE TRIGGER job_workflow_child_ended AFTER UPDATE OF state ON {s}.job FOR EACH ROW"
        " WHEN (((new.workflow_parent IS NOT NULL) AND (new.state <> old.state)"
        " AND (new.state = ANY (ARRAY['succeeded'::{s}.job_state, 'failed'::{s}.job_state,"
        " 'cancelled'::{s}.job_state])))) EXECUTE FUNCTION {s}.workflow_child_ended()"
    ),
}
FUNCTIONS |= {"workflow_signal", "workflow_child_ended", "workflow_suspend"}
TRIGGERS["job_floor_requeue"] = (
    "CREATE TRIGGER job_floor_requeue BEFORE UPDATE OF waiting_on, priority, start_at ON {s}.job"
    " FOR EACH ROW WHEN (((new.state = 'pending'::{s}.job_state) AND (new.waiting_on = 0)"
    " AND (new.tenant IS NULL) AND (new.start_at <= new.created_at)"
    " AND ((old.waiting_on > 0) OR (old.priority <> new.priority)"
    " OR (old.start_at > old.created_at))))"
    " EXECUTE FUNCTION {s}.job_floor_requeue()"
)
FUNCTIONS |= {
    "claim_floor_key",
    "job_floor_requeue",
    "claim_floor_first",
    "claim_floor_refresh",
    "claim_floor_clear",
    "claim_pick_floored",
    "job_alive_at",
    "job_notify_due",
    "job_notify_due_of",
    "job_unique_hold",
    "job_unique_release",
    "job_unique_take",
    "job_unique_truncated",
    "sql_contract_version",  # schema/0028: the SQL producer contract
    "enqueue_refuse",
    "enqueue_int",
    "enqueue_text",
    "enqueue_checked",
    "enqueue_many",
    "enqueue",
    "id_floor",  # schema/0029: job partitioned by id range (opt-in), retention drops partitions
    "id_time",
    "job_partitioned",
    "job_tables",
    "job_partitions",
    "job_partition_lock",
    "job_partition_name_indexes",
    "job_partition_ensure",
    "job_partition_unfinished",
    "job_partition_next",
    "job_past",
    "job_partition_clean",
    "job_partition_expire",
    "job_partition_convert",
    "written_here",  # schema/0030: the producer's writes to job rows go through definers
    "refuse_foreign_job",
    "job_fresh",
    "debounce_wait",
}
TRIGGERS["job_notify_due"] = (  # schema/0026: delayed jobs announced when written
    "CREATE TRIGGER job_notify_due AFTER UPDATE ON {s}.job REFERENCING NEW TABLE AS due_new_rows"
    " FOR EACH STATEMENT EXECUTE FUNCTION {s}.job_notify_due()"
)

INDEXES["job_unique_pkey"] = (
    "CREATE UNIQUE INDEX job_unique_pkey ON {s}.job_unique USING btree (unique_key)"
)
_UNFINISHED = "ARRAY['pending'::{s}.job_state, 'running'::{s}.job_state]"
TRIGGERS["job_unique_take"] = (  # schema/0027: the key's row follows the job's state
    "CREATE TRIGGER job_unique_take BEFORE INSERT ON {s}.job FOR EACH ROW"
    f" WHEN (((new.unique_key IS NOT NULL) AND (new.state = ANY ({_UNFINISHED}))))"
    " EXECUTE FUNCTION {s}.job_unique_take()"
)
TRIGGERS["job_unique_release"] = (
    "CREATE TRIGGER job_unique_release AFTER UPDATE OF state, unique_key ON {s}.job FOR EACH ROW"
    f" WHEN (((old.unique_key IS NOT NULL) AND (old.state = ANY ({_UNFINISHED}))"
    f" AND ((new.state <> ALL ({_UNFINISHED}))"
    " OR (new.unique_key IS DISTINCT FROM old.unique_key))))"
    " EXECUTE FUNCTION {s}.job_unique_release()"
)
TRIGGERS["job_unique_rehold"] = (
    "CREATE TRIGGER job_unique_rehold AFTER UPDATE OF state, unique_key ON {s}.job FOR EACH ROW"
    f" WHEN (((new.unique_key IS NOT NULL) AND (new.state = ANY ({_UNFINISHED}))"
    f" AND ((old.state <> ALL ({_UNFINISHED}))"
    " OR (old.unique_key IS DISTINCT FROM new.unique_key))))"
    " EXECUTE FUNCTION {s}.job_unique_hold()"
)
TRIGGERS["job_unique_deleted"] = (
    "CREATE TRIGGER job_unique_deleted AFTER DELETE ON {s}.job FOR EACH ROW"
    f" WHEN (((old.unique_key IS NOT NULL) AND (old.state = ANY ({_UNFINISHED}))))"
    " EXECUTE FUNCTION {s}.job_unique_release()"
)
TRIGGERS["job_unique_truncated"] = (
    "CREATE TRIGGER job_unique_truncated AFTER TRUNCATE ON {s}.job FOR EACH STATEMENT"
    " EXECUTE FUNCTION {s}.job_unique_truncated()"
)


def _all_versions() -> list[int]:
    return [m.version for m in schema.available()]


def _columns(conn: Conn, s: str, table: str) -> dict[str, tuple[str, bool]]:
    rows = conn.execute(
        "SELECT column_name, CASE data_type WHEN 'USER-DEFINED' THEN udt_name ELSE data_type END,"
        " is_nullable = 'YES' FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name = %s",
        (s, table),
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def assert_declared_schema(conn: Conn, s: str) -> None:
    tables = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (s,)
    ).fetchall()
    assert [r[0] for r in tables] == [
        "claim_floor",
        "fair_cursor",
        "job",
        "job_bundle",
        "job_dependency",
        "job_unique",
        "schedule",
        "schema_version",
        "supervisor",
        "tenant_weight",
        "type_limit",
        "type_limit_stripe",
        "type_pause",
        "type_rate",
        "worker",
        "workflow_signal",
        "workflow_step",
    ]
    assert _columns(conn, s, "job") == JOB_COLUMNS
    assert _columns(conn, s, "workflow_step") == WORKFLOW_STEP_COLUMNS
    assert _columns(conn, s, "workflow_signal") == WORKFLOW_SIGNAL_COLUMNS
    assert _columns(conn, s, "job_dependency") == DEPENDENCY_COLUMNS
    assert _columns(conn, s, "type_pause") == TYPE_PAUSE_COLUMNS
    assert _columns(conn, s, "type_rate") == TYPE_RATE_COLUMNS
    assert _columns(conn, s, "type_limit") == TYPE_LIMIT_COLUMNS
    assert _columns(conn, s, "type_limit_stripe") == TYPE_LIMIT_STRIPE_COLUMNS
    assert _columns(conn, s, "job_bundle") == BUNDLE_COLUMNS
    assert _columns(conn, s, "schedule") == SCHEDULE_COLUMNS
    assert _columns(conn, s, "schema_version") == VERSION_COLUMNS
    assert _columns(conn, s, "supervisor") == SUPERVISOR_COLUMNS
    assert _columns(conn, s, "worker") == WORKER_COLUMNS
    assert _columns(conn, s, "fair_cursor") == FAIR_CURSOR_COLUMNS
    assert _columns(conn, s, "tenant_weight") == TENANT_WEIGHT_COLUMNS
    assert _columns(conn, s, "claim_floor") == CLAIM_FLOOR_COLUMNS
    assert _columns(conn, s, "job_unique") == JOB_UNIQUE_COLUMNS

    labels = conn.execute(
        "SELECT e.enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid"
        " WHERE t.typname = 'job_state' AND t.typnamespace = %s::regnamespace"
        " ORDER BY e.enumsortorder",
        (s,),
    ).fetchall()
    assert [r[0] for r in labels] == ["pending", "running", "succeeded", "failed", "cancelled"]

    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s", (s,)
    ).fetchall()
    indexes: dict[str, str] = {r[0]: r[1] for r in rows}
    assert indexes == {name: d.format(s=s) for name, d in INDEXES.items()}
    # heartbeats must stay HOT updates: nothing may index worker_alive_at
    assert not [d for d in indexes.values() if "worker_alive_at" in d]

    checks = conn.execute(
        "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)"
        " FROM pg_constraint c WHERE c.connamespace = %s::regnamespace AND c.contype = 'c'",
        (s,),
    ).fetchall()
    # conrelid::regclass prints unqualified when the schema is on the search_path
    assert {(r[0].rpartition(".")[2], r[1]): r[2] for r in checks} == {
        key: d.format(s=s) for key, d in CHECKS.items()
    }
    fk = conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE connamespace = %s::regnamespace AND contype = 'f'",
        (s,),
    ).fetchall()
    assert sorted(r[0] for r in fk) == [
        f"FOREIGN KEY (bundle_id) REFERENCES {s}.job_bundle(id) ON DELETE CASCADE",
        f"FOREIGN KEY (depends_on) REFERENCES {s}.job(id) ON DELETE CASCADE",
        f"FOREIGN KEY (job_id) REFERENCES {s}.job(id) ON DELETE CASCADE",
        f"FOREIGN KEY (job_id) REFERENCES {s}.job(id) ON DELETE CASCADE",
        f"FOREIGN KEY (job_id) REFERENCES {s}.job(id) ON DELETE CASCADE",
        f"FOREIGN KEY (type) REFERENCES {s}.type_limit(type) ON DELETE CASCADE",
    ]

    triggers = conn.execute(
        "SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t"
        " JOIN pg_class c ON c.oid = t.tgrelid"
        " WHERE NOT t.tgisinternal AND c.relnamespace = %s::regnamespace",
        (s,),
    ).fetchall()
    assert dict(triggers) == {name: d.format(s=s) for name, d in TRIGGERS.items()}

    functions = conn.execute(
        "SELECT proname, proconfig FROM pg_proc WHERE pronamespace = %s::regnamespace", (s,)
    ).fetchall()
    assert {r[0] for r in functions} == FUNCTIONS
    for name, config in functions:
        # every function pins its search_path to the schema it was created in
        assert config is not None and any(c.startswith("search_path=") for c in config), name
        path = next(c for c in config if c.startswith("search_path="))
        assert s in path, name
        # and names pg_temp last: run as the owner (a definer function calls it or fires its
        # trigger), it must not find its caller's temporary tables first (schema/0029)
        assert path.endswith(", pg_catalog, pg_temp"), (name, path)

    versions = conn.execute(
        psycopg.sql.SQL("SELECT version, name FROM {}.schema_version").format(
            psycopg.sql.Identifier(s)
        )
    ).fetchall()
    assert [tuple(v) for v in versions] == [(m.version, m.name) for m in schema.available()]


def test_migrating_an_empty_database_gives_the_declared_schema(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert pgq.migrate(conn, schema="pgq") == _all_versions()
        assert_declared_schema(conn, "pgq")


def test_migrate_on_a_connection_with_another_row_factory(empty_dsn: str) -> None:
    """A caller's connection may read dicts (psycopg's dict_row); our own reads use tuples."""
    with psycopg.connect(empty_dsn, autocommit=True, row_factory=dict_row) as conn:
        assert pgq.migrate(conn, schema="pgq") == _all_versions()
        assert pgq.migrate(conn, schema="pgq") == []


def test_migrate_twice_is_a_no_op(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert pgq.migrate(conn, schema="pgq") == _all_versions()
        pgq.enqueue(conn, "t", {"kept": True}, schema="pgq")
        assert pgq.migrate(conn, schema="pgq") == []
        assert count_rows(conn) == 1
        assert_declared_schema(conn, "pgq")


def test_migrate_on_a_non_autocommit_connection_commits_with_the_caller(empty_dsn: str) -> None:
    """Like every writing call (test_caller_transactions has the other states)."""
    with (
        psycopg.connect(empty_dsn, autocommit=True) as other,
        psycopg.connect(empty_dsn) as conn,
    ):
        assert pgq.migrate(conn, schema="pgq") == _all_versions()
        assert schema.applied_versions(other, "pgq") == []
        conn.commit()
        assert schema.applied_versions(other, "pgq") == _all_versions()


def test_migrating_step_by_step_gives_the_same_schema(
    empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database made by older releases, upgraded now, ends as a fresh one does."""
    real = schema.available()
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for upto in range(1, len(real) + 1):
            step = tmp_path / str(upto)
            step.mkdir()
            for mig in real[:upto]:
                shutil.copy(mig.path, step / mig.path.name)
            monkeypatch.setattr(schema, "migrations_dir", lambda step=step: step)
            assert pgq.migrate(conn, schema="pgq") == [upto]
        monkeypatch.undo()
        assert pgq.migrate(conn, schema="pgq") == []
        assert_declared_schema(conn, "pgq")


def test_concurrent_migrations_are_safe(empty_dsn: str) -> None:
    start = threading.Barrier(4)

    def migrate(n: int) -> list[int]:
        with psycopg.connect(empty_dsn, autocommit=True) as own:
            start.wait(timeout=30)
            return pgq.migrate(own, schema="pgq")

    results = in_threads(4, migrate)
    assert sorted(results) == [[], [], [], _all_versions()]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert_declared_schema(conn, "pgq")


def test_a_failing_migration_leaves_the_database_as_it_was(
    empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for mig in schema.available():
        shutil.copy(mig.path, tmp_path / mig.path.name)
    broken = tmp_path / f"{len(schema.available()) + 1:04d}_broken.sql"
    broken.write_text("CREATE TABLE fine (x int);\nSELECT no_such_function();\n")
    monkeypatch.setattr(schema, "migrations_dir", lambda: tmp_path)

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        with pytest.raises(pgq.DatabaseError, match="no_such_function"):
            pgq.migrate(conn, schema="pgq")
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgq'").fetchone()
        assert row is not None and row[0] == 0


def test_migration_files_must_be_numbered_without_gaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0003_c.sql").write_text("SELECT 1;")
    monkeypatch.setattr(schema, "migrations_dir", lambda: tmp_path)
    with pytest.raises(pgq.PgqError, match=r"without gaps, found \[1, 3\]"):
        schema.available()


def test_the_queue_works_in_a_non_default_schema(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert pgq.migrate(conn, schema="other") == _all_versions()
        assert_declared_schema(conn, "other")
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgq'").fetchone()
        assert row is not None and row[0] == 0

        registry = pgq.Registry()

        @registry.handler("part", max_retry_count=1, retry=lambda n, rng: 0.0)
        def part(payload: dict[str, int], job: pgq.Job) -> int:
            if job.attempt == 1 and payload["i"] == 0:
                raise RuntimeError("first try fails")  # exercises end_attempt() in "other"
            return payload["i"]

        @registry.handler("after")
        def after(payload: dict[str, str]) -> str:
            return payload["bundle_id"]

        bundle = pgq.enqueue_bundle(
            conn,
            "batch",
            [pgq.NewJob("part", {"i": i}) for i in range(3)],
            on_complete="after",
            schema="other",
        )
        single = pgq.enqueue(conn, "part", {"i": 7}, schema="other", unique_key="u")
        assert pgq.enqueue(conn, "part", {"i": 8}, schema="other", unique_key="u") == single

        result = testing.drain(conn, registry, schema="other")
        assert (result.succeeded, result.retried) == (5, 1)  # 3 parts + single + callback
        assert pgq.get_job(conn, single, schema="other").result == 7
        done = pgq.get_bundle(conn, bundle.id, schema="other")
        assert done.is_complete and done.num_jobs_stopped == 3
        assert count_rows(conn, schema="other") == 5
        assert db.depth(conn, "other") == 0


def test_two_schemas_in_one_database_keep_their_queues_apart(conn: Conn) -> None:
    assert pgq.migrate(conn, schema="tenant_b") == _all_versions()
    assert pgq.migrate(conn, schema="pgq") == []
    pgq.enqueue(conn, "t", schema="pgq")
    pgq.enqueue_many(conn, [pgq.NewJob("t"), pgq.NewJob("t")], schema="tenant_b")
    assert (count_rows(conn), count_rows(conn, schema="tenant_b")) == (1, 2)
    assert pgq.queue_depth(conn, schema="tenant_b") == 2
    assert pgq.queue_depth(conn, schema="pgq") == 1


def test_the_library_on_an_unmigrated_database_says_to_migrate(empty_dsn: str) -> None:
    """As the CLI does, not psycopg's `relation "pgq.job" does not exist` (issue 36)."""
    told = r"schema is missing or older than this code: run `python -m pgq_supervisor migrate`"
    job = pgq.JobId(uuid.uuid4())
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        calls: list[Callable[[], object]] = [
            lambda: pgq.enqueue(conn, "t", {}),
            lambda: pgq.enqueue_many(conn, [pgq.NewJob("t")]),
            lambda: pgq.get_job(conn, job),
            lambda: pgq.cancel_job(conn, job),
            lambda: pgq.queue_stats(conn),
            lambda: pgq.wait(conn, job, timeout=0),
            lambda: pgq.enqueue(conn, "t", schema="elsewhere"),
        ]
        for call in calls:
            with pytest.raises(pgq.SchemaNotMigrated, match=told):
                call()
    # in the caller's transaction too, naming the table
    missing = r'relation "pgq\.job" does not exist'
    with psycopg.connect(empty_dsn) as conn, pytest.raises(pgq.SchemaNotMigrated, match=missing):
        pgq.enqueue(conn, "t", {})


def test_the_library_on_a_schema_older_than_the_code_says_to_migrate(
    empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = schema.available()[0]
    shutil.copy(first.path, tmp_path / first.path.name)
    monkeypatch.setattr(schema, "migrations_dir", lambda: tmp_path)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert pgq.migrate(conn) == [1]
        with pytest.raises(pgq.SchemaNotMigrated, match="python -m pgq_supervisor migrate"):
            pgq.enqueue(conn, "t", {}, tenant="a")


def test_a_bad_parameter_is_not_taken_for_a_missing_schema(conn: Conn) -> None:
    """`operator does not exist` is UndefinedFunction too: it does not say to migrate."""
    with pytest.raises(pgq.DatabaseError) as info:
        db.get_job(conn, "pgq", 12345)  # type: ignore[arg-type]
    assert not isinstance(info.value, pgq.SchemaNotMigrated)
