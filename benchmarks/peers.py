"""The same workloads through pgqueuer and procrastinate (the optional `bench` extra).

All peer code lives here; the peer libraries are imported only inside functions, so the
harness runs without them. Each peer gets its own scratch database and runs with the
configuration its authors recommend for throughput:

- pgqueuer: asyncpg and uvloop, 2 worker processes x 2 QueueManagers each (one connection
  each), batch size 100, `QueueExecutionMode.drain`; bulk enqueue is `Queries.enqueue` with
  lists of 1,000.
- graphile-worker (Node.js, installed from npm by the harness): see graphile.py.
- procrastinate: its async worker (`App.run_worker_async`) with `concurrency` jobs in
  flight, 2 worker processes, `wait=False` so a worker leaves when the queue is empty; bulk
  enqueue is `Task.batch_defer_async` with 1,000 jobs per call.

The drain is timed like ours (drain.py): a start gate on the peer's job table, then from its
opening to the last completion as the peer's own log records it (pgqueuer_log 'successful',
procrastinate_events 'succeeded'), and every job must have run exactly once.

Run as a module, this file is the peer worker process: `python -m benchmarks.peers
pgqueuer|procrastinate --dsn DSN ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from benchmarks import graphile
from benchmarks.apps import NOOP
from benchmarks.drain import GATE_TIMEOUT, Drained, Mark, no_mark
from benchmarks.procs import BenchError, Process, wait_for
from benchmarks.report import Json
from benchmarks.server import StartGate, settle

Peer = Literal["pgqueuer", "procrastinate", "graphile-worker"]
PEERS: tuple[Peer, ...] = ("pgqueuer", "procrastinate", "graphile-worker")
MODULES: dict[Peer, tuple[str, ...]] = {
    "pgqueuer": ("pgqueuer", "asyncpg"),
    "procrastinate": ("procrastinate",),
    "graphile-worker": (),
}
CHUNK = 1000
PGQUEUER_PROCS = 2
PGQUEUER_MANAGERS = 2
PGQUEUER_BATCH = 100
PROCRASTINATE_PROCS = 2
# Each procrastinate worker fetches one job per round trip: beyond ~30 jobs in flight nothing
# changed here (measured 1, 4, 10, 30, 50, 100).
PROCRASTINATE_CONCURRENCY = 30


def unavailable(peer: Peer) -> str | None:
    """Why `peer` cannot run here (None when it can)."""
    if peer == graphile.NAME:
        return graphile.unavailable()
    for module in MODULES[peer]:
        try:
            importlib.import_module(module)
        except ImportError:
            return f"{module} not installed (pip install -e '.[bench]')"
    return None


def version(peer: Peer) -> str:
    if peer == graphile.NAME:
        return graphile.version()
    try:
        return importlib.metadata.version(peer)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def app_name(peer: Peer) -> str:
    return f"pgqb-{peer}"


def _event_loop_runner(peer: Peer) -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop for pgqueuer (what its own benchmark uses), asyncio for procrastinate."""
    runner: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    if peer == "pgqueuer":
        with contextlib.suppress(ImportError):
            import uvloop

            runner = uvloop.run
    return runner


