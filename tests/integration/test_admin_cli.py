"""The admin CLI as scripts and people use it: `python -m pgq_supervisor CMD` in a subprocess
against the test's database, checking stdout, the exit code and one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgq_supervisor as pgq
from pgq_supervisor import db
from pgq_supervisor.db import Conn
from pgq_supervisor.jobs import AttemptKind, JobId, JobState, JsonValue
from tests.support.db import claim_one, count_rows, finished, get
from tests.support.processes import run_cli

MISSING = "00000000-0000-4000-8000-000000000000"


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(list(args), dsn)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    assert result.stderr == ""
    return result.stdout


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    """The one JSON document the command printed (an object)."""
    out = ok(result)
    assert out.count("\n") == 1, "--json prints exactly one line"
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


def fails(result: subprocess.CompletedProcess[str], code: int, pattern: str) -> str:
    """The command failed with `code` and one error line matching `pattern`, nothing on stdout."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"errors are one line, got: {result.stderr!r}"
    assert lines[0].startswith("error: ")
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def running(conn: Conn, type_: str) -> JobId:
    job_id = pgq.enqueue(conn, type_, {})
    assert claim_one(conn, type_).id == job_id
    return job_id


def age_finished(conn: Conn, job_id: JobId, days: float) -> None:
    conn.execute(
        "UPDATE pgq.job SET stopped_at = now() - make_interval(days => %s) WHERE id = %s",
        (days, job_id),
    )


# ---- enqueue ----


def test_enqueue_prints_the_id_and_stores_the_options(dsn: str, conn: Conn) -> None:
    out = ok(cli(dsn, "enqueue", "resize", '{"path": "a.png"}', "--priority", "5"))
    job = get(conn, JobId(uuid.UUID(out.strip())))
    assert (job.type, job.payload, job.priority, job.state) == (
        "resize",
        {"path": "a.png"},
        5,
        JobState.PENDING,
    )
    assert job.origin == "cli"


def test_enqueue_start_in_delays_the_job_by_the_database_clock(dsn: str, conn: Conn) -> None:
    out = ok(cli(dsn, "enqueue", "later", "{}", "--start-in", "2h"))
    row = conn.execute(
        "SELECT extract(epoch FROM start_at - now()) FROM pgq.job WHERE id = %s",
        (uuid.UUID(out.strip()),),
    ).fetchone()
    assert row is not None and 7190 < row[0] <= 7200
    assert db.depth(conn, "pgq") == 0


def test_enqueue_unique_key_returns_the_holder(dsn: str, conn: Conn) -> None:
    first = ok(cli(dsn, "enqueue", "sync", "{}", "--unique-key", "user-7"))
    again = ok(cli(dsn, "enqueue", "sync", '{"x": 1}', "--unique-key", "user-7"))
    assert first == again
    assert count_rows(conn) == 1


def test_enqueue_concurrency_key(dsn: str, conn: Conn) -> None:
    out = ok(cli(dsn, "enqueue", "sync", "{}", "--concurrency-key", "customer:42"))
    assert get(conn, JobId(uuid.UUID(out.strip()))).concurrency_key == "customer:42"
    bad = cli(dsn, "enqueue", "sync", "{}", "--concurrency-key", "")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: concurrency_key must be a string of 1 to 200")
    assert count_rows(conn) == 1


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["enqueue", "t", "{not json"], r"payload is not valid JSON: .* column 2"),
        (["enqueue", "t", "[1, 2]"], r"payload must be a JSON object, got list"),
        (["enqueue", "has space", "{}"], r"invalid job type 'has space'"),
        (["enqueue", "x" * 101, "{}"], r"invalid job type"),
        (["enqueue", "t", "{}", "--start-in", "soon"], r"invalid duration 'soon'"),
        (["enqueue", "t", "{}", "--start-in=-5m"], r"invalid duration '-5m'"),
        (["enqueue", "t", "{}", "--priority", "high"], r"argument --priority: invalid int"),
        (["enqueue", "t"], r"required: payload"),
    ],
)
def test_enqueue_rejects_bad_input_with_exit_2(
    dsn: str, conn: Conn, args: list[str], pattern: str
) -> None:
    fails(cli(dsn, *args), 2, pattern)
    assert count_rows(conn) == 0


