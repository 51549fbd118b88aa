"""The Django section of docs/frameworks.md, followed on a fresh project (`django-admin
startproject`): its settings, its task and its commands as written, then a task enqueued and
its result read through TaskResult.refresh()."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.processes import ROOT

SHELL = """
import time
from shop.tasks import add
result = add.enqueue(2, 3)
deadline = time.monotonic() + 60
while not result.is_finished and time.monotonic() < deadline:
    time.sleep(0.1)  # polling the result, with a deadline
    result.refresh()
print(result.status, result.return_value)
"""


def readme_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "frameworks.md").read_text()
    section = text.split("\n## Django\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def test_the_readmes_django_section_runs_on_a_fresh_project(
    server_dsn: str, tmp_path: Path
) -> None:
    blocks = readme_blocks()
    assert [lang for lang, _ in blocks] == ["python", "python", "sh"]
    [(_, settings_block), (_, task_block), (_, commands)] = blocks
    name = f"pgq_djr_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        conninfo = conninfo_to_dict(make_conninfo(server_dsn, dbname=name))
        bin_dir = Path(sys.executable).parent
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        env.pop("PGQ_DSN", None)
        env.pop("DJANGO_SETTINGS_MODULE", None)

        def run(*args: str) -> str:
            done = subprocess.run(
                args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
            )
            assert done.returncode == 0, f"{args}: {done.stderr}"
            return done.stdout

        run("django-admin", "startproject", "mysite", ".")
        run(sys.executable, "manage.py", "startapp", "shop")
        if importlib.util.find_spec("django.tasks") is None:  # Django 5.2, as the README says
            task_block = task_block.replace("from django.tasks", "from django_tasks")
        (tmp_path / "shop" / "tasks.py").write_text(task_block)
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": conninfo.get("user", ""),
            "PASSWORD": conninfo.get("password", ""),
            "HOST": conninfo.get("host", ""),
            "PORT": conninfo.get("port", ""),
        }
        settings = tmp_path / "mysite" / "settings.py"
        settings.write_text(
            settings.read_text()
            + f"\nDATABASES = {{'default': {database!r}}}\nINSTALLED_APPS += ['shop']\n"
            + settings_block
        )
        migrate, worker = [
            line.split("#")[0].split() for line in commands.splitlines() if line.strip()
        ]
        assert migrate[:2] == ["python", "manage.py"] == worker[:2]
        run(sys.executable, *migrate[1:])
        log = (tmp_path / "worker.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, *worker[1:]], cwd=tmp_path, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            out = run(sys.executable, "manage.py", "shell", "-c", SHELL)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            log.close()
        worker_log = (tmp_path / "worker.log").read_text()
        assert out.splitlines()[-1].split() == ["SUCCESSFUL", "5"], worker_log
        assert code == 0, worker_log
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
