"""The Django integration end to end: migrate, a view enqueuing in its atomic(), tasks run by
`manage.py pgq_worker` (a subprocess), results through get_result() and refresh()."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest

from pgq_supervisor.contrib.django.compat import TaskResult
from tests.django.conftest import PROJECT, manage
from tests.support.processes import APP, ROOT
from tests.support.waiting import wait_for

T = TypeVar("T")
APPS = ROOT / "tests" / "acceptance" / "apps"

# the worker's children: fast heartbeats, and polls, so a test waits on its task, not on timers
FAST = ["--procs", "1", "--poll-interval", "0.2", "--heartbeat-interval", "0.5"]


@pytest.fixture(scope="module")
def worker(django_dsn: str) -> Iterator[Path]:
    """`manage.py pgq_worker` serving both queues and the handlers of an app of our own
    (`--app`); yields its log's path, stopped by SIGTERM."""
    log = Path(tempfile.mkstemp(prefix="pgq-dj-", suffix=".log")[1])
    env = {**os.environ, "PGQ_DJANGO_DSN": django_dsn, "PYTHONPATH": str(APPS)}
    env.pop("PGQ_DSN", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "pgq_worker", *FAST, "--app", APP],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=PROJECT, start_new_session=True,
        )  # fmt: skip
        try:
            yield log
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
    assert code == 0, log.read_text()