# ---- status ----


def test_status_counts_per_type_and_state(dsn: str, conn: Conn) -> None:
    finished(conn, "mail", JobState.SUCCEEDED)
    finished(conn, "mail", JobState.FAILED)
    running(conn, "mail")
    pgq.enqueue_many(conn, [pgq.NewJob("mail"), pgq.NewJob("mail")])
    pgq.enqueue(conn, "report", {}, start_at=db.db_now(conn, "pgq").replace(year=2999))
    conn.execute(
        "UPDATE pgq.job SET start_at = now() - interval '90 seconds'"
        " WHERE state = 'pending' AND type = 'mail'"
    )

    doc = ok_json(cli(dsn, "status", "--json"))
    by_type = {t["type"]: t for t in doc["types"]}
    mail, report = by_type["mail"], by_type["report"]
    assert (mail["pending"], mail["ready"], mail["delayed"], mail["running"]) == (2, 2, 0, 1)
    assert (mail["succeeded"], mail["failed"], mail["cancelled"]) == (1, 1, 0)
    assert 90 <= mail["oldest_ready_age"] < 120
    assert (report["pending"], report["ready"], report["delayed"]) == (1, 0, 1)
    assert report["oldest_ready_age"] is None
    total = doc["total"]
    assert (total["pending"], total["ready"], total["delayed"], total["succeeded"]) == (3, 2, 1, 1)

    table = ok(cli(dsn, "status")).splitlines()
    assert re.split(r"\s{2,}", table[0]) == [
        "TYPE",
        "READY",
        "DELAYED",
        "WAITING",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
        "OLDEST READY",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in table[1:]}
    assert rows["mail"][:7] == ["2", "0", "0", "1", "1", "1", "0"]
    assert re.fullmatch(r"1m[34]\ds", rows["mail"][7])
    assert rows["report"] == ["0", "1", "0", "0", "0", "0", "0", "-"]
    assert rows["TOTAL"][:7] == ["2", "1", "0", "1", "1", "1", "0"]


def test_status_shows_jobs_waiting_for_dependencies(dsn: str, conn: Conn) -> None:
    first = pgq.enqueue(conn, "etl")
    pgq.enqueue_many(conn, [pgq.NewJob("etl", depends_on=[first]) for _ in range(2)])
    (etl,) = ok_json(cli(dsn, "status", "--json"))["types"]
    assert (etl["pending"], etl["ready"], etl["delayed"], etl["waiting"]) == (3, 1, 0, 2)
    table = ok(cli(dsn, "status")).splitlines()
    assert table[1].split()[:5] == ["etl", "1", "0", "2", "0"]
    assert ok(cli(dsn, "depth")) == "1\n"


