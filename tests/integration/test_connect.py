"""pgq.connect() / pgq.connect_async(): the queue's database as the CLI finds it, a DSN given,
else PGQ_DSN (the embedded server without either: tests/docs, the README's hello world)."""

from __future__ import annotations

import asyncio

import pytest

import pgq_supervisor as pgq


def test_connect_reaches_pgq_dsn_and_a_given_dsn(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGQ_DSN", dsn)
    with pgq.connect(autocommit=True) as conn:
        job_id = pgq.enqueue(conn, "t")
        assert conn.autocommit
    monkeypatch.setenv("PGQ_DSN", "postgresql://nobody@127.0.0.1:1/none")
    with pgq.connect(dsn) as conn:  # the argument wins
        assert not conn.autocommit  # psycopg's default
        assert pgq.get_job(conn, job_id).type == "t"


def test_connect_async_reaches_the_same_database(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGQ_DSN", dsn)

    async def main() -> str:
        async with await pgq.connect_async(autocommit=True) as conn:
            job_id = await pgq.enqueue_async(conn, "t")
            row = await (await conn.execute("SELECT type FROM pgq.job WHERE id = %s",
                                            (job_id,))).fetchone()  # fmt: skip
            return str(row[0]) if row else ""

    assert asyncio.run(main()) == "t"


def test_a_bad_pgq_dsn_is_a_config_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGQ_DSN", "not a dsn at all")
    with pytest.raises(pgq.ConfigError, match="dsn"):
        pgq.connect()
