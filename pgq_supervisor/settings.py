"""Settings: command-line flags, then PGQ_* environment variables, then a .env file.

Validated once, at construction; every error names the setting.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal, Self, cast

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from pgq_supervisor.errors import ConfigError, InvalidInput
from pgq_supervisor.jobs import (
    DEFAULT_HEARTBEAT_INTERVAL,
    MAX_DURATION,
    MISSED_BEATS,
    check_duration,
    stale_after,
)
from pgq_supervisor.jsontext import DEFAULT_MAX_PAYLOAD_BYTES, MAX_PAYLOAD_CAP
from pgq_supervisor.redaction import hide_password

# what a retention setting takes to keep that kind of job forever
KEEP_FOREVER = ("forever", "none")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '2h', '7d', '1w' -> seconds. InvalidInput (a ValueError) if not."""
    t = text.strip().lower()
    number, unit = (t[:-1], _DURATION_UNITS[t[-1]]) if t[-1:] in _DURATION_UNITS else (t, 1)
    try:
        value = float(number) * unit
    except ValueError:
        raise InvalidInput(f"invalid duration {text!r}: use e.g. 30s, 15m, 2h, 7d") from None
    try:
        return check_duration(value)
    except ValueError as exc:
        raise InvalidInput(f"invalid duration {text!r}: {exc}") from None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PGQ_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        allow_inf_nan=False,  # an infinite interval or timeout is a typo, not a setting
    )
    # the settings every CLI command takes (the others are `run`'s)
    EVERY_COMMAND: ClassVar[tuple[str, ...]] = (
        "dsn", "db_schema", "log_level", "log_format", "max_payload_bytes", "migrate_lock_timeout",
    )  # fmt: skip

    dsn: str | None = Field(
        None, description="PostgreSQL connection string; unset = embedded server (.pgq/pgdata)"
    )
    listen_dsn: str | None = Field(
        None, description="DSN of the supervisor's LISTEN connection only; unset = dsn"
    )
    prepare_threshold: int | None = Field(
        5, ge=0, description="psycopg's prepare_threshold; none = no server-side prepares"
    )
    app: str | None = Field(
        None, description="module:attribute of the handlers' Registry; no default: run needs one"
    )
    procs: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        le=512,
        description="child processes; default the CPU count (a container's is the node's)",
    )
    types: list[str] | None = Field(
        None, description="serve only these job types (a,b); unset = every type of the app"
    )
    # 1 s: a dead pod's jobs are taken back once its lock is free and their heartbeat is 1.5
    # intervals old (rescuer.py); a beat is one UPDATE of the child's own row (schema/0025)
    heartbeat_interval: float = Field(
        DEFAULT_HEARTBEAT_INTERVAL,
        gt=0,
        le=MAX_DURATION,
        description="seconds between a child's heartbeats",
    )
    dead_after: float = Field(
        30.0,
        gt=0,
        le=MAX_DURATION,
        description="heartbeat age (s) after which a job is rescued; >= 3 x heartbeat_interval",
    )
    poll_interval: float = Field(
        2.0,
        gt=0,
        le=MAX_DURATION,
        description="seconds between jittered fallback polls (queue metrics, due jobs too)",
    )
    rescue_interval: float | None = Field(
        None,
        gt=0,
        le=MAX_DURATION,
        description="seconds between rescues of stale heartbeats; unset = min(10, dead_after/4)",
    )
    shutdown_timeout: float = Field(
        30.0, ge=0, le=MAX_DURATION, description="seconds running jobs may finish after SIGTERM"
    )
    connect_timeout: float = Field(
        15.0, gt=0, le=MAX_DURATION, description="start-up wait for the database"
    )
    migrate_lock_timeout: float = Field(
        60.0,
        ge=0,
        le=MAX_DURATION,
        description="seconds `migrate` waits for the migration lock another session holds;"
        " 0 = do not wait",
    )
    max_jobs_per_child: int | None = Field(
        None, ge=1, description="recycle a child after this many jobs; unset = never"
    )
    max_memory_per_child: int | None = Field(
        None, ge=1, description="recycle a child past this RSS (MiB); unset = never"
    )
    worker_synchronous_commit: bool = Field(
        False, description="sync commit for claims/heartbeats/completions (on behind PgBouncer)"
    )
    # 200, not 100: measured on 2 cores, a 60,000-job no-op drain took ~20% less CPU per job in
    # the children and ~15% in their backends (fewer claims, fewer of them colliding); a claim
    # still holds about 50 ms of work at most (worker/sync.py BATCH_BUDGET), so slower jobs
    # claim fewer
    claim_batch: int = Field(200, ge=1, le=200, description="most jobs one claim may take")
    concurrency: int = Field(
        1,
        ge=1,
        le=1000,
        description="most jobs one child runs at once; unset, an all-async child adapts (to 1000)",
    )
    connection_budget: Literal["shrink", "refuse", "off"] = Field(
        "shrink",
        description="when the connections procs need do not fit at start: shrink (cap the"
        " children's pools, then run the children that fit, with a warning), refuse (exit),"
        " off (no check: behind PgBouncer)",
    )
    connection_headroom: int = Field(
        5,
        ge=0,
        le=100_000,
        description="connection slots the supervisor leaves free for the application at start",
    )
    child_pool_size: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="most connections each pool of a child opens for handlers that take conn"
        " (concurrency > 1 or async); unset = as many as such jobs may be in flight",
    )
    release_unstarted_after: float = Field(
        0.25,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="seconds a child's claimed, unstarted jobs may wait behind a running one",
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="serve /metrics, /healthz, /readyz here; unset = off"
    )
    metrics_host: str = Field("0.0.0.0", description="address of the metrics server")
    # Bounded by default so that no table grows forever: a day of succeeded jobs answers
    # "did it run?", a week of failed ones covers a weekend before someone looks.
    retain_succeeded: float | None = Field(
        86400.0,
        gt=0,
        le=MAX_DURATION,
        description="keep succeeded jobs this long (seconds, or 1d, 12h, ...); forever = keep all",
    )
    retain_failed: float | None = Field(
        7 * 86400.0,
        gt=0,
        le=MAX_DURATION,
        description="keep failed and cancelled jobs this long (7d, ...); forever = keep all",
    )
    # A day: few partitions (each statement over job plans every one of them), and a drop a
    # day. An hour for a high rate or short windows: a partition leaves sooner after its jobs.
    partition_interval: float = Field(
        86400.0,
        ge=60,
        le=MAX_DURATION,
        description="enqueue times one partition of the job table spans (1d, 1h, ...);"
        " retention drops whole partitions",
    )
    summary_interval: float = Field(
        10.0,
        gt=0,
        le=MAX_DURATION,
        description="seconds between INFO summaries of the jobs that ended",
    )
    max_payload_bytes: int = Field(
        DEFAULT_MAX_PAYLOAD_BYTES,
        ge=1,
        le=MAX_PAYLOAD_CAP,
        description="most bytes of JSON text in a payload or a handler's result (1 MiB)",
    )
    dashboard_user: str | None = Field(
        None, description="the dashboard command's HTTP Basic user (with dashboard_password)"
    )
    dashboard_password: SecretStr | None = Field(
        None, description="the dashboard command's HTTP Basic password (env or .env only)"
    )
    dashboard_secret: SecretStr | None = Field(
        None,
        min_length=16,
        description="signs the dashboard's CSRF tokens, the same on every replica (env or .env"
        " only; unset: random per process)",
    )
    log_format: Literal["text", "json"] = Field("text", description="text | json")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="debug | info | warning | error"
    )
    # "schema" would shadow BaseModel.schema; the flag and env names stay --schema / PGQ_SCHEMA
    db_schema: str = Field(
        "pgq",
        validation_alias=AliasChoices("schema", "PGQ_SCHEMA"),
        min_length=1,
        max_length=63,
        description="schema holding the queue's tables",
    )

    @property
    def rescue_every(self) -> float:
        """Seconds between rescue rounds. Unset, it follows dead_after: a job whose worker
        died is back within dead_after and a quarter more (plus jitter), and the default
        dead_after of 30 s gives 7.5 s; 10 s at most, since one round is a cheap index scan
        (three rounds in a row over 20 ms and 0.5 % of this put the next further off: the
        timer's max_share)."""
        if self.rescue_interval is not None:
            return self.rescue_interval
        return min(10.0, self.dead_after / 4)

    @field_validator("types", mode="before")
    @classmethod
    def _split_types(cls, value: object) -> object:
        if isinstance(value, str):
            return [t.strip() for t in value.split(",") if t.strip()]
        return value

    @field_validator("prepare_threshold", mode="before")
    @classmethod
    def _none(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("none", "null", ""):
            return None
        return value

    @field_validator("dsn", "listen_dsn")
    @classmethod
    def _parse_dsn(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                conninfo_to_dict(value)
            except psycopg.ProgrammingError as exc:
                # libpq quotes the token it rejects, which may be (part of) the password
                raise ValueError(hide_password(str(exc).strip().splitlines()[0], value)) from None
        return value

    @field_validator("retain_succeeded", "retain_failed", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in KEEP_FOREVER:
            return None
        return parse_duration(value) if isinstance(value, str) else value

    @field_validator("partition_interval", mode="before")
    @classmethod
    def _interval(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, str) else value

    @field_validator("log_level", "log_format", "connection_budget", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.dead_after < stale_after(self.heartbeat_interval):
            raise ValueError(
                f"dead_after ({self.dead_after:g} s) must be at least {MISSED_BEATS} x"
                " heartbeat_interval"
                f" ({self.heartbeat_interval:g} s)"
            )
        return self


def load_settings(**flags: object) -> Settings:
    """Settings from flags (None = not given), then PGQ_* env, then .env. ConfigError if bad."""
    given = {k: v for k, v in flags.items() if v is not None}
    try:
        if "db_schema" in given:
            given["schema"] = given.pop("db_schema")
        return Settings(**cast(dict[str, Any], given))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        msg = err["msg"].removeprefix("Value error, ")
        if loc in ("settings", ""):
            raise ConfigError(msg) from exc
        name = {"db_schema": "schema", "PGQ_SCHEMA": "schema"}.get(loc, loc)
        raise ConfigError(f"invalid setting {name}: {msg}") from exc