def judged(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`cli` judging supervisor rows stale only after 3 x 600 s: a row the test wrote stays
    live however slowly the commands start (a row an hour old is still stale)."""
    return run_cli(list(args), dsn, env={"PGQ_HEARTBEAT_INTERVAL": "600", "PGQ_DEAD_AFTER": "1800"})


def _supervisor(conn: Conn, id_: str, types: list[str]) -> None:
    """A supervisor's row as a live one writes it (schema/0010)."""
    db.register_supervisor(
        conn, "pgq", id=id_, host="h", pid=1, procs=1, types=types,
        started_at=db.db_now(conn, "pgq"), children=[],
    )  # fmt: skip


def test_status_names_pending_types_no_live_supervisor_serves(dsn: str, conn: Conn) -> None:
    """Issue 36: a misspelt type is not ordinary pending work that waits in silence."""
    pgq.enqueue(conn, "gret", {})
    assert ok(judged(dsn, "status")).splitlines()[2:] == [
        "no live supervisor is registered: 1 pending job waits for one"
    ]
    _supervisor(conn, "a", ["greet", "resize"])
    _supervisor(conn, "dead", ["gret"])  # its row went stale: it serves nothing
    conn.execute("UPDATE pgq.supervisor SET seen_at = now() - interval '1 hour' WHERE id = 'dead'")
    pgq.enqueue_many(conn, [pgq.NewJob("greet"), pgq.NewJob("gret"), pgq.NewJob("zzz")])
    finished(conn, "old", JobState.FAILED)  # nothing pending: not named
    lines = ok(judged(dsn, "status")).splitlines()
    assert [ln for ln in lines if ln.startswith("unserved")] == [
        "unserved: gret: 2 pending jobs, no live supervisor serves this type (did you mean greet?)",
        "unserved: zzz: 1 pending job, no live supervisor serves this type",
    ]
    assert lines[-1] == "served: greet, resize (1 live supervisor)"  # the names to compare
    doc = ok_json(judged(dsn, "status", "--json"))
    assert (doc["live_supervisors"], doc["served"]) == (1, ["greet", "resize"])
    assert doc["unserved"] == [
        {"type": "gret", "pending": 2, "did_you_mean": "greet"},
        {"type": "zzz", "pending": 1, "did_you_mean": None},
    ]
    _supervisor(conn, "b", ["gret", "zzz"])
    assert not any("unserved" in ln for ln in ok(judged(dsn, "status")).splitlines())
    assert ok_json(judged(dsn, "status", "--json"))["unserved"] == []


def test_status_of_an_empty_queue(dsn: str) -> None:
    assert ok(cli(dsn, "status")) == "no jobs\n"
    doc = ok_json(cli(dsn, "status", "--json"))
    assert doc["types"] == []
    assert doc["total"] == {
        "pending": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
        "ready": 0,
        "delayed": 0,
        "waiting": 0,
        "oldest_ready_age": None,
    }


# ---- depth ----


def test_depth_counts_ready_jobs_only(dsn: str, conn: Conn) -> None:
    pgq.enqueue_many(conn, [pgq.NewJob("a") for _ in range(3)] + [pgq.NewJob("b")])
    pgq.enqueue(conn, "a", {}, start_at=db.db_now(conn, "pgq").replace(year=2999))
    running(conn, "c")
    assert ok(cli(dsn, "depth")) == "4\n"
    assert ok(cli(dsn, "depth", "--type", "a")) == "3\n"
    assert ok(cli(dsn, "depth", "--type", "nothing-here")) == "0\n"
    assert ok_json(cli(dsn, "depth", "--type", "b", "--json")) == {"depth": 1, "type": "b"}


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["depth", "--type", "two words"], r"argument --type: invalid job type"),
        (["depth", "--type", ""], r"argument --type: invalid job type"),
        (["depth", "extra"], r"unrecognized arguments: extra"),
    ],
)
def test_depth_bad_input_exit_2(dsn: str, args: list[str], pattern: str) -> None:
    fails(cli(dsn, *args), 2, pattern)


# ---- jobs ----


def test_jobs_lists_failed_jobs_with_attempts_and_last_error(dsn: str, conn: Conn) -> None:
    first = finished(conn, "mail", JobState.FAILED, error="SMTP refused\nTraceback: ...")
    second = finished(conn, "pay", JobState.FAILED, error="card declined")
    finished(conn, "mail2", JobState.SUCCEEDED)
    # a job that failed twice before: its history keeps both attempts
    third = pgq.enqueue(conn, "mail3", {}, max_retry_count=1)
    for attempt in (1, 2):
        job = claim_one(conn, "mail3", max_retry_count=1)
        db.end_attempt(
            conn, "pgq", [job.id], error=f"try {attempt}", kind=AttemptKind.ERROR, lease=job.lease
        )

    table = ok(cli(dsn, "jobs", "--state", "failed")).splitlines()
    assert table[0].split() == ["ID", "TYPE", "ATTEMPTS", "PROGRESS", "UPDATED", "LAST", "ERROR"]
    rows = {line.split()[0]: line for line in table[1:]}
    assert set(rows) == {str(first), str(second), str(third)}
    assert rows[str(first)].split()[1:3] == ["mail", "1"]
    assert rows[str(first)].rstrip().endswith("SMTP refused")  # first line only
    assert rows[str(third)].split()[1:3] == ["mail3", "2"]
    assert rows[str(third)].rstrip().endswith("try 2")

    doc = ok_json(cli(dsn, "jobs", "--json", "--type", "mail"))
    jobs = doc["jobs"]
    assert len(jobs) == 1
    assert jobs[0]["id"] == str(first)
    assert jobs[0]["error"] == "SMTP refused\nTraceback: ..."
    assert (jobs[0]["state"], jobs[0]["attempts"]) == ("failed", 1)

    assert len(ok_json(cli(dsn, "jobs", "--json", "--limit", "2"))["jobs"]) == 2


