"""A real Django project (tests/django/project) on a database of its own: `manage.py migrate`
run as a subprocess creates Django's tables and the queue's schema, then Django is set up in
this process on the same database. Django 5.2 with the django-tasks backport in the main
venv; Django 6 (django.tasks) in .venv-django (tests/integration/test_django6.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

PROJECT = Path(__file__).resolve().parent / "project"


def manage(dsn: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGQ_DJANGO_DSN": dsn}
    env.pop("PGQ_DSN", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=PROJECT,
    )  # fmt: skip


@pytest.fixture(scope="module")
def django_dsn(server_dsn: str) -> Iterator[str]:
    """A fresh database (no schema at all) that `manage.py migrate` set up, and Django set up
    on it in this process."""
    name = f"pgq_dj_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server_dsn, dbname=name)
    done = manage(dsn, "migrate", "--no-input")
    assert done.returncode == 0, done.stderr
    # Django is set up once per process: later modules' subprocesses need not inherit it
    saved = {k: os.environ.get(k) for k in ("PGQ_DJANGO_DSN", "DJANGO_SETTINGS_MODULE")}
    os.environ["PGQ_DJANGO_DSN"] = dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = "djproject.settings"
    sys.path.insert(0, str(PROJECT))
    import django

    django.setup()
    yield dsn
    from django.db import connections

    connections.close_all()
    sys.path.remove(str(PROJECT))
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
