"""The supervisor's periodic services, each a `run_once` on its own timer, and the connection
they share.

    timer          runs every                        does
    poll           poll_interval ± 20 %              wake one idle child: the fallback behind NOTIFY
    due-jobs       poll_interval ± 20 %, and after   ask when the earliest delayed job comes due ─┐
                   each due-wake                                                                 │
    due-wake       once, when that job comes due,    wake one child                         ◀──────┘
                   or sooner: a pgq_job_due for a
                   served type (schema/0026) brings
                   it forward to that job's time
    rate-due       poll_interval ± 20 %, and soon    ask when a full rate window of a served  ─┐
                   after a child finds nothing       type frees a start (only with rates)      │
    rate-wake      once, when that start frees       wake one child (nothing notifies it) ◀───┘
    rescue         rescue_interval ± 20 %, or 200    Rescuer: reclaim jobs with stale heartbeats
                   times its last rounds' (> 20 ms)
    orphans        0.5 s ± 20 %, or 200 times its    Rescuer: reclaim the jobs of supervisors
                   last rounds' (> 20 ms)            whose session lock was freed (they died)
    queue-metrics  poll_interval ± 20 %, or 200      QueueMetrics: the pgq_jobs_* gauges (only
                   times its last rounds' (> 20 ms)  when metrics are served: metrics_port)
    vacuum-health  30 s                              VacuumHealth: the pgq_vacuum_* gauges (only
                                                     when metrics are served)
    prune          60 s; poll_interval while behind  Pruner: finished jobs past retention
    partitions     60 s ± 20 %                       Partitions: the job table's partitions
                                                     made ahead, dropped whole when done
    activity       summary_interval                  ActivitySummary: the INFO line of ended jobs
    unserved       5 x poll_interval ± 20 %          UnservedWatch: warn once about a type
                                                     enqueued that no live supervisor serves
                                                     (reads the supervisor table only when
                                                     one was heard; supervisor/unserved.py)
    periodic       at the next tick; poll_interval   Scheduler: enqueue the due ticks of the
                   at most                           schedules of the served types (once each)
    cancel-check   poll_interval ± 20 %              the supervisor's: children's jobs cancelled
                                                     while pgq_job_cancel was missed (cancels.py)
    aging          half the shortest aging step      Ager: raise the priority of pending jobs
                   ± 20 %                            that waited (only with aging types)
    claim-floor    1 s ± 20 %                        ClaimFloors: while a snapshot holds vacuum's
                                                     horizon back, claims start past the entries
                                                     of the jobs claimed since (schema/0022)

Time is the supervisor's injected clock. A run that fails with DatabaseError is logged and its
timer tries again at its next time: no service keeps another from running. The database
services share the control connection, which reconnects with backoff; while it is down they
wait for its next attempt instead of each logging the same failure. Only `activity` and
`cancel-check` run during shutdown.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pgq_supervisor import db
from pgq_supervisor.aging import Aging
from pgq_supervisor.backoff import Backoff
from pgq_supervisor.errors import DatabaseError, DatabaseUnavailable
from pgq_supervisor.jobs import stale_after
from pgq_supervisor.periodic import Schedule
from pgq_supervisor.settings import Settings
from pgq_supervisor.supervisor.maintenance.activity import ActivitySummary
from pgq_supervisor.supervisor.maintenance.aging import Ager
from pgq_supervisor.supervisor.maintenance.floors import LOOK_EVERY as FLOOR_EVERY
from pgq_supervisor.supervisor.maintenance.floors import ClaimFloors
from pgq_supervisor.supervisor.maintenance.partitions import PARTITIONS_EVERY, Partitions
from pgq_supervisor.supervisor.maintenance.rescuer import LOOK_EVERY, Rescuer
from pgq_supervisor.supervisor.maintenance.retention import PRUNE_EVERY, Pruner
from pgq_supervisor.supervisor.maintenance.scheduler import Scheduler
from pgq_supervisor.supervisor.maintenance.vacuum_health import EVERY, VacuumHealth
from pgq_supervisor.supervisor.metrics import Metrics, QueueMetrics
from pgq_supervisor.supervisor.unserved import UnservedWatch

log = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], float]
JITTER = 0.2  # ± fraction of an interval: supervisors started together drift apart
# The part of the loop's time the timers whose statements read every running (or pending) job
# may take (Timer.max_share): while they run no child is woken, so a round that took 0.2 s is
# followed by the next 40 s later, not 7.5 s.
SCAN_SHARE = 0.005
SLOW = 0.02  # a run this short is never capped: it delays a wake-up less than a claim takes
RECENT = 3  # a capped timer is put off by the least time of its last RECENT runs
RATE_DUE = "rate-due"
DUE_WAKE = "due-wake"


class ControlDown(DatabaseUnavailable):
    """The control connection is down and waits for its next attempt at `retry_at`."""

    def __init__(self, message: str, retry_at: float) -> None:
        super().__init__(message)
        self.retry_at = retry_at


class ControlConnection:
    """The supervisor's own connection: it settles dead children's jobs and runs the database
    services. Connects when first used, again after a failure, no sooner than its backoff."""

    def __init__(
        self,
        dsn: str,
        *,
        clock: Clock,
        rng: random.Random,
        prepare_threshold: int | None = db.PREPARE_THRESHOLD,
    ) -> None:
        self._dsn = dsn
        self._prepare_threshold = prepare_threshold
        self._conn: db.Conn | None = None
        self.backoff = Backoff(initial=0.25, maximum=5.0, clock=clock, rng=rng)
        self.ok = False  # the last use succeeded (readiness)

    def run(self, use: Callable[[db.Conn], T]) -> T:
        """`use(connection)`. Raises ControlDown while there is no connection, DatabaseError
        if `use` fails; a failure closes the connection, and the next use opens a new one."""
        conn = self._connection()
        try:
            result = use(conn)
        except DatabaseError:
            self.ok = False
            self.close()
            raise
        self.ok = True
        return result

    def connect(self) -> bool:
        """Connect now unless connected or backing off; False if it could not. (Readiness,
        `ok`, waits for a use that succeeds.)"""
        try:
            self._connection()
        except ControlDown:
            return False
        return True

    def _connection(self) -> db.Conn:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if not self.backoff.ready():
            raise ControlDown("control connection down", self.backoff.retry_at)
        try:
            self._conn = db.connect(
                self._dsn,
                application_name="pgq-supervisor",
                prepare_threshold=self._prepare_threshold,
            )
        except DatabaseError as exc:
            self.ok = False
            delay = self.backoff.failed()
            log.warning("control connection failed, retrying in %.1f s: %s", delay, exc)
            raise ControlDown(str(exc), self.backoff.retry_at) from exc
        self.backoff.succeeded()
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None


@dataclass
class Timer:
    """Runs `action(now)` at `next_at`, then every `interval` seconds ± `jitter` (a fraction);
    an action may return a sooner time, in seconds. Without an interval it runs once each time
    it is armed. `in_shutdown`: it keeps running while the supervisor drains. `max_share`: the
    part of the loop's time its runs may take at most: when each of its last RECENT runs took
    longer than `max_share` of its interval, and longer than SLOW, the next one is put further
    off (the least of those times / `max_share`)."""

    name: str
    action: Callable[[float], float | None]
    interval: float | None
    jitter: float = JITTER
    next_at: float = 0.0
    in_shutdown: bool = False
    max_share: float | None = None
    took: tuple[float, ...] = ()  # its last RECENT runs' times (only with max_share)

    def arm(self, at: float) -> None:
        self.next_at = at


class Timers:
    def __init__(
        self, timers: Sequence[Timer], rng: random.Random, clock: Clock | None = None
    ) -> None:
        """`clock` times the runs of the timers with a `max_share` (without it, none is capped)."""
        self.by_name = {t.name: t for t in timers}
        self.rng = rng
        self.clock = clock

    def add(self, timer: Timer) -> None:
        self.by_name[timer.name] = timer

    def run_soon(self, name: str, at: float) -> None:
        """Bring timer `name` forward to `at` if it has one and is due later."""
        timer = self.by_name.get(name)
        if timer is not None and timer.next_at > at:
            timer.arm(at)

    def next_at(self, *, stopping: bool) -> float:
        """When the earliest timer that may run is due (inf if none)."""
        times = [t.next_at for t in self.by_name.values() if t.in_shutdown or not stopping]
        return min(times, default=float("inf"))

    def run_due(self, now: float, *, stopping: bool = False) -> list[str]:
        """Run every timer due at `now`, in order; returns the names of those that ran."""
        ran = []
        for timer in self.by_name.values():
            if now < timer.next_at or (stopping and not timer.in_shutdown):
                continue
            ran.append(timer.name)
            try:
                sooner = timer.action(now)
            except ControlDown as exc:
                timer.next_at = exc.retry_at  # its connection logged why
                continue
            except DatabaseError as exc:
                log.warning("%s failed: %s", timer.name, exc)
                sooner = None
            if timer.interval is None:
                timer.next_at = float("inf")
                continue
            spread = self.rng.uniform(1 - timer.jitter, 1 + timer.jitter) if timer.jitter else 1.0
            delay = timer.interval * spread
            delay = delay if sooner is None else min(delay, sooner)
            if timer.max_share is not None and self.clock is not None:
                timer.took = (*timer.took[1 - RECENT :], self.clock() - now)
                # the least of its last rounds: one slow round (a cold cache, a busy moment)
                # puts nothing off; a snapshot held back makes every round slow
                cost = min(timer.took) if len(timer.took) == RECENT else 0.0
                if cost > max(SLOW, delay * timer.max_share):
                    log.debug(
                        "%s took %.3f s: next in %.1f s", timer.name, cost, cost / timer.max_share
                    )
                    delay = cost / timer.max_share
            timer.next_at = now + delay
        return ran


@dataclass
class Services:
    """What the timers run, apart from their timers; built from the settings or given by a
    test. `queue_metrics` is None when no metrics are served (the gauges are read only by a
    scrape, and their queries read every pending and running row), `pruner` when nothing is
    to be pruned, `scheduler` when there are no schedules to run, `partitions` when a test
    leaves the job table's partitions alone."""

    rescuer: Rescuer
    queue_metrics: QueueMetrics | None
    pruner: Pruner | None
    activity: ActivitySummary
    scheduler: Scheduler | None = None
    vacuum: VacuumHealth | None = None
    unserved: UnservedWatch | None = None
    partitions: Partitions | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        metrics: Metrics,
        now: float,
        schedules: Sequence[Schedule] = (),
        *,
        types: Sequence[str] = (),
    ) -> Services:
        """`types`: the served ones; with them, the watch for types no supervisor serves."""
        return cls(
            rescuer=Rescuer(
                settings.db_schema, settings.dead_after, quiet=1.5 * settings.heartbeat_interval
            ),
            queue_metrics=(
                QueueMetrics(settings.db_schema, metrics, stale_after(settings.heartbeat_interval))
                if settings.metrics_port is not None
                else None
            ),
            pruner=Pruner.from_settings(settings),
            activity=ActivitySummary(settings.summary_interval, now),
            scheduler=Scheduler(settings.db_schema, schedules) if schedules else None,
            vacuum=(
                VacuumHealth(settings.db_schema, metrics)
                if settings.metrics_port is not None
                else None
            ),
            unserved=(
                UnservedWatch(
                    settings.db_schema,
                    types,
                    grace=5 * settings.poll_interval,
                    stale_after=stale_after(settings.heartbeat_interval),
                )
                if types
                else None
            ),
            partitions=Partitions.from_settings(settings),
        )