def test_jobs_in_other_states_and_when_there_are_none(dsn: str, conn: Conn) -> None:
    assert ok(cli(dsn, "jobs")) == "no failed jobs\n"
    job_id = running(conn, "work")
    (listed,) = ok_json(cli(dsn, "jobs", "--state", "running", "--json"))["jobs"]
    assert (listed["id"], listed["attempts"], listed["stopped_at"]) == (str(job_id), 1, None)
    assert ok(cli(dsn, "jobs", "--state", "cancelled", "--type", "work")) == (
        "no cancelled jobs of type work\n"
    )


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["jobs", "--state", "broken"], r"argument --state: invalid choice: 'broken'"),
        (["jobs", "--limit", "0"], r"argument --limit: must be an integer from 1"),
        (["jobs", "--limit", "ten"], r"argument --limit: must be an integer from 1"),
        (["jobs", "--type", "a\tb"], r"argument --type: invalid job type"),
    ],
)
def test_jobs_bad_input_exit_2(dsn: str, args: list[str], pattern: str) -> None:
    fails(cli(dsn, *args), 2, pattern)


# ---- retry ----


def test_retry_one_job_and_all_failed(dsn: str, conn: Conn) -> None:
    one = finished(conn, "a", JobState.FAILED)
    other_a = finished(conn, "a2", JobState.FAILED)
    b = finished(conn, "b", JobState.FAILED)

    assert ok(cli(dsn, "retry", str(one))) == f"job {one} is pending again\n"
    assert get(conn, one).state is JobState.PENDING
    assert get(conn, one).current_retry_count == 0

    assert ok_json(cli(dsn, "retry", "--all-failed", "--type", "b", "--json")) == {"retried": 1}
    assert get(conn, b).state is JobState.PENDING
    assert get(conn, other_a).state is JobState.FAILED
    assert ok(cli(dsn, "retry", "--all-failed")) == "retried 1 failed jobs\n"
    assert get(conn, other_a).state is JobState.PENDING
    assert ok(cli(dsn, "retry", "--all-failed")) == "retried 0 failed jobs\n"


def test_retry_refuses_a_running_job_unless_forced(dsn: str, conn: Conn) -> None:
    job_id = running(conn, "long")
    fails(cli(dsn, "retry", str(job_id)), 1, r"is running; pass --force")
    assert get(conn, job_id).state is JobState.RUNNING
    assert ok_json(cli(dsn, "retry", str(job_id), "--force", "--json")) == {
        "retried": 1,
        "id": str(job_id),
    }
    assert get(conn, job_id).state is JobState.PENDING


@pytest.mark.parametrize(
    ("args", "code", "pattern"),
    [
        (["retry", MISSING], 1, rf"no job with id {MISSING}"),
        (["retry", "not-a-uuid"], 2, r"argument id: not a job id \(a UUID\): 'not-a-uuid'"),
        (["retry"], 2, r"one of the arguments id --all-failed is required"),
        (["retry", MISSING, "--all-failed"], 2, r"not allowed with argument"),
        (["retry", MISSING, "--type", "a"], 2, r"--type goes with --all-failed"),
        (["retry", "--all-failed", "--force"], 2, r"--force goes with a job id"),
        (["retry", "--all-failed", "--type", "a b"], 2, r"invalid job type"),
    ],
)
def test_retry_bad_input(dsn: str, args: list[str], code: int, pattern: str) -> None:
    fails(cli(dsn, *args), code, pattern)