def _run(peer: Peer, make: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        await make()

    _event_loop_runner(peer)(main())


# ---- pgqueuer -------------------------------------------------------------------------------


async def _asyncpg_connect(dsn: str) -> Any:
    """asyncpg wants keywords, not a libpq conninfo string."""
    import asyncpg

    params = conninfo_to_dict(dsn)
    kwargs: dict[str, object] = {
        "server_settings": {"application_name": app_name("pgqueuer")},
    }
    for ours, theirs in (("host", "host"), ("user", "user"), ("password", "password")):
        if params.get(ours):
            kwargs[theirs] = str(params[ours])
    if params.get("dbname"):
        kwargs["database"] = str(params["dbname"])
    if params.get("port"):
        kwargs["port"] = int(str(params["port"]))
    return await asyncpg.connect(**kwargs)


def _pgqueuer_queries(conn: Any) -> Any:
    from pgqueuer import AsyncpgDriver, Queries

    return Queries(AsyncpgDriver(conn))


async def _pgqueuer_enqueue(dsn: str, n: int) -> float:
    conn = await _asyncpg_connect(dsn)
    try:
        queries = _pgqueuer_queries(conn)
        chunks = [min(CHUNK, n - i) for i in range(0, n, CHUNK)]
        start = time.perf_counter()
        for size in chunks:
            await queries.enqueue([NOOP] * size, [b"{}"] * size, [0] * size)
        return time.perf_counter() - start
    finally:
        await conn.close()


async def _pgqueuer_install(dsn: str) -> None:
    conn = await _asyncpg_connect(dsn)
    try:
        await _pgqueuer_queries(conn).install()
    finally:
        await conn.close()


def _pgqueuer_reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")


def _pgqueuer_verify(dsn: str, n: int, opened_at: float) -> Drained:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT (SELECT count(*) FROM pgqueuer),
                   count(*) FILTER (WHERE status = 'successful'),
                   count(DISTINCT job_id) FILTER (WHERE status = 'successful'),
                   count(*) FILTER (WHERE status NOT IN ('successful', 'picked', 'queued')),
                   extract(epoch FROM max(created) FILTER (WHERE status = 'successful'))::float8
            FROM pgqueuer_log
            """
        ).fetchone()
    if row is None:
        raise BenchError("pgqueuer: no log rows")
    left, ok, distinct, other, last = row
    if left != 0 or ok != n or distinct != n or other != 0:
        raise BenchError(
            f"pgqueuer: {n} jobs enqueued; {left} left in the queue, {ok} successful"
            f" ({distinct} distinct), {other} other outcomes"
        )
    return Drained(n, float(last) - opened_at, PGQUEUER_PROCS * PGQUEUER_MANAGERS, None)


async def _pgqueuer_noop(job: object) -> None:
    return None


async def _pgqueuer_worker(
    dsn: str, managers: int, batch_size: int, sleep: float = 0.0, max_tasks: int | None = None
) -> None:
    from pgqueuer import QueueManager
    from pgqueuer.types import QueueExecutionMode

    async def sleeper(job: object) -> None:
        await asyncio.sleep(sleep)  # the `io` group: an I/O-bound job

    qms = []
    for _ in range(managers):
        qm = QueueManager(_pgqueuer_queries(await _asyncpg_connect(dsn)))
        qm.entrypoint(NOOP)(sleeper if sleep else _pgqueuer_noop)
        qms.append(qm)
    await asyncio.gather(
        *(
            qm.run(
                batch_size=batch_size,
                mode=QueueExecutionMode.drain,
                max_concurrent_tasks=max_tasks,
            )
            for qm in qms
        )
    )


# ---- procrastinate --------------------------------------------------------------------------


def _procrastinate_app(dsn: str) -> tuple[Any, Any]:
    """A procrastinate App on `dsn` and its no-op task."""
    import procrastinate

    conninfo = make_conninfo(dsn, application_name=app_name("procrastinate"))
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    return app, app.task(name=NOOP)(_procrastinate_noop)


async def _procrastinate_noop() -> None:
    return None


async def _procrastinate_install(dsn: str) -> None:
    app, _ = _procrastinate_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def _procrastinate_enqueue(dsn: str, n: int) -> float:
    app, task = _procrastinate_app(dsn)
    async with app.open_async():
        chunks = [min(CHUNK, n - i) for i in range(0, n, CHUNK)]
        start = time.perf_counter()
        for size in chunks:
            await task.batch_defer_async(*([{}] * size))
        return time.perf_counter() - start


def _procrastinate_reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers,"
            " procrastinate_periodic_defers CASCADE"
        )


def _procrastinate_verify(dsn: str, n: int, opened_at: float) -> Drained:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT (SELECT count(*) FROM procrastinate_jobs),
                   (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),
                   count(*) FILTER (WHERE type = 'started'),
                   count(DISTINCT job_id) FILTER (WHERE type = 'started'),
                   extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded'))::float8
            FROM procrastinate_events
            """
        ).fetchone()
    if row is None:
        raise BenchError("procrastinate: no event rows")
    total, ok, started, distinct, last = row
    if total != n or ok != n or started != n or distinct != n:
        raise BenchError(
            f"procrastinate: {n} jobs enqueued; {total} found, {ok} succeeded,"
            f" {started} starts ({distinct} distinct jobs)"
        )
    return Drained(n, float(last) - opened_at, PROCRASTINATE_PROCS, None)


async def _procrastinate_worker(dsn: str, concurrency: int) -> None:
    app, _ = _procrastinate_app(dsn)
    async with app.open_async():
        await app.run_worker_async(
            concurrency=concurrency, wait=False, install_signal_handlers=False
        )


# ---- what the harness calls -----------------------------------------------------------------


def install(peer: Peer, dsn: str) -> None:
    """Create the peer's schema in an empty database."""
    if peer == graphile.NAME:
        graphile.install(dsn)
    elif peer == "pgqueuer":
        _run(peer, lambda: _pgqueuer_install(dsn))
    else:
        _run(peer, lambda: _procrastinate_install(dsn))


def _reset(peer: Peer, dsn: str) -> None:
    if peer == "pgqueuer":
        _pgqueuer_reset(dsn)
    else:
        _procrastinate_reset(dsn)


def bulk_enqueue(peer: Peer, dsn: str, n: int) -> float:
    """Jobs/s of the peer's bulk enqueue, 1,000 jobs per call, into an empty queue."""
    if peer == graphile.NAME:
        return graphile.bulk_enqueue(dsn, n)
    _reset(peer, dsn)
    took: list[float] = []

    async def timed() -> None:
        if peer == "pgqueuer":
            took.append(await _pgqueuer_enqueue(dsn, n))
        else:
            took.append(await _procrastinate_enqueue(dsn, n))

    _run(peer, timed)
    return n / took[0]


