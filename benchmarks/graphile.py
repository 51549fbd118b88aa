"""graphile-worker (Node.js, from the npm registry) as a peer: bulk enqueue and the no-op drain.

Set-up (only when `--peers` asks for it): `npm install graphile-worker@0.17` into
`benchmarks/.node/` (git-ignored), and a small Node script written there by the harness
(`pgqb-graphile.js`), which migrates the schema, bulk-enqueues with `addJobs` (1,000 specs per
call, built before the clock starts, one transaction each), or runs a drain worker: `runOnce`
(it leaves when the queue is empty) with a no-op task that counts its runs.

The drain is timed like ours (drain.py): the jobs table filled, VACUUM ANALYZE + CHECKPOINT,
the start gate held on `graphile_worker._private_jobs` until every worker process's first
fetch waits on it, then from its opening to the last completion by the database clock.
graphile-worker deletes a job when it completes it, so the harness adds one statement-level
AFTER DELETE trigger (transition table) that writes one row per completing statement
(`clock_timestamp()`, rows deleted) into a side table: the end of the drain is the last such
row. Every job ran once: the table is empty, the trigger counted n deleted rows, and the
no-op tasks of all processes ran n times in all.

Best configuration, found the way graphile-worker's own perfTest does (`perfTest/run.js`,
`perfTest/graphile.config.js`: 4 processes of `runOnce` x 24 concurrent jobs, maxPoolSize 25,
`localQueue: {size: 500, refetchDelay: {durationMs: 10}}`, `completeJobBatchDelay: 0`,
`failJobBatchDelay: 0`, prepared statements on; `localQueue.size` is also the size of one
fetch, getJobBatchSize), then swept around it on this 2-core machine with `python -m
benchmarks.graphile --sweep` (SWEEP; 20,000 jobs, 3 interleaved rounds, median jobs/s; two
sweeps, the machine shared with other work at load 3-13, so single runs spread up to 2x):

    procs x concurrency (pool)  localQueue  completeDelay  prepared   sweep 1   sweep 2
      4 x 24 (25)                  1000          0           yes       20,246    17,906   BEST
      1 x 50 (51)                   500          0           yes       19,641    17,657
      2 x 50 (51)                   500          0           yes       18,043    16,654
      2 x 24 (25)                   500          0           yes       17,823    16,887
      4 x 24 (25)                   500          0           no        14,186    17,997
      4 x 24 (25)                   100          0           yes       15,005    14,909
      4 x 24 (25)                   500          0           yes       11,296    12,623   perfTest's
      2 x 24 (25)                    -1         -1           yes        1,447     1,638   defaults

Everything batched is within the noise of everything else but localQueue 100 and perfTest's
own (first in each round, which may cost it); 4 x 24 with localQueue 1000 was in the top two
of both sweeps, so it is BEST. Without the local queue and batched completions (`-1`, the
library's defaults) it drains ~1,500 jobs/s. With `completeJobBatchDelay: -1` and the local
queue on, `runOnce` exited with ~20 of 20,000 jobs still in the table (their DELETE not sent
yet), so that configuration cannot be timed (left out of SWEEP). More than 4 x 25 connections
does not fit the server's max_connections (100) beside the other work.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import psycopg
from psycopg.conninfo import conninfo_to_dict

from benchmarks.apps import NOOP
from benchmarks.drain import GATE_TIMEOUT, Drained, Mark, no_mark
from benchmarks.procs import ROOT, BenchError, Process, wait_for
from benchmarks.report import Json
from benchmarks.server import StartGate, settle

NAME = "graphile-worker"
PACKAGE = "graphile-worker@0.17"
NODE_DIR = ROOT / "benchmarks" / ".node"
SCRIPT = NODE_DIR / "pgqb-graphile.js"
APP_NAME = "pgqb-graphile"
JOBS = "graphile_worker._private_jobs"
CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Config:
    procs: int = 4
    concurrency: int = 24
    pool: int = 25
    local_queue: int = 500  # -1: off (each worker fetches its own job)
    refetch_ms: int = 10
    complete_delay: int = 0  # -1: off (one DELETE per job)
    prepared: bool = True

    def label(self) -> str:
        return (
            f"{self.procs} procs x concurrency {self.concurrency}, localQueue {self.local_queue},"
            f" completeJobBatchDelay {self.complete_delay}"
        )


PERFTEST = Config()  # graphile-worker's perfTest/graphile.config.js, 4 processes as its run.js
# The best of the sweep (see the docstring): perfTest's configuration with localQueue 1000
BEST = replace(PERFTEST, local_queue=1000)

SWEEP: tuple[Config, ...] = (
    PERFTEST,
    replace(PERFTEST, procs=2),
    replace(PERFTEST, procs=2, concurrency=50, pool=51),
    replace(PERFTEST, procs=1, concurrency=50, pool=51),
    replace(PERFTEST, local_queue=100),
    BEST,
    replace(PERFTEST, procs=2, local_queue=-1, complete_delay=-1),
    replace(PERFTEST, prepared=False),
)

_JS = r"""
// Written by benchmarks/graphile.py: graphile-worker's side of the peer benchmark.
const { runOnce, runMigrations, makeWorkerUtils, Logger } = require("graphile-worker");
const [mode, url, TASK, arg] = process.argv.slice(2);
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});
async function main() {
  if (mode === "migrate") {
    await runMigrations({ connectionString: url, logger });
  } else if (mode === "enqueue") {
    const n = Number(arg);
    const chunks = [];
    for (let i = 0; i < n; i += 1000) {
      const size = Math.min(1000, n - i);
      chunks.push(Array.from({ length: size }, () => ({ identifier: TASK, payload: {} })));
    }
    const utils = await makeWorkerUtils({ connectionString: url, logger });
    try {
      const t0 = process.hrtime.bigint();
      for (const specs of chunks) await utils.addJobs(specs);
      const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
      console.log(JSON.stringify({ seconds }));
    } finally {
      await utils.release();
    }
  } else if (mode === "drain") {
    const c = JSON.parse(arg);
    let ran = 0;
    const worker = {
      connectionString: url,
      concurrentJobs: c.concurrency,
      maxPoolSize: c.pool,
      preparedStatements: c.prepared,
      completeJobBatchDelay: c.complete_delay,
      failJobBatchDelay: c.complete_delay,
    };
    if (c.local_queue > 0) {
      worker.localQueue = { size: c.local_queue, refetchDelay: { durationMs: c.refetch_ms } };
    }
    await runOnce({
      logger,
      noHandleSignals: true,
      taskList: { [TASK]: async () => { ran++; } },
      preset: { worker },
    });
    console.log(JSON.stringify({ ran }));
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
}
main().catch((e) => { console.error(e); process.exit(1); });
"""

_TRIGGER = """
CREATE TABLE IF NOT EXISTS public.pgqb_done (at timestamptz NOT NULL, n bigint NOT NULL);
CREATE OR REPLACE FUNCTION public.pgqb_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.pgqb_done SELECT clock_timestamp(), count(*) FROM gone;
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER pgqb_done AFTER DELETE ON graphile_worker._private_jobs
  REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION public.pgqb_done();
"""


def unavailable() -> str | None:
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"{tool} not found (graphile-worker runs on Node.js)"
    return None


def version() -> str:
    try:
        meta = json.loads((NODE_DIR / "node_modules/graphile-worker/package.json").read_text())
    except (OSError, ValueError):
        return "not installed yet"
    return str(meta.get("version", "unknown"))


def ensure_installed() -> None:
    """npm install graphile-worker into benchmarks/.node (once), and write the Node script."""
    NODE_DIR.mkdir(exist_ok=True)
    if not (NODE_DIR / "node_modules/graphile-worker/package.json").exists():
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NODE_DIR), PACKAGE],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise BenchError(f"npm install {PACKAGE} failed ({done.returncode}): {tail}")
    SCRIPT.write_text(_JS)


def node_url(dsn: str) -> str:
    """The libpq DSN as the URL node-postgres wants (a socket directory works as host too)."""
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    dbname = params.pop("dbname", "postgres")
    query: dict[str, str] = {
        k: params[k] for k in ("host", "port", "user", "password") if k in params
    }
    query["application_name"] = APP_NAME
    return f"postgresql:///{urllib.parse.quote(dbname)}?{urllib.parse.urlencode(query)}"


def _node(mode: str, dsn: str, arg: str = "", timeout: float = 600) -> str:
    done = subprocess.run(
        ["node", str(SCRIPT), mode, node_url(dsn), NOOP, arg],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=NODE_DIR,
        check=False,
    )
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise BenchError(f"graphile-worker {mode} exited {done.returncode}: {tail}")
    return done.stdout


def install(dsn: str) -> None:
    """graphile-worker's schema (its own migrations), then the harness's completion trigger."""
    ensure_installed()
    _node("migrate", dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_TRIGGER)


def _reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE graphile_worker._private_jobs, graphile_worker._private_job_queues,"
            " public.pgqb_done"
        )


def _enqueue(dsn: str, n: int) -> float:
    out = _node("enqueue", dsn, str(n))
    return float(json.loads(out.strip().splitlines()[-1])["seconds"])


def bulk_enqueue(dsn: str, n: int) -> float:
    """Jobs/s of `addJobs` with 1,000 jobs per call, into an empty queue."""
    _reset(dsn)
    return n / _enqueue(dsn, n)


def drain(dsn: str, n: int, config: Config = BEST, mark: Mark = no_mark) -> Drained:
    """One timed drain of `n` no-op jobs by `config.procs` graphile-worker processes; `mark`
    as drain.run_drain's."""
    _reset(dsn)
    mark("enqueue")
    _enqueue(dsn, n)
    mark("enqueued")
    settle(dsn, [JOBS])
    mark("drain")
    gate = StartGate(dsn, JOBS, APP_NAME)
    cmd = ["node", str(SCRIPT), "drain", node_url(dsn), NOOP, json.dumps(asdict(config))]
    workers = [Process(cmd, "graphile") for _ in range(config.procs)]
    ran = 0
    try:

        def all_waiting() -> bool:
            for w in workers:
                w.check_alive()
            return gate.waiting() >= config.procs

        wait_for(f"{config.procs} {NAME} processes at the start gate", all_waiting, GATE_TIMEOUT)
        opened_at = gate.open()
        for w in workers:
            code = w.wait(max(300.0, n / 50))
            if code != 0:
                log = w.log_tail(12).replace("\n", " | ")
                raise BenchError(f"{NAME} worker exited {code}: {log}")
            ran += int(json.loads(w.log_tail(1))["ran"])
    finally:
        gate.close()
        for w in workers:
            w.close()
    return _verify(dsn, n, opened_at, ran, config.procs)


def _verify(dsn: str, n: int, opened_at: float, ran: int, procs: int) -> Drained:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM graphile_worker._private_jobs), sum(n),"
            " extract(epoch FROM max(at))::float8 FROM public.pgqb_done"
        ).fetchone()
    if row is None or row[2] is None:
        raise BenchError(f"{NAME}: no completion recorded")
    left, deleted, last = row
    if left != 0 or deleted != n or ran != n:
        raise BenchError(
            f"{NAME}: {n} jobs enqueued; {left} left, {deleted} completed, {ran} task runs"
        )
    return Drained(n, float(last) - opened_at, procs, None, opened_at)


