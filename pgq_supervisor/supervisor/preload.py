"""What the fork server imports once, before it forks any child (see children.spawn_process).

    pgq-supervisor ── LISTEN and control connections, timers, children's pipes
    └── pgq-forkserver: a fresh interpreter (exec'd, so it inherits no connection, thread or
        │               lock of the supervisor) that imports this module, then only forks
        ├── pgq-worker[0]   forked: the interpreter, psycopg, pydantic, pgq_supervisor and
        ├── pgq-worker[1]   the app's modules are the fork server's pages, shared copy-on-write
        └── ...

The fork server never connects to the database and starts no thread, so a child begins with
neither. Importing the app here is best effort: if it fails, the child imports it again at boot
and reports the error as before (BootFailed, exit code CHILD_BOOT_FAILURE). `gc.freeze()` at
the end moves every object imported so far out of the collector's reach, so a child's garbage
collections do not write to (and so copy) the shared pages.

The fork server ignores SIGTERM, as multiprocessing's resource tracker does: a SIGTERM to the
whole group (systemd's KillMode=control-group, `timeout(1)`, `kill -- -PGID`) would otherwise
kill it while its children finish their jobs, and the exit codes it relays to the supervisor
would be lost (every child would read as `exit code 255`, a worker death). It exits when the
supervisor does (multiprocessing closes its pipe), or by SIGKILL. A child installs its own
SIGTERM handler first thing (worker/main.child_main).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal

import psycopg  # noqa: F401  (imported for its pages)
import pydantic  # noqa: F401
from setproctitle import setproctitle

# the child's code and what it imports; inflight too: every child_main imports it (the
# many-in-flight loop, with psycopg_pool), whichever worker it then runs
import pgq_supervisor.worker.inflight
import pgq_supervisor.worker.main  # noqa: F401
from pgq_supervisor.supervisor.children import PRELOAD_APP_ENV

TITLE = "pgq-forkserver"


def preload_app(target: str) -> bool:
    """Import the module of `target`; False (and nothing raised) if that fails."""
    module = target.partition(":")[0]
    if not module:
        return False
    try:
        importlib.import_module(module)
    except BaseException:  # the child imports it again at boot and reports what failed
        return False
    return True


signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.environ.get(PRELOAD_APP_ENV):
    preload_app(os.environ[PRELOAD_APP_ENV])
with contextlib.suppress(Exception):
    setproctitle(TITLE)
gc.freeze()
