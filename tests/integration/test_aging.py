"""Priority aging: the aging service raises a waiting job's priority one step per `every`
seconds of wait, up to the type's max_priority, once per step however many supervisors run it."""

from __future__ import annotations

from datetime import timedelta

import pytest

import pgq_supervisor as pgq
from pgq_supervisor.aging import Aging
from pgq_supervisor.db import Conn
from pgq_supervisor.errors import ConfigError
from pgq_supervisor.supervisor.maintenance.aging import Ager
from tests.support.db import get


def _wait(conn: Conn, job_id: pgq.JobId, seconds: float) -> None:
    conn.execute(
        "UPDATE pgq.job SET updated_at = now() - make_interval(secs => %s) WHERE id = %s",
        (seconds, job_id),
    )


def test_a_job_that_waited_a_step_rises_by_one_up_to_the_max(conn: Conn) -> None:
    ager = Ager("pgq", {"low": Aging(every=60, max_priority=2)})
    job = pgq.enqueue(conn, "low", priority=0)
    other = pgq.enqueue(conn, "plain", priority=0)
    fresh = pgq.enqueue(conn, "low", priority=0)
    assert ager.run_once(conn).raised == {"low": 0}  # nobody waited a step yet
    for expected in (1, 2, 2):
        _wait(conn, job, 61)
        _wait(conn, other, 61)
        ager.run_once(conn)
        assert get(conn, job).priority == expected
    # a second supervisor running it right after raises nothing: the wait starts again
    assert Ager("pgq", {"low": Aging(60, 2)}).run_once(conn).raised == {"low": 0}
    assert (get(conn, other).priority, get(conn, fresh).priority) == (0, 0)


def test_running_and_finished_jobs_are_not_raised(conn: Conn) -> None:
    from tests.support.db import claim_one

    job = pgq.enqueue(conn, "low")
    claim_one(conn, "low", worker_id="w")
    _wait(conn, job, 120)
    assert Ager("pgq", {"low": Aging(60, 5)}).run_once(conn).raised == {"low": 0}


@pytest.mark.parametrize("bad", [(0, 5), (-1, 5), (5, 1.5), "60", (timedelta(0), 1), (1, True)])
def test_aging_must_be_a_step_and_a_max_priority(bad: object) -> None:
    with pytest.raises(ConfigError, match="aging must be"):
        pgq.Registry().handler("x", aging=bad)  # type: ignore[arg-type]


def test_the_registry_names_the_types_with_aging() -> None:
    registry = pgq.Registry()
    registry.handler("a", aging=(timedelta(minutes=1), 10))(lambda payload: None)
    registry.handler("b")(lambda payload: None)
    assert registry.agings(["a", "b"]) == {"a": Aging(60.0, 10)}
    assert Ager("pgq", registry.agings(["a"])).interval == 30.0
