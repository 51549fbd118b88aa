"""Process chaos: children SIGKILLed at random while bundles run (issue 4, part 3).

1,000 jobs in 20 bundles with completion jobs, --procs 4, a random child SIGKILLed every
0.25 s for 7.5 s (about 30 kills: as many as every 0.5 s for 15 s over twice the jobs gave,
in half the time). Afterwards no job is lost, every job is terminal, the invariants of SPEC §4
hold, every completion job ran exactly once, and the effect each handler writes through the
job's connection exists exactly once per job.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pgq_supervisor as pgq
from tests.acceptance.conftest import Conn
from tests.property.invariants import violations
from tests.support.processes import FAST, Supervisor, count
from tests.support.waiting import wait_for

BUNDLES = 20
PER_BUNDLE = 50
KILL_EVERY = 0.25
KILL_FOR = 7.5


def test_random_sigkills_lose_nothing_and_complete_each_bundle_once(
    dsn: str, db: Conn, sups: list[Supervisor]
) -> None:
    sup = Supervisor(dsn, "pgq_test_app:registry", "--procs", "4", *FAST)
    sups.append(sup)
    sup.wait_ready(4)
    bundles = [
        pgq.enqueue_bundle(
            db,
            f"chaos-{b}",
            # ~25 ms each: 1,000 jobs keep 4 children busy for the whole chaos window. Every
            # kill costs the job in hand an attempt, so they get plenty.
            [
                pgq.NewJob("sleep", {"seconds": 0.025}, max_retry_count=20)
                for _ in range(PER_BUNDLE)
            ],
            on_complete="bundle_done",
        )
        for b in range(BUNDLES)
    ]
    rng = random.Random(20261130)
    kills = 0
    stop = threading.Event()
    deadline = time.monotonic() + KILL_FOR
    while time.monotonic() < deadline:
        children = sup.children()
        if children:
            try:
                os.kill(rng.choice(children), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass  # it exited between ps and kill
        stop.wait(KILL_EVERY)  # the chaos schedule itself, not a wait for a condition
    assert kills >= 20
    total = BUNDLES * PER_BUNDLE + BUNDLES
    wait_for(
        "every job terminal",
        lambda: count(dsn, "state IN ('succeeded', 'failed', 'cancelled')") == total,
        timeout=120,
    )
    assert count(dsn) == total, "a job was lost or duplicated"
    assert count(dsn, "state = 'succeeded'") == total
    assert violations(db) == []
    for bundle in bundles:
        b = pgq.get_bundle(db, bundle.id)
        assert (b.num_jobs, b.num_jobs_stopped) == (PER_BUNDLE, PER_BUNDLE)
    done = db.execute(
        "SELECT payload->>'bundle_id', count(*) FROM pgq.job WHERE type = 'bundle_done' GROUP BY 1"
    ).fetchall()
    assert sorted(str(r[0]) for r in done) == sorted(str(b.id) for b in bundles)
    assert all(r[1] == 1 for r in done), "a bundle completed twice"
    effects = db.execute("SELECT count(*), count(DISTINCT job_id) FROM effects").fetchone()
    assert effects == (total, total), "an effect is missing or landed twice"
    deaths = db.execute(
        "SELECT count(*) FROM pgq.job, jsonb_array_elements(attempts) a"
        " WHERE a->>'kind' = 'worker_death'"
    ).fetchone()
    assert deaths is not None and deaths[0] != 0  # the kills did hit running jobs
    assert sup.stop() == 0