def maintenance_timers(
    settings: Settings,
    types: Sequence[str],
    services: Services,
    control: ControlConnection,
    metrics: Metrics,
    wake: Callable[[int], None],
    *,
    now: float,
    rng: random.Random,
    clock: Clock,
    rated: Sequence[str] = (),
    me: str | None = None,
    agings: Mapping[str, Aging] | None = None,
) -> Timers:
    """The supervisor's timers (see the module docstring). All but `activity` are due at once.
    `rated`: the served types with a rate; without any, no rate timers. `me`: this
    supervisor's registered id; without it, no look for supervisors that died. `agings`: the
    served types with priority aging; without any, no aging timer."""
    poll = settings.poll_interval

    def due_woken(now: float) -> None:
        wake(1)
        # and ask at once for the next one: a pgq_job_due brings the wake-up forward to its
        # job, and only the database knows what comes due after it
        due_jobs_timer.arm(now)

    due_wake = Timer(DUE_WAKE, due_woken, None, next_at=float("inf"))
    rate_wake = Timer("rate-wake", lambda now: wake(1), None, next_at=float("inf"))

    def due_jobs(now: float) -> None:
        due = control.run(lambda conn: db.next_due(conn, settings.db_schema, types))
        due_wake.arm(float("inf") if due is None else now + max(0.0, due))

    due_jobs_timer = Timer("due-jobs", due_jobs, poll)

    def rate_due(now: float) -> None:
        due = control.run(lambda conn: db.rate_next_due(conn, settings.db_schema, rated))
        # counted from the answer, not from `now`: the database measured `due` from its
        # statement's start, later than `now`; a wake-up that came early would claim in the
        # full window, find nothing, and the next question would find no full window to wait
        # for (nothing would wake a child until the poll)
        rate_wake.arm(float("inf") if due is None else clock() + max(0.0, due))

    def rescue(now: float) -> None:
        rescued = control.run(services.rescuer.run_once)
        metrics.rescued.inc(len(rescued.ended))

    def rescue_orphans(me: str) -> Callable[[float], None]:
        def run(now: float) -> None:
            rescued = control.run(lambda conn: services.rescuer.run_orphans(conn, me))
            metrics.rescued.inc(len(rescued.ended))

        return run

    def refresh(gauges: QueueMetrics | VacuumHealth) -> Callable[[float], None]:
        def run(now: float) -> None:
            control.run(gauges.run_once)

        return run

    def prune(pruner: Pruner) -> Callable[[float], float | None]:
        def run(now: float) -> float | None:
            pruned = control.run(pruner.run_once)
            metrics.record_pruned(pruned.succeeded, pruned.failed)
            return poll if pruned.more else None  # behind: again a poll later, as before

        return run

    def periodic(scheduler: Scheduler) -> Callable[[float], float | None]:
        def run(now: float) -> float | None:
            # the next tick, by the database's clock; the poll interval caps the wait, so a
            # supervisor whose clock drifts from the database's re-reads it often enough
            return control.run(scheduler.run_once).next_in

        return run

    def summarize(now: float) -> None:
        services.activity.run_once(now)

    summary = settings.summary_interval
    timers = [
        Timer("poll", lambda now: wake(1), poll),
        due_jobs_timer,
        due_wake,
        *([Timer(RATE_DUE, rate_due, poll), rate_wake] if rated else []),
        # the rescues read every running job's entry in job_running_idx, and every entry of
        # the jobs that ran since the oldest snapshot a session holds (vacuum may not remove
        # them): beside a snapshot held ten minutes at 1,500 jobs/s, about 0.2 s a round, in
        # which no child is woken. Capped at SCAN_SHARE of the loop's time.
        Timer("rescue", rescue, settings.rescue_every, max_share=SCAN_SHARE),
        *(
            [Timer("orphans", rescue_orphans(me), LOOK_EVERY, max_share=SCAN_SHARE)]
            if me is not None
            else []
        ),
    ]
    if types:
        floors = ClaimFloors(settings.db_schema, types)

        def floor(now: float) -> None:
            control.run(floors.run_once)

        timers.append(Timer("claim-floor", floor, FLOOR_EVERY))
    if services.queue_metrics is not None:
        # its queries read every pending and running job, as the rescue does
        queue_metrics = refresh(services.queue_metrics)
        timers.append(Timer("queue-metrics", queue_metrics, poll, max_share=SCAN_SHARE))
    if services.vacuum is not None:
        timers.append(Timer("vacuum-health", refresh(services.vacuum), EVERY))
    if services.pruner is not None:
        timers.append(Timer("prune", prune(services.pruner), PRUNE_EVERY, jitter=0.0))
    if (parts := services.partitions) is not None:

        def partition(now: float) -> None:
            control.run(parts.run_once)

        timers.append(Timer("partitions", partition, PARTITIONS_EVERY))
    if services.scheduler is not None:
        timers.append(Timer("periodic", periodic(services.scheduler), poll))
    if (watch := services.unserved) is not None:

        def unserved(now: float) -> None:
            control.run(lambda conn: watch.run_once(conn, now))

        timers.append(Timer("unserved", unserved, watch.grace))
    if agings:
        ager = Ager(settings.db_schema, agings)

        def age(now: float) -> None:
            control.run(ager.run_once)

        timers.append(Timer("aging", age, ager.interval))
    timers.append(
        Timer("activity", summarize, summary, jitter=0.0, next_at=now + summary, in_shutdown=True)
    )
    return Timers(timers, rng, clock)
