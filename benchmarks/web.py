"""The dashboard's jobs page over a big table: the real `dashboard` command (uvicorn) in a
subprocess, timed over HTTP from here, with `--web-jobs` (1,000,000) finished jobs in the table.

Each page is asked for `requests` times after two warm-up requests, one at a time: the list
unfiltered, by state, by type, by a time range, a unique_key search, and the 20th page of the
unfiltered list (reached by its keyset). The figures are the median over every request and the
worst page's 95th percentile.

Then the searches and pages of issue 25, timed the same way and reported apart: a search by job
id (answered by a redirect to the job's page, which is timed with it), by a payload field that
1,000 jobs share and by one only one job has, without and then with the opt-in GIN index
(job_payload_idx, created here CONCURRENTLY and dropped after), and a type's page over each of
its windows (1h, 24h, 7d: the percentiles and the chart read every finished job of the type in
the window).
"""

from __future__ import annotations

import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from html import unescape

import psycopg

from benchmarks.procs import ROOT, BenchError, child_env, wait_for
from benchmarks.report import Json
from pgq_supervisor import db
from pgq_supervisor.jobs import JsonValue

# finished jobs, spread over 5 types and the 3 final states, one created per second back from
# now (so a time range of an hour holds 3,600), each with a unique key
FILL = """
INSERT INTO pgq.job (type, payload, state, max_retry_count, started_at, stopped_at, worker_id,
                     created_at, unique_key, error_msg)
SELECT (ARRAY['a', 'b', 'c', 'd', 'e'])[1 + g %% 5],
       jsonb_build_object('g', g, 'user_id', g %% 1000, 'kind', 'mail'),
       (ARRAY['succeeded', 'succeeded', 'succeeded', 'failed', 'succeeded', 'cancelled',
              'succeeded'])[1 + g %% 7]
           ::pgq.job_state,
       3, now() - make_interval(secs => g), now() - make_interval(secs => g), 'bench',
       now() - make_interval(secs => g), 'key-' || g,
       CASE WHEN g %% 7 = 3 THEN 'RuntimeError: boom' END
FROM generate_series(1, %(n)s) g
"""
OLDER_RE = re.compile(r'id="older" href="([^"]+)"')
PAYLOAD_SEARCHES = {
    "payload, 1,000 jobs match": "/jobs?q=payload.user_id+%3D+7",
    "payload, one job matches": "/jobs?q=payload.g+%3D+{half}",
}
# the webidx group's drain: what a job's payload often is, three keys (a GIN entry each)
DRAIN_PAYLOAD: dict[str, JsonValue] = {"user_id": 42, "kind": "mail", "to": "a@b.example"}


def enqueue_payload(i: int) -> JsonValue:
    """The webidx group's bulk enqueue: three keys, two of them different in every job."""
    return {"user_id": i, "kind": "mail", "to": f"user{i}@example.com"}


@dataclass(frozen=True, slots=True)
class WebResult:
    p50_ms: float
    worst_p95_ms: float
    worst_page: str
    pages: dict[str, dict[str, float]]
    jobs: int
    extra: dict[str, dict[str, float]]

    def details(self) -> dict[str, Json]:
        return {
            "jobs": self.jobs,
            "worst_page": self.worst_page,
            "pages": {k: dict(v) for k, v in self.pages.items()},
            "searches_and_type_pages": {k: dict(v) for k, v in self.extra.items()},
        }

    def extra_p95(self, *names: str) -> float:
        return max(self.extra[n]["p95_ms"] for n in names)


def payload_index(dsn: str, *, present: bool) -> None:
    """Create (CONCURRENTLY) or drop the payload search's GIN index."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if present:
            db.create_dashboard_indexes(conn, "pgq", payload=True)
        else:
            conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS pgq.{db.PAYLOAD_INDEX}")


def fill(dsn: str, jobs: int) -> None:
    """Put `jobs` finished jobs in the table (once: a filled table is kept)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pgq.job").fetchone()
        if row is not None and row[0] >= jobs:
            return
        conn.execute("TRUNCATE pgq.job CASCADE")
        db.create_dashboard_indexes(conn, "pgq")  # opt-in: what a dashboard at scale needs
        conn.execute(FILL, {"n": jobs})
        conn.execute("VACUUM ANALYZE pgq.job")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as answer:
        body = answer.read().decode()
        if answer.status != 200:
            raise BenchError(f"GET {url} answered {answer.status}")
    return (time.perf_counter() - started) * 1000, body


def run_web(dsn: str, jobs: int, requests: int) -> WebResult:
    fill(dsn, jobs)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgq_supervisor", "dashboard", "--dsn", dsn, "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(), cwd=ROOT,
    )  # fmt: skip
    try:

        def up() -> bool:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr is not None else ""
                raise BenchError(f"the dashboard exited: {err[-300:]}")
            try:
                return _get(base + "/jobs?state=failed")[0] > 0
            except OSError:
                return False

        wait_for("the dashboard to answer", up, timeout=30, interval=0.1)
        page = base + "/jobs"
        for _ in range(19):  # the 20th page, by following "older"
            found = OLDER_RE.search(_get(page)[1])
            if found is None:
                raise BenchError("the jobs page has no older page")
            page = base + unescape(found.group(1))
        pages = {
            "unfiltered": "/jobs",
            "state failed": "/jobs?state=failed",
            "type c": "/jobs?type=c",
            "an hour, a day ago": "/jobs?since=" + _ago(25) + "&until=" + _ago(24),
            "unique key": f"/jobs?q=key-{jobs // 2}",
            "20th page": page[len(base) :],
        }
        timings = _time(base, pages, requests)
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT id FROM pgq.job WHERE unique_key = %s", (f"key-{jobs // 3}",)
            )
            some_id = str(row.fetchone()[0])  # type: ignore[index]
        searches = {
            "id search (redirect + job page)": f"/jobs?q={some_id}",
            "payload, 1,000 jobs match": "/jobs?q=payload.user_id+%3D+7",
            "payload, one job matches": f"/jobs?q=payload.g+%3D+{jobs // 2}",
        }
        extra = _time(base, searches, requests)
        for window in ("1h", "24h", "7d"):
            extra |= _time(base, {f"type page, {window}": f"/types/c?window={window}"}, requests)
        payload_index(dsn, present=True)
        try:
            gin = {f"{k} (GIN)": v for k, v in searches.items() if k.startswith("payload")}
            extra |= _time(base, gin, requests)
        finally:
            payload_index(dsn, present=False)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    p95 = {name: _p95(ms) for name, ms in timings.items()}
    worst = max(p95, key=lambda k: p95[k])
    return WebResult(
        p50_ms=statistics.median(ms for all_ms in timings.values() for ms in all_ms),
        worst_p95_ms=p95[worst],
        worst_page=worst,
        pages={k: {"p50_ms": statistics.median(v), "p95_ms": p95[k]} for k, v in timings.items()},
        jobs=jobs,
        extra={k: {"p50_ms": statistics.median(v), "p95_ms": _p95(v)} for k, v in extra.items()},
    )


def _time(base: str, pages: dict[str, str], requests: int) -> dict[str, list[float]]:
    """Each page `requests` times, one at a time, after two warm-up requests."""
    timings: dict[str, list[float]] = {}
    for name, path in pages.items():
        for _ in range(2):
            _get(base + path)
        timings[name] = [_get(base + path)[0] for _ in range(requests)]
    return timings


def _ago(hours: int) -> str:
    moment = time.gmtime(time.time() - hours * 3600)
    return time.strftime("%Y-%m-%dT%H:%M", moment)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