def test_retry_of_a_pending_job_is_refused(dsn: str, conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t", {})
    fails(cli(dsn, "retry", str(job_id)), 1, r"is already pending")


# ---- cancel ----


def test_cancel_a_pending_job(dsn: str, conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "t", {})
    assert ok(cli(dsn, "cancel", str(job_id))) == f"cancelled job {job_id}\n"
    assert get(conn, job_id).state is JobState.CANCELLED
    # twice: now it is cancelled, and only pending or running jobs can be
    fails(
        cli(dsn, "cancel", str(job_id)),
        1,
        r"is cancelled; only pending or running jobs can be cancelled",
    )
    other = pgq.enqueue(conn, "t", {})
    assert ok_json(cli(dsn, "cancel", str(other), "--json")) == {
        "cancelled": str(other),
        "was": "pending",
    }


def test_cancel_a_running_job_says_its_supervisor_stops_it(dsn: str, conn: Conn) -> None:
    job_id = running(conn, "t")
    worker = get(conn, job_id).worker_id
    assert ok(cli(dsn, "cancel", str(job_id))) == (
        f"cancelled job {job_id} (it was running on {worker}: its supervisor stops it)\n"
    )
    assert get(conn, job_id).state is JobState.CANCELLED
    other = running(conn, "t")
    assert ok_json(cli(dsn, "cancel", str(other), "--json")) == {
        "cancelled": str(other),
        "was": "running",
    }


def test_cancel_refuses_unknown_jobs(dsn: str, conn: Conn) -> None:
    fails(cli(dsn, "cancel", MISSING), 1, rf"^error: no job with id {MISSING}$")
    fails(cli(dsn, "cancel", "12345"), 2, r"not a job id")


# ---- purge ----


def test_purge_deletes_only_finished_jobs_older_than_given(dsn: str, conn: Conn) -> None:
    old_ok = finished(conn, "a", JobState.SUCCEEDED)
    old_failed = finished(conn, "b", JobState.FAILED)
    new_ok = finished(conn, "c", JobState.SUCCEEDED)
    old_cancelled = pgq.enqueue(conn, "d", {})
    pgq.cancel_job(conn, old_cancelled)
    pending = pgq.enqueue(conn, "e", {})
    for job_id in (old_ok, old_failed, old_cancelled):
        age_finished(conn, job_id, days=8)

    assert ok(cli(dsn, "purge", "--older-than", "30d")) == (
        "purged 0 jobs (succeeded, failed, cancelled) finished more than 30d ago\n"
    )
    assert ok_json(cli(dsn, "purge", "--older-than", "7d", "--state", "succeeded", "--json")) == {
        "purged": 1,
        "states": ["succeeded"],
        "older_than_seconds": 604800.0,
    }
    remaining = {r[0] for r in conn.execute("SELECT id FROM pgq.job").fetchall()}
    assert remaining == {old_failed, new_ok, old_cancelled, pending}

    out = ok(cli(dsn, "purge", "--older-than", "1w"))
    assert out.startswith("purged 2 jobs")
    remaining = {r[0] for r in conn.execute("SELECT id FROM pgq.job").fetchall()}
    assert remaining == {new_ok, pending}


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["purge", "--older-than", "7 days"], r"invalid duration '7 days'"),
        (["purge", "--older-than=-1d"], r"invalid duration '-1d'"),
        (["purge", "--older-than", "1d", "--state", "pending"], r"invalid choice: 'pending'"),
        (["purge"], r"the following arguments are required: --older-than"),
    ],
)
def test_purge_bad_input_exit_2(dsn: str, conn: Conn, args: list[str], pattern: str) -> None:
    done = finished(conn, "a", JobState.SUCCEEDED)
    age_finished(conn, done, days=30)
    fails(cli(dsn, *args), 2, pattern)
    assert count_rows(conn) == 1


# ---- the database itself ----


def test_a_database_that_is_not_migrated_is_one_line_exit_1(empty_dsn: str) -> None:
    fails(cli(empty_dsn, "status"), 1, r"schema 'pgq' is at version 0, need \d+: run .* migrate")


def test_a_database_that_does_not_exist_is_one_line_exit_1(dsn: str) -> None:
    missing = make_conninfo(dsn, dbname="pgq_no_such_database")
    fails(cli(missing, "depth"), 1, r"cannot connect to .*database does not exist")


# ---- show, progress ----