def finished(result: TaskResult[T], log: Path) -> TaskResult[T]:
    """`result` once refresh() finds it finished."""

    def check() -> TaskResult[T] | None:
        result.refresh()  # TaskResult.refresh() reads the job again
        return result if result.is_finished else None

    try:
        return wait_for(f"task {result.id} to finish", check, timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nworker log:\n{log.read_text()}") from None


def test_migrate_created_the_queue_schema(django_dsn: str) -> None:
    with psycopg.connect(django_dsn) as conn:
        versions = conn.execute("SELECT count(*) FROM pgq.schema_version").fetchone()
        orders = conn.execute("SELECT to_regclass('shop_order')").fetchone()
    assert versions is not None and versions[0] > 0
    assert orders == ("shop_order",)
    from django.db.migrations.recorder import MigrationRecorder

    applied = MigrationRecorder.Migration.objects.filter(app="pgq_supervisor")
    assert [m.name for m in applied] == ["0001_queue_schema"]
    # again: nothing to do (every migrate brings the queue's schema up to date, see apps.py)
    again = manage(django_dsn, "migrate", "--no-input")
    assert again.returncode == 0, again.stderr


def test_a_bad_worker_flag_is_one_line_and_exit_2(django_dsn: str) -> None:
    done = manage(django_dsn, "pgq_worker", "--procs", "none")
    assert done.returncode == 2
    assert done.stderr.startswith("error: invalid setting procs"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_view_enqueues_in_its_transaction_and_the_worker_runs_the_task(
    django_dsn: str, worker: Path
) -> None:
    from django.test import Client
    from shop.tasks import add, ship

    response = Client().post("/order/?name=teapot")
    assert response.status_code == 200
    ids = json.loads(response.content)
    result = ship.get_result(ids["task"])
    assert result.args == [ids["order"]]
    assert finished(result, worker).status == "SUCCESSFUL"
    assert result.return_value == "teapot"
    assert ship.get_result(ids["task"]).return_value == "teapot"
    assert finished(add.get_result(ids["first"]), worker).return_value == 2


def test_rolling_back_the_view_removes_its_jobs_even_the_first_statement(
    django_dsn: str,
) -> None:
    from django.test import Client
    from shop.models import Order
    from shop.tasks import add, ship

    from pgq_supervisor.contrib.django.compat import TaskResultDoesNotExist

    response = Client().post("/order/?name=gone&fail=1")
    assert response.status_code == 409
    ids = json.loads(response.content)
    assert not Order.objects.filter(id=ids["order"]).exists()
    with pytest.raises(TaskResultDoesNotExist):
        ship.get_result(ids["task"])
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(ids["first"])


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_our_own_api_takes_djangos_connection_in_its_atomic(django_dsn: str, commit: bool) -> None:
    """pgq.enqueue(django.db.connection, ...) with no unwrapping: inside atomic(), even as its
    first statement, the job commits or rolls back with the block."""
    from django.db import connection, transaction

    import pgq_supervisor as pgq

    class Undo(Exception):
        pass

    with pytest.raises(Undo) if not commit else contextlib.nullcontext(), transaction.atomic():
        job_id = pgq.enqueue(connection, "noop", {"via": "django"})
        if not commit:
            raise Undo
    with psycopg.connect(django_dsn, autocommit=True) as check:
        row = check.execute("SELECT count(*) FROM pgq.job WHERE id = %s", (job_id,)).fetchone()
    assert row == (1 if commit else 0,)


def test_a_task_over_the_payload_cap_is_refused_in_the_atomic_block(
    django_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend's enqueue goes through the payload cap: InvalidInput before any statement,
    and the view's transaction goes on (its own row commits, no job)."""
    from django.db import connection, transaction
    from shop.models import Order
    from shop.tasks import explode

    import pgq_supervisor as pgq

    monkeypatch.setenv("PGQ_MAX_PAYLOAD_BYTES", "200")
    with transaction.atomic():
        order = Order.objects.create(name="capped")
        with pytest.raises(pgq.InvalidInput, match=r"payload is \d+ bytes of JSON, over the 200"):
            explode.enqueue("x" * 300)
        with connection.cursor() as cur:
            cur.execute("SELECT 1")  # not aborted
    assert Order.objects.filter(pk=order.pk).exists()
    with psycopg.connect(django_dsn, autocommit=True) as check:
        row = check.execute("SELECT count(*) FROM pgq.job WHERE payload::text LIKE '%xxxx%'")
        assert row.fetchone() == (0,)


def test_a_failing_task_reports_its_error(django_dsn: str, worker: Path) -> None:
    from shop.tasks import explode

    result = explode.enqueue("on purpose")
    assert result.status == "READY"
    finished(result, worker)
    assert result.status == "FAILED"
    [error] = result.errors
    assert error.exception_class_path == "shop.tasks.Boom"
    assert "on purpose" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value


def test_context_async_priority_and_run_after(django_dsn: str, worker: Path) -> None:
    from django.utils import timezone
    from shop.tasks import attempt, send

    later = send.using(run_after=timezone.now() + timedelta(seconds=1)).enqueue("ann")
    assert send.priority == 10
    with psycopg.connect(django_dsn) as conn:
        row = conn.execute(
            "SELECT type, priority, start_at > created_at FROM pgq.job WHERE id = %s",
            (later.id,),
        ).fetchone()
    assert row == ("django:emails", 10, True)
    context = attempt.enqueue()
    assert finished(context, worker).return_value == 1
    sent: object = finished(later, worker).return_value  # typed as the coroutine it awaits
    assert sent == {"sent": "ann"}


def test_each_task_starts_on_a_fresh_django_connection(django_dsn: str, worker: Path) -> None:
    """close_old_connections() around each task: with CONN_MAX_AGE 0 (Django's default) a
    task's connection is closed after it, as a request's is, so the next opens its own."""
    from shop.tasks import backend_pid

    first = finished(backend_pid.enqueue(), worker).return_value
    second = finished(backend_pid.enqueue(), worker).return_value
    assert isinstance(first, int) and isinstance(second, int)
    assert first != second


def test_the_worker_runs_the_apps_own_handlers_too(django_dsn: str, worker: Path) -> None:
    import pgq_supervisor as pgq
    from pgq_supervisor.contrib.django.backend import psycopg_connection
    from pgq_supervisor.jobs import JobState

    job_id = pgq.enqueue(psycopg_connection(), "noop", {})  # Django's connection, autocommit

    def done() -> bool:
        return pgq.get_job(psycopg_connection(), job_id).state is JobState.SUCCEEDED

    wait_for(f"job {job_id} to succeed", done, timeout=60)


@pytest.mark.parametrize(
    ("attempt", "path"),
    [
        ({"kind": "error", "error": "Boom: x", "traceback": "Tb\nshop.tasks.Boom: x\n"},
         "shop.tasks.Boom"),
        ({"kind": "error", "error": "KeyError: 'a'", "traceback": "Tb\nKeyError: 'a'\n"},
         "builtins.KeyError"),
        ({"kind": "permanent", "error": "PermanentError: no"},
         "pgq_supervisor.errors.PermanentError"),
        ({"kind": "timeout", "error": "timed out after 1 s"}, "builtins.TimeoutError"),
        ({"kind": "cancelled", "error": "cancelled"}, "pgq_supervisor.errors.PgqError"),
        ({"kind": "worker_death", "error": "exit code -9"}, "pgq_supervisor.errors.PgqError"),
    ],
)  # fmt: skip
def test_each_failed_attempt_is_an_error_whose_class_imports(
    django_dsn: str, attempt: dict[str, str], path: str
) -> None:
    from pgq_supervisor.contrib.django.backend import task_error

    error = task_error(dict(attempt))
    assert error is not None
    assert error.exception_class_path == path
    assert issubclass(error.exception_class, BaseException)


def test_aenqueue_and_arefresh(django_dsn: str, worker: Path) -> None:
    """The async API: Django's aenqueue/arefresh run ours in its sync thread."""
    import asyncio
    import time

    from shop.tasks import add

    async def run() -> object:
        result = await add.aenqueue(20, 22)
        deadline = time.monotonic() + 60
        while not result.is_finished and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # polling the result, with a deadline
            await result.arefresh()
        return result.return_value

    assert asyncio.run(run()) == 42