def worker_command(
    peer: Peer, dsn: str, sleep: float = 0.0, max_tasks: int | None = None
) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks.peers", peer, "--dsn", dsn]
    if sleep:
        cmd += ["--sleep", str(sleep)]
    if max_tasks is not None:
        cmd += ["--max-tasks", str(max_tasks)]
    if peer == "pgqueuer":
        # pgqueuer wants max_concurrent_tasks >= 2 x batch_size
        batch = PGQUEUER_BATCH if max_tasks is None else max(1, min(PGQUEUER_BATCH, max_tasks // 2))
        return [*cmd, "--managers", str(PGQUEUER_MANAGERS), "--batch-size", str(batch)]
    return [*cmd, "--concurrency", str(PROCRASTINATE_CONCURRENCY)]


def drain(
    peer: Peer,
    dsn: str,
    n: int,
    sleep: float = 0.0,
    max_tasks: int | None = None,
    mark: Mark = no_mark,
) -> Drained:
    """One timed drain of `n` no-op jobs by the peer's recommended worker set-up; `sleep`:
    each job awaits asyncio.sleep that long instead (the `io` group; pgqueuer only), and
    `max_tasks` caps each queue manager's jobs in flight (pgqueuer's max_concurrent_tasks;
    None: no cap, its default); `mark` as drain.run_drain's."""
    if peer == graphile.NAME:
        return graphile.drain(dsn, n, mark=mark)
    _reset(peer, dsn)
    mark("enqueue")
    _run(peer, lambda: _fill(peer, dsn, n))
    mark("enqueued")
    table = "pgqueuer" if peer == "pgqueuer" else "procrastinate_jobs"
    settle(dsn, [table])
    mark("drain")
    procs = PGQUEUER_PROCS if peer == "pgqueuer" else PROCRASTINATE_PROCS
    waiters = procs * (PGQUEUER_MANAGERS if peer == "pgqueuer" else 1)
    gate = StartGate(dsn, table, app_name(peer))
    workers = [Process(worker_command(peer, dsn, sleep, max_tasks), peer) for _ in range(procs)]
    try:

        def all_waiting() -> bool:
            for w in workers:
                w.check_alive()
            return gate.waiting() >= waiters

        wait_for(f"{waiters} {peer} consumers at the start gate", all_waiting, GATE_TIMEOUT, 0.02)
        opened_at = gate.open()
        for w in workers:
            code = w.wait(max(300.0, n / 50))  # procrastinate may do only ~200 jobs/s here
            if code != 0:
                raise BenchError(f"{peer} worker exited {code}: {w.log_tail(3)}")
    finally:
        gate.close()
        for w in workers:
            w.close()
    if peer == "pgqueuer":
        return _pgqueuer_verify(dsn, n, opened_at)
    return _procrastinate_verify(dsn, n, opened_at)


async def _fill(peer: Peer, dsn: str, n: int) -> None:
    if peer == "pgqueuer":
        await _pgqueuer_enqueue(dsn, n)
    else:
        await _procrastinate_enqueue(dsn, n)


def describe_workers(peer: Peer) -> str:
    if peer == graphile.NAME:
        return graphile.BEST.label()
    if peer == "pgqueuer":
        return (
            f"{PGQUEUER_PROCS} procs x {PGQUEUER_MANAGERS} queue managers, batch {PGQUEUER_BATCH}"
        )
    return f"{PROCRASTINATE_PROCS} procs x concurrency {PROCRASTINATE_CONCURRENCY}"


def config(peer: Peer) -> dict[str, Json]:
    if peer == graphile.NAME:
        return graphile.config()
    if peer == "pgqueuer":
        return {
            "driver": "asyncpg",
            "event_loop": "uvloop",
            "processes": PGQUEUER_PROCS,
            "queue_managers_per_process": PGQUEUER_MANAGERS,
            "batch_size": PGQUEUER_BATCH,
            "mode": "drain",
        }
    return {
        "connector": "PsycopgConnector",
        "processes": PROCRASTINATE_PROCS,
        "concurrency": PROCRASTINATE_CONCURRENCY,
        "wait": False,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """A peer worker process: drain the peer's queue, then exit 0."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers")
    parser.add_argument("peer", choices=("pgqueuer", "procrastinate"))
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--managers", type=int, default=PGQUEUER_MANAGERS)
    parser.add_argument("--batch-size", type=int, default=PGQUEUER_BATCH)
    parser.add_argument("--concurrency", type=int, default=PROCRASTINATE_CONCURRENCY)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--max-tasks", type=int, default=None)
    args = parser.parse_args(argv)
    peer: Peer = args.peer
    if peer == "pgqueuer":
        _run(
            peer,
            lambda: _pgqueuer_worker(
                args.dsn, args.managers, args.batch_size, args.sleep, args.max_tasks
            ),
        )
    else:
        _run(peer, lambda: _procrastinate_worker(args.dsn, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
