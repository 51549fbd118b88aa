"""One error hierarchy for the whole package, and the CLI's exit codes."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Every exit code a pgq_supervisor process uses, the CLI's and a child's."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    APP_LOAD = 3
    CHILD_BOOT_FAILURE = 78  # EX_CONFIG: a child never got as far as claiming
    INTERRUPTED = 130  # 128 + SIGINT, as shells report an interrupted command


def install_hint(extra: str) -> str:
    """How to install an optional extra, for the messages that need one. No package index
    serves pgq-supervisor (an install by its name cannot work): from a checkout, or from a
    wheel built from one (the README's Install)."""
    return (
        f"pip install -e '.[{extra}]' in a checkout of pgq_supervisor,"
        f" or pip install '<its wheel>[{extra}]'"
    )


class PgqError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(PgqError):
    """A setting or argument is invalid. The message names the setting."""


class AppLoadError(PgqError):
    """The `--app` target could not be imported or is not a Registry."""


class InvalidInput(PgqError, ValueError):
    """Input rejected before anything was written (bad type name, payload, option)."""


class JobNotFound(PgqError, LookupError):
    """No job (or bundle) has that id."""


class InvalidTransition(PgqError):
    """The job is not in a state that allows the requested change."""


class LeaseLost(PgqError):
    """The worker no longer holds the job: it was rescued, reset or already finished.

    Nothing was written. The job belongs to whoever claimed it since.
    """


class DatabaseError(PgqError):
    """A database operation failed (connection lost, server error). Wraps the psycopg error."""


class DatabaseUnavailable(DatabaseError):
    """The database could not be reached; the message tells host, auth and database apart."""


class SchemaNotMigrated(DatabaseError):
    """The queue's schema is missing from the database, or older than this code: the message
    says to run `python -m pgq_supervisor migrate` (or `pgq.migrate(conn)`)."""


class MigrationLocked(PgqError):
    """`migrate` waited its lock timeout for the migration lock another session holds: the
    message names the holder (pid, user, application_name). Nothing was applied."""


class ConnectionShortage(PgqError):
    """The database has too few free connections for the supervisor now (its limits could
    hold it: a ConfigError says when they could not)."""


class PermanentError(PgqError):
    """Raised by a handler: fail this job now, without retrying it."""

    def __init__(self, message: str = "permanent error", *, data: object = None) -> None:
        super().__init__(message)
        self.data = data


class Snooze(PgqError):
    """Raised (or returned) by a handler: put this job back, to run again in `seconds`.

    Not a failure: no attempt is counted and no retry is used. Each snooze is kept in the
    job's attempt history; past its type's `max_snoozes` the job fails instead.
    """

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"Snooze takes a number of seconds, got {seconds!r}")
        if not 0 <= seconds <= 100 * 365 * 86_400.0:  # nan compares false: refused too
            raise ValueError(f"Snooze: seconds must be from 0 to 100 years, got {seconds!r}")
        super().__init__(f"snoozed for {seconds:g} s")
        self.seconds = float(seconds)


class NonDeterministic(PermanentError):
    """A workflow's replay reached a step other than the one its history has at that place:
    its code changed under a running job (version it with `ctx.patched`). Fails the job."""


class StepFailed(PermanentError):
    """A workflow step failed for good (its retries spent, or a PermanentError). Raised where
    the workflow called the step, and again at that place on every replay; uncaught, it fails
    the job at once."""

    def __init__(self, step: str, error: str) -> None:
        super().__init__(f"step {step!r} failed: {error}")
        self.step = step
        self.error = error


class ChildFailed(PermanentError):
    """The job `ctx.wait` waited for ended failed or cancelled."""

    def __init__(self, job_id: object, state: str, error: str | None) -> None:
        super().__init__(f"child job {job_id} ended {state}: {error or 'no error message'}")
        self.job_id = job_id
        self.state = state
        self.error = error


class WaitTimeout(PgqError):
    """`ctx.wait_for` (or `ctx.wait`) passed its timeout without the signal. The workflow may
    catch it; on a replay it is raised again at the same place."""

    def __init__(self, name: str) -> None:
        super().__init__(f"wait {name!r} timed out")
        self.name = name


class Suspend(Snooze):
    """A workflow sleeps or waits: its job goes back to pending for `seconds` (or until the
    signal `wait`), no attempt counted and no max_snoozes. Raised by the context, never by
    user code."""

    def __init__(self, seconds: float, wait: str | None, why: str) -> None:
        super().__init__(seconds)
        self.wait = wait
        self.why = why  # as the log says it: "sleeping 1 s (sleep 'nap')"

    @classmethod
    def sleeping(cls, name: str, seconds: float) -> Suspend:
        return cls(seconds, None, f"sleeping {_seconds(seconds)} s (sleep {name!r})")

    @classmethod
    def waiting(cls, name: str, seconds: float, timeout: bool) -> Suspend:
        """`name` is a signal's, or `job:<id>` for ctx.wait's child."""
        what = f"child job {name[4:]}" if name.startswith("job:") else f"signal {name!r}"
        up_to = f" (up to {_seconds(seconds)} s)" if timeout else ""
        return cls(seconds, name, f"waiting for {what}{up_to}")

    @classmethod
    def retrying(cls, name: str, seconds: float, tries: int) -> Suspend:
        return cls(
            seconds, None, f"retrying step {name!r} in {_seconds(seconds)} s (try {tries} failed)"
        )


def _seconds(value: float) -> str:
    """Seconds as a log line says them: 2, 0.05, 1.73, 3600 (not 1.99998 or 3.6e+03)."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"
