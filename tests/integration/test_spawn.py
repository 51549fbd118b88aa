"""Children are forked by a preloaded fork server (children.spawn_process): real processes, a real
database. The fork server holds no connection and no thread, so none crosses a fork; it has
psycopg and pydantic loaded (their pages are what the children share); an app that cannot be
imported still fails the child at boot with CHILD_BOOT_FAILURE; a fork server that died is
started again on the next spawn.

How much memory that saves is a figure of the benchmark harness (`--only memory`), not a test.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection

from pgq_supervisor.errors import ExitCode
from pgq_supervisor.ipc import BootFailed, JobSlot, Ready, Stop
from pgq_supervisor.supervisor.children import Process, spawn_process
from tests.support.specs import child_spec
from tests.support.waiting import DEADLINE, until

APP = "tests.integration.test_worker_reconnect:registry"  # serves type "t"


def _recv(pipe: Connection) -> object:
    assert pipe.poll(DEADLINE), "nothing from the child"
    return pipe.recv()


@contextmanager
def _child(dsn: str, app: str = APP) -> Iterator[tuple[Process, Connection]]:
    proc, pipe = spawn_process(
        child_spec(dsn, worker_id="test/spawn-0", app=app, log_level="warning"), JobSlot(("t",))
    )
    try:
        yield proc, pipe
    finally:
        proc.kill()
        proc.join(DEADLINE)
        pipe.close()


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _parent(pid: int) -> int:
    return int(_status(pid)["PPid"])


def _title(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


def _connections(pid: int) -> set[str]:
    """The inodes of `pid`'s connected sockets: TCP, and connected unix sockets (a database
    connection is one or the other; a listening socket is neither)."""
    connected: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                connected |= {line.split()[9] for line in list(f)[1:]}
        except FileNotFoundError:
            continue
    with open("/proc/net/unix") as f:
        # Num RefCount Protocol Flags Type St Inode [Path]; St 03: connected
        connected |= {cols[6] for cols in (line.split() for line in list(f)[1:]) if cols[5] == "03"}
    mine = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[len("socket:[") : -1])
    return mine & connected


def test_children_fork_from_a_preloaded_server_without_connections_or_threads(dsn: str) -> None:
    with _child(dsn) as (proc, pipe):
        ready = _recv(pipe)
        assert isinstance(ready, Ready) and ready.pid == proc.pid
        assert proc.pid is not None
        server = _parent(proc.pid)
        assert server != os.getpid(), "the child was not forked by a fork server"
        assert _title(server) == "pgq-forkserver"
        assert _status(server)["Threads"] == "1"
        assert _connections(server) == set(), "the fork server holds a connection"
        assert len(_connections(proc.pid)) >= 2, "the ready child: its pipe, its database"
        with open(f"/proc/{server}/maps") as f:
            maps = f.read()
        assert "_pydantic_core" in maps, "pydantic is not preloaded in the fork server"
        pipe.send(Stop())
        proc.join(DEADLINE)
        assert proc.exitcode == ExitCode.OK


def test_an_app_that_cannot_be_imported_fails_the_child_at_boot(dsn: str) -> None:
    with _child(dsn, app="tests.integration.no_such_module:registry") as (proc, pipe):
        failed = _recv(pipe)
        assert isinstance(failed, BootFailed) and failed.app_error
        assert "no_such_module" in failed.error
        proc.join(DEADLINE)
        assert proc.exitcode == ExitCode.CHILD_BOOT_FAILURE


def test_a_fork_server_that_died_is_started_again(dsn: str) -> None:
    with _child(dsn) as (proc, pipe):
        assert isinstance(_recv(pipe), Ready)
        assert proc.pid is not None
        server = _parent(proc.pid)
    os.kill(server, signal.SIGKILL)
    until(lambda: not os.path.exists(f"/proc/{server}") or _zombie(server), "fork server gone")
    with _child(dsn) as (proc, pipe):
        assert isinstance(_recv(pipe), Ready)
        assert proc.pid is not None
        again = _parent(proc.pid)
        assert again != server and _title(again) == "pgq-forkserver"


def _zombie(pid: int) -> bool:
    try:
        return _status(pid)["State"].startswith("Z")
    except FileNotFoundError:
        return True