def config() -> dict[str, Json]:
    return {"package": PACKAGE, "node": _node_version(), **asdict(BEST)}


def _node_version() -> str:
    try:
        return subprocess.run(
            ["node", "--version"], capture_output=True, text=True, check=False, timeout=30
        ).stdout.strip()
    except OSError:
        return "unknown"


def sweep(dsn: str, n: int, runs: int, configs: Sequence[Config] = SWEEP) -> None:
    """Each configuration `runs` times, interleaved; prints the median jobs/s of each."""
    rates: dict[Config, list[float]] = {c: [] for c in configs}
    for r in range(runs):
        for c in configs:
            try:
                d = drain(dsn, n, c)
            except BenchError as exc:
                print(f"run {r + 1}: {c.label()}: {exc}", file=sys.stderr, flush=True)
                continue
            rates[c].append(d.rate)
            print(f"run {r + 1}: {c.label()}, prepared {c.prepared}: {d.rate:,.0f} jobs/s",
                  file=sys.stderr, flush=True)  # fmt: skip
    done = {c: v for c, v in rates.items() if v}
    for c, values in sorted(done.items(), key=lambda kv: -statistics.median(kv[1])):
        spread = f"{min(values):,.0f}-{max(values):,.0f}"
        print(f"{statistics.median(values):>8,.0f} jobs/s ({spread})  {c}")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks.graphile --sweep`: try configurations on a scratch database."""
    from benchmarks.server import Scratch, find_server

    parser = argparse.ArgumentParser(prog="python -m benchmarks.graphile")
    parser.add_argument("--sweep", action="store_true", required=True)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args(argv)
    server = find_server(args.dsn)
    scratch = Scratch(server)
    try:
        dsn = scratch.create("graphile")
        install(dsn)
        sweep(dsn, args.jobs, args.runs)
    finally:
        scratch.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
