"""tests/django again, on Django 6's own django.tasks: in .venv-django (Python 3.12+, made by
scripts/_venv_django.sh, which scripts/test sources), as a second pytest run whose result is
this test's. This suite's own run of tests/django covers Django 5.2 with the backport."""

from __future__ import annotations

import os
import subprocess

from tests.support.processes import ROOT

PYTHON = ROOT / ".venv-django" / "bin" / "python"


def test_the_django_tests_pass_on_django_6(server_dsn: str) -> None:
    assert PYTHON.exists(), f"no {PYTHON}: run scripts/test (it makes .venv-django)"
    version = subprocess.run(
        [str(PYTHON), "-c", "import django; print(django.VERSION[0])"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert int(version) >= 6
    env = {**os.environ, "PGQ_TEST_DSN": server_dsn}  # the server this suite runs on
    done = subprocess.run(
        [str(PYTHON), "-m", "pytest", "tests/django", "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    assert " passed" in done.stdout and "failed" not in done.stdout