def test_show_a_job_in_full_with_its_attempts_and_progress(dsn: str, conn: Conn) -> None:
    job_id = pgq.enqueue(conn, "mail", {"to": "a@b"}, priority=3, max_retry_count=2)
    job = claim_one(conn, "mail", max_retry_count=2)
    db.end_attempt(conn, "pgq", [job.id], error="SMTP refused\nmore", kind=AttemptKind.ERROR,
                   lease=job.lease)  # fmt: skip
    conn.execute("UPDATE pgq.job SET start_at = now() WHERE id = %s", (job_id,))
    job = claim_one(conn, "mail", max_retry_count=2)
    db.set_progress(conn, "pgq", [(job_id, job.lease, '{"fraction": 0.42, "step": "send"}')])

    text = ok(cli(dsn, "show", str(job_id)))
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert lines["id"].split()[1] == str(job_id)
    assert lines["state"].split()[1] == "running"
    assert lines["priority"].split()[1] == "3"
    assert lines["attempt"].split()[1:] == ["2", "of", "3"]  # 1-based, as the dashboard's
    assert lines["progress"].split()[1] == "42%" and '"step": "send"' in lines["progress"]
    assert lines["payload"].endswith('{"to": "a@b"}')
    assert "attempts (1 failed):" in text
    assert any(line.strip().startswith("#1  error") and "SMTP refused" in line
               and "more" not in line for line in text.splitlines())  # fmt: skip

    table = ok(cli(dsn, "jobs", "--state", "running")).splitlines()
    assert table[1].split()[:4] == [str(job_id), "mail", "2", "42%"]

    doc = ok_json(cli(dsn, "show", str(job_id), "--json"))["job"]
    assert doc["id"] == str(job_id) and doc["state"] == "running"
    assert doc["progress"] == {"fraction": 0.42, "step": "send"}
    assert doc["payload"] == {"to": "a@b"} and doc["priority"] == 3
    assert [a["error"] for a in doc["attempts"]] == ["SMTP refused\nmore"]
    assert doc["started_at"] is not None and doc["stopped_at"] is None
    assert doc["result"] is None


TRACE = 'Traceback (most recent call last):\n  File "app.py", line 3, in send\nOSError: refused\n'


def _fail_once(conn: Conn, type_: str) -> JobId:
    """A job whose first attempt failed with a traceback, pending again."""
    job_id = pgq.enqueue(conn, type_, {}, max_retry_count=1)
    job = claim_one(conn, type_, max_retry_count=1)
    data: dict[str, JsonValue] = {"exception": "OSError", "traceback": TRACE}
    db.end_attempt(conn, "pgq", [job.id], error="OSError: refused", kind=AttemptKind.ERROR,
                   lease=job.lease, error_data=data)  # fmt: skip
    conn.execute("UPDATE pgq.job SET start_at = now() WHERE id = %s", (job_id,))
    return job_id


def test_a_success_clears_the_error_of_an_earlier_attempt(dsn: str, conn: Conn) -> None:
    """Issue 36: a succeeded job kept its first attempt's error_msg, and `show` printed it."""
    for succeed in (db.succeed, db.succeed_and_claim):
        job_id = _fail_once(conn, "mail")
        assert pgq.get_job(conn, job_id).error_msg == "OSError: refused"
        job = claim_one(conn, "mail", max_retry_count=1)
        if succeed is db.succeed:
            assert db.succeed(conn, "pgq", job.lease, [(job_id, "1")]) == {job_id}
        else:
            held, _ = db.succeed_and_claim(conn, "pgq", job.lease, [(job_id, "1")],
                                           worker_id="w", types=["none"], max_retry_counts=[0],
                                           limit=1)  # fmt: skip
            assert held == {job_id}
        rec = pgq.get_job(conn, job_id)
        assert (rec.state, rec.error_msg, rec.error_data) == (JobState.SUCCEEDED, None, None)
        kept = [(a.get("error"), a.get("traceback")) for a in rec.attempts if isinstance(a, dict)]
        assert kept == [("OSError: refused", TRACE)]
        text = ok(cli(dsn, "show", str(job_id)))
        assert "error_msg" not in text and "error_data" not in text
        assert "#1  error" in text and "OSError: refused" in text  # the history keeps it


