"""The scheduler service on a real database: a new schedule waits for its next tick, downtime
enqueues the most recent missed tick (or catch_up of them), two services racing on two
connections enqueue each tick once, a schedule gone from the code stops firing; and the
`schedules` CLI."""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import datetime, timedelta

from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import JobId
from pgq_supervisor.periodic import Schedule
from pgq_supervisor.supervisor.maintenance.scheduler import Scheduler
from tests.support.db import SCHEMA, in_threads
from tests.support.processes import run_cli

HOUR = timedelta(hours=1)


def every(name: str, period: timedelta, catch_up: int = 0) -> Schedule:
    return Schedule.make(name, type="t", every=period, payload={"s": name}, catch_up=catch_up)


def backdate(conn: Conn, by: timedelta) -> None:
    """As if every schedule had been declared, and last run, `by` earlier: downtime."""
    conn.execute(
        "UPDATE pgq.schedule SET created_at = created_at - %(by)s, last_tick = last_tick - %(by)s",
        {"by": by},
    )


def ticks_of(conn: Conn, ids: list[JobId]) -> list[tuple[str, datetime]]:
    """(origin, tick) of each job, the tick read from its unique_key."""
    rows = conn.execute(
        "SELECT origin, unique_key, start_at FROM pgq.job WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    out = []
    for origin, key, start_at in rows:
        assert isinstance(key, str) and key.startswith(f"{origin}@"), key
        tick = datetime.fromisoformat(key.rpartition("@")[2])
        assert tick == start_at  # never released or retried here
        out.append((str(origin), tick))
    return sorted(out)


def test_a_new_schedule_waits_for_its_next_tick(conn: Conn) -> None:
    run = Scheduler(SCHEMA, [every("hourly", HOUR)]).run_once(conn)
    assert run.enqueued == ()
    assert run.next_in is not None and 0 < run.next_in <= 3600
    now = db.db_now(conn, SCHEMA)
    nxt = every("hourly", HOUR).next_tick(now)
    assert abs(run.next_in - (nxt - now).total_seconds()) < 1.0
    (row,) = db.list_schedules(conn, SCHEMA)
    assert (row.name, row.type, row.every, row.cron, row.last_tick) == (
        "hourly", "t", HOUR, None, None,
    )  # fmt: skip


def test_after_downtime_the_most_recent_missed_tick_or_catch_up_of_them(conn: Conn) -> None:
    scheduler = Scheduler(SCHEMA, [every("one", HOUR), every("two", HOUR, catch_up=2)])
    assert scheduler.run_once(conn).enqueued == ()
    backdate(conn, timedelta(hours=5))
    run = scheduler.run_once(conn)
    now = db.db_now(conn, SCHEMA)
    hour = every("x", HOUR).due_ticks(now - HOUR, now)[0]  # the last full hour
    assert ticks_of(conn, list(run.enqueued)) == [
        ("periodic:one", hour), ("periodic:two", hour - HOUR), ("periodic:two", hour),
    ]  # fmt: skip
    stored = {r.name: r for r in db.list_schedules(conn, SCHEMA)}
    assert stored["one"].last_tick == hour and stored["one"].last_job_id in run.enqueued
    last_job = stored["one"].last_job_id
    assert last_job is not None
    job = db.get_job(conn, SCHEMA, last_job)
    assert (job.type, job.payload, job.priority) == ("t", {"s": "one"}, 0)
    # nothing is due again until the next hour
    assert scheduler.run_once(conn).enqueued == ()


def test_two_services_racing_enqueue_each_tick_once(dsn: str, conn: Conn) -> None:
    second = timedelta(seconds=1)
    schedules = [
        every("a", second),
        every("b", second, catch_up=3),
        Schedule.make("c", type="t", cron="* * * * * *"),
    ]
    services = [Scheduler(SCHEMA, schedules) for _ in range(2)]
    conns = [db.connect(dsn) for _ in range(2)]
    try:
        for service, c in zip(services, conns, strict=True):
            service.run_once(c)
        barrier = threading.Barrier(2)  # reusable: both threads pass it once per round

        def race(i: int) -> tuple[JobId, ...]:
            barrier.wait()
            return services[i].run_once(conns[i]).enqueued

        for _ in range(25):
            # the backdating makes ticks due again: their earlier jobs must be gone, as if run
            # (an unfinished job holds its tick's unique_key)
            conn.execute("DELETE FROM pgq.job")
            backdate(conn, timedelta(seconds=6))

            ids = [i for enqueued in in_threads(2, race) for i in enqueued]
            ticks = ticks_of(conn, ids)
            assert len(ticks) == len(ids)
            assert [t for t, n in Counter(ticks).items() if n > 1] == [], "a tick enqueued twice"
            per = Counter(origin for origin, _ in ticks)
            # each schedule got its missed ticks (one more if a new second began meanwhile)
            assert 1 <= per["periodic:a"] <= 2 and 1 <= per["periodic:c"] <= 2, per
            assert 3 <= per["periodic:b"] <= 4, per
    finally:
        for c in conns:
            c.close()


def test_a_tick_passes_once_even_after_its_job_is_gone(conn: Conn) -> None:
    # a supervisor whose view is stale retries a tick another already enqueued, whose job has
    # since finished (so its unique_key no longer holds): last_tick refuses it, and older ticks
    schedule = every("s", HOUR)
    Scheduler(SCHEMA, [schedule]).run_once(conn)
    tick = schedule.next_tick(db.db_now(conn, SCHEMA)) - 3 * HOUR
    assert db.enqueue_tick(conn, SCHEMA, schedule, tick) is not None
    conn.execute("DELETE FROM pgq.job")
    assert db.enqueue_tick(conn, SCHEMA, schedule, tick) is None
    assert db.enqueue_tick(conn, SCHEMA, schedule, tick - HOUR) is None
    assert db.enqueue_tick(conn, SCHEMA, schedule, tick + HOUR) is not None


def test_a_schedule_removed_from_the_code_stops_firing(conn: Conn) -> None:
    Scheduler(SCHEMA, [every("kept", HOUR), every("gone", HOUR)]).run_once(conn)
    backdate(conn, timedelta(hours=3))
    run = Scheduler(SCHEMA, [every("kept", HOUR)]).run_once(conn)
    assert [origin for origin, _ in ticks_of(conn, list(run.enqueued))] == ["periodic:kept"]
    stored = {r.name: r.last_tick for r in db.list_schedules(conn, SCHEMA)}
    assert set(stored) == {"kept", "gone"} and stored["gone"] is None


def test_cli_schedules_lists_the_database_and_with_app_the_code(dsn: str, conn: Conn) -> None:
    Scheduler(SCHEMA, [every("every-second", HOUR), every("gone", HOUR)]).run_once(conn)
    backdate(conn, timedelta(hours=2))
    (job_id,) = Scheduler(SCHEMA, [every("gone", HOUR)]).run_once(conn).enqueued

    result = run_cli(["schedules", "--json"], dsn)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    doc = json.loads(result.stdout)
    by_name = {s["name"]: s for s in doc["schedules"]}
    assert list(by_name) == ["every-second", "gone"]
    gone = by_name["gone"]
    assert (gone["type"], gone["when"], gone["timezone"], gone["status"]) == (
        "t", "every 1:00:00", "UTC", None,
    )  # fmt: skip
    assert gone["last_job_id"] == str(job_id)
    assert gone["last_tick"] < gone["next_run"]
    assert by_name["every-second"]["last_tick"] is None

    app = "pgq_periodic_app:registry"
    result = run_cli(["schedules", "--json", "--app", app], dsn)
    assert result.returncode == 0, result.stderr
    status = {s["name"]: (s["status"], s["when"]) for s in json.loads(result.stdout)["schedules"]}
    assert status == {
        "every-second": ("ok", "every 0:00:01"),  # the code's definition wins
        "every-second-x3": ("not declared", "every 0:00:01"),
        "gone": ("not in code", "every 1:00:00"),
    }

    table = run_cli(["schedules", "--app", app], dsn)
    assert table.returncode == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "WHEN", "TYPE", "TIMEZONE"]
    assert [ln.split()[0] for ln in lines] == ["every-second", "every-second-x3", "gone"]
    assert lines[2].endswith("not in code") and str(job_id) in lines[2]


def test_an_invalid_schedule_is_exit_2_with_one_line(dsn: str) -> None:
    for args in (["schedules", "--app"], ["run", "--app"]):
        result = run_cli([*args, "pgq_periodic_bad_app:registry"], dsn)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: periodic 'broken': invalid cron '0 25 * * *'")
        assert result.stderr.count("\n") == 1
