# Sourced by scripts/test: create or reuse .venv-django, Django 6 under Python 3.12+ (Django 6
# needs it; the main .venv is 3.11 with Django 5.2 and the django-tasks backport), for
# tests/integration/test_django6.py. Created while the network is there (the first run of
# .ci/run) and reused afterwards, like .venv: the stamp file says it is installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DJ_PY="${PYTHON_DJANGO:-}"
if [ -z "$DJ_PY" ]; then
  for cand in python3.13 python3.12 "$HOME"/.pyenv/versions/3.13*/bin/python \
    "$HOME"/.pyenv/versions/3.12*/bin/python; do
    # stderr silenced: a pyenv shim exists for versions not selected and fails noisily
    if command -v "$cand" >/dev/null 2>&1 \
      && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      DJ_PY="$cand"; break
    fi
  done
fi
DJ_STAMP="$ROOT/.venv-django/.pgq-installed"
if [ -z "$DJ_PY" ]; then
  echo "== no Python 3.12+ found: the Django 6 tests will fail (set PYTHON_DJANGO)" >&2
elif [ ! -f "$DJ_STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$DJ_STAMP" ]; then
  echo "== creating .venv-django (Django 6, $("$DJ_PY" --version))"
  [ -x "$ROOT/.venv-django/bin/python" ] || "$DJ_PY" -m venv "$ROOT/.venv-django"
  "$ROOT/.venv-django/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  "$ROOT/.venv-django/bin/python" -m pip install -q -e "$ROOT[django,dev]" "django>=6" 2>&1 \
    | grep -v '^WARNING: Location' || true
  # a failed install fails tests/acceptance/test_django6.py, not the whole suite
  if "$ROOT/.venv-django/bin/python" -W ignore -c 'import django.tasks, pgq_supervisor, pytest'
  then touch "$DJ_STAMP"
  else echo "error: installing the project into .venv-django failed" >&2
  fi
fi
