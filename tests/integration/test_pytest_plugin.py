"""The pytest plugin in a user's suite (run by pytester in a subprocess, so the plugin is
loaded through its entry point as a user's pytest loads it): a sync test, an anyio test, a
test inside a transaction, each on its own fresh schema."""

from __future__ import annotations

import textwrap

import pytest

from tests.readme import blocks

pytest_plugins = ["pytester"]

USER_SUITE = """
import asyncio
import os

import psycopg
import pytest

from tests.readme import blocks

import pgq_supervisor as pgq
from pgq_supervisor.testing import drain, drain_async

registry = pgq.Registry()


@registry.handler("double")
def double(payload: dict[str, int]) -> int:
    return payload["n"] * 2


@registry.handler("adouble")
async def adouble(payload: dict[str, int]) -> int:
    await asyncio.sleep(0)  # a real suspension on the drain's loop, not a wait
    return payload["n"] * 2


def test_sync(pgq_conn, pgq_schema):
    assert os.environ["PGQ_SCHEMA"] == pgq_schema
    job_id = pgq.enqueue(pgq_conn, "double", {"n": 2})
    assert drain(pgq_conn, registry).succeeded == 1
    assert pgq.get_job(pgq_conn, job_id).result == 4


def test_each_test_has_its_own_schema(pgq_conn):
    assert pgq.queue_stats(pgq_conn) == []  # test_sync's job is not here


@pytest.mark.anyio
async def test_in_an_event_loop(pgq_conn):
    job_id = pgq.enqueue(pgq_conn, "adouble", {"n": 3})
    assert (await drain_async(pgq_conn, registry)).succeeded == 1
    assert pgq.get_job(pgq_conn, job_id).result == 6


def test_in_a_transaction(pgq_dsn, pgq_conn):
    with psycopg.connect(pgq_dsn) as tx:  # the test's transaction, rolled back at the end
        job_id = pgq.enqueue(tx, "double", {"n": 5})
        assert drain(tx, registry).succeeded == 1
        assert pgq.get_job(tx, job_id).result == 10
        tx.rollback()
    assert pgq.queue_stats(pgq_conn) == []
"""


def test_a_users_suite_runs_on_the_plugins_fixtures(
    pytester: pytest.Pytester, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQ_TEST_DSN", dsn)
    monkeypatch.delenv("PGQ_SCHEMA", raising=False)
    pytester.makepyfile(test_user=textwrap.dedent(USER_SUITE))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4)


def test_without_a_dsn_the_fixture_says_what_to_set(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGQ_TEST_DSN", raising=False)
    monkeypatch.delenv("PGQ_DSN", raising=False)
    pytester.makepyfile(test_user="def test_x(pgq_conn):\n    pass\n")
    result = pytester.runpytest_subprocess("-q")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*set $PGQ_TEST_DSN, the pgq_dsn ini option or $PGQ_DSN*"])


NAMES_ITS_DATABASE = """
import pgq_supervisor as pgq

def test_x(pgq_dsn, pgq_conn):
    assert pgq_dsn == {dsn!r}
    assert pgq.queue_stats(pgq_conn) == []
"""
# a DSN that cannot work, to show it was not the one chosen
NOWHERE = "host=127.0.0.1 port=1 dbname=nowhere connect_timeout=1"


def test_pgq_dsn_is_the_fallback(
    pytester: pytest.Pytester, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36: with only $PGQ_DSN set (as for the app and the supervisor), the fixtures use it;
    $PGQ_TEST_DSN and the ini option still come first."""
    monkeypatch.delenv("PGQ_TEST_DSN", raising=False)
    monkeypatch.delenv("PGQ_SCHEMA", raising=False)
    monkeypatch.setenv("PGQ_DSN", dsn)
    pytester.makepyfile(test_user=NAMES_ITS_DATABASE.format(dsn=dsn))
    pytester.runpytest_subprocess("-q").assert_outcomes(passed=1)
    monkeypatch.setenv("PGQ_DSN", NOWHERE)
    monkeypatch.setenv("PGQ_TEST_DSN", dsn)
    pytester.runpytest_subprocess("-q").assert_outcomes(passed=1)
    monkeypatch.delenv("PGQ_TEST_DSN")
    pytester.makeini(f"[pytest]\npgq_dsn = {dsn}\n")
    pytester.runpytest_subprocess("-q").assert_outcomes(passed=1)


def test_the_ini_option_names_the_dsn(
    pytester: pytest.Pytester, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGQ_TEST_DSN", raising=False)
    monkeypatch.setenv("PGQ_DSN", NOWHERE)  # the ini option comes before it
    pytester.makeini(f"[pytest]\npgq_dsn = {dsn}\n")
    pytester.makepyfile(
        test_user="import pgq_supervisor as pgq\n"
        "def test_x(pgq_conn):\n    assert pgq.queue_stats(pgq_conn) == []\n"
    )
    pytester.runpytest_subprocess("-q").assert_outcomes(passed=1)


def test_the_readme_block_runs_as_written(
    pytester: pytest.Pytester, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (code,) = blocks("Testing with the pytest plugin", "python")
    monkeypatch.setenv("PGQ_TEST_DSN", dsn)
    pytester.makepyfile(test_readme=code)
    pytester.runpytest_subprocess("-q").assert_outcomes(passed=2)