def test_show_prints_a_traceback_as_lines(dsn: str, conn: Conn) -> None:
    job_id = _fail_once(conn, "mail")
    lines = ok(cli(dsn, "show", str(job_id))).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("error_data"))
    assert lines[at].split(None, 1) == ["error_data", '{"exception": "OSError"}']
    assert [line.strip() for line in lines[at + 1 : at + 5]] == [
        "traceback:",
        "Traceback (most recent call last):",
        'File "app.py", line 3, in send',
        "OSError: refused",
    ]
    assert lines[at + 3].startswith(" " * 8)  # indented under its key
    assert (
        ok_json(cli(dsn, "show", str(job_id), "--json"))["job"]["error_data"]["traceback"] == TRACE
    )


def test_show_says_when_no_live_supervisor_serves_a_pending_job(dsn: str, conn: Conn) -> None:
    """Issue 36: `show` of a job of a misspelt type says why it does not run."""
    typo = str(pgq.enqueue(conn, "gret", {}))
    assert "unserved: no live supervisor is registered: it waits for one" in ok(
        judged(dsn, "show", typo)
    )
    _supervisor(conn, "a", ["greet"])
    lines = [ln.split(None, 1) for ln in ok(judged(dsn, "show", typo)).splitlines()]
    at = lines.index(["state", "pending"])  # said under the state, as `held back` is
    assert lines[at + 1] == [
        "unserved:",
        "no live supervisor serves type 'gret' (did you mean 'greet'?);"
        " served: greet (1 live supervisor)",
    ]
    doc = ok_json(judged(dsn, "show", typo, "--json"))
    assert doc["unserved"] == {"live_supervisors": 1, "did_you_mean": "greet", "served": ["greet"]}
    served = str(pgq.enqueue(conn, "greet", {}))
    assert "unserved" not in ok(judged(dsn, "show", served))
    assert ok_json(judged(dsn, "show", served, "--json"))["unserved"] is None


def test_show_an_unknown_job_is_one_line_exit_1(dsn: str) -> None:
    fails(cli(dsn, "show", MISSING), 1, rf"^error: no job with id {MISSING}$")
    fails(cli(dsn, "show", "nope"), 2, r"not a job id")


def test_dashboard_indexes_are_opt_in_and_created_once(dsn: str, conn: Conn) -> None:
    """The Jobs page's two full indexes cost the drain (schema/0010): not migrated, created
    by `dashboard-indexes`, which may run again."""

    def present() -> set[str]:
        rows = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'pgq' AND tablename = 'job'"
        ).fetchall()
        return {r[0] for r in rows} & set(db.DASHBOARD_INDEXES)

    assert present() == set()
    assert ok_json(cli(dsn, "dashboard-indexes", "--json")) == {
        "created": list(db.DASHBOARD_INDEXES)
    }
    assert present() == set(db.DASHBOARD_INDEXES)
    assert "present" in ok(cli(dsn, "dashboard-indexes"))
    assert present() == set(db.DASHBOARD_INDEXES)
    payload = f"{db.PAYLOAD_INDEX}"
    assert payload in ok(cli(dsn, "dashboard-indexes", "--payload"))
    found = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'pgq' AND indexname = %s", (payload,)
    ).fetchone()
    assert found is not None and "gin (payload jsonb_path_ops)" in found[0]


def test_partition_converts_once_and_gives_up_on_a_held_table(conn: Conn, dsn: str) -> None:
    with psycopg.connect(dsn) as reader:  # a session holding the job table
        reader.execute("SELECT count(*) FROM pgq.job").fetchone()
        held = run_cli(["partition", "--lock-timeout", "0.2"], dsn)
    assert held.returncode == 1 and "stayed locked" in held.stdout, (held.stdout, held.stderr)
    assert conn.execute("SELECT pgq.job_partitioned()").fetchone() == (False,)
    done = run_cli(["partition"], dsn)
    assert done.returncode == 0 and "partitioned by enqueue time" in done.stdout, done.stderr
    again = run_cli(["partition"], dsn)
    assert again.returncode == 0 and "already" in again.stdout, again.stderr
