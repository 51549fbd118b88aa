"""Settings validation: flags, then PGQ_* environment, then .env. No database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pgq_supervisor.errors import ConfigError
from pgq_supervisor.settings import Settings, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No PGQ_* variable and no .env file from the developer's machine leaks in."""
    for name in [*Settings.model_fields, "schema"]:
        monkeypatch.delenv(f"PGQ_{name.upper()}", raising=False)
    monkeypatch.chdir(tmp_path)
    yield


def test_dead_after_must_cover_three_heartbeats() -> None:
    with pytest.raises(ConfigError, match=r"dead_after \(10 s\) must be at least 3 x"):
        load_settings(heartbeat_interval=5, dead_after=10)
    ok = load_settings(heartbeat_interval=5, dead_after=15)
    assert (ok.heartbeat_interval, ok.dead_after) == (5, 15)


def test_defaults_are_valid() -> None:
    s = load_settings()
    assert s.dead_after >= 3 * s.heartbeat_interval
    assert s.procs >= 1
    assert (s.db_schema, s.log_format, s.log_level, s.types) == ("pgq", "text", "info", None)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"procs": 0}, "procs"),
        ({"heartbeat_interval": 0}, "heartbeat_interval"),
        ({"poll_interval": -1}, "poll_interval"),
        ({"claim_batch": 201}, "claim_batch"),
        ({"concurrency": 0}, "concurrency"),
        ({"release_unstarted_after": 0}, "release_unstarted_after"),
        ({"release_unstarted_after": "nan"}, "release_unstarted_after"),
        ({"release_unstarted_after": 3601}, "release_unstarted_after"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"log_format": "xml"}, "log_format"),
        ({"log_level": "verbose"}, "log_level"),
        ({"db_schema": ""}, "schema"),
        ({"db_schema": "x" * 64}, "schema"),
    ],
)
def test_bad_values_raise_config_error_naming_the_setting(
    flags: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError, match=f"invalid setting {named}:"):
        load_settings(**flags)


def test_none_flags_mean_not_given() -> None:
    assert load_settings(procs=None, heartbeat_interval=None).heartbeat_interval == 1.0


def test_flags_beat_environment_beat_dotenv(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".env").write_text("PGQ_PROCS=3\nPGQ_LOG_LEVEL=debug\nPGQ_POLL_INTERVAL=7\n")
    monkeypatch.setenv("PGQ_PROCS", "5")
    monkeypatch.setenv("PGQ_LOG_LEVEL", "WARNING")
    s = load_settings(procs=9)
    assert s.procs == 9  # flag
    assert s.log_level == "warning"  # environment, case-folded
    assert s.poll_interval == 7  # .env


def test_environment_is_validated_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGQ_HEARTBEAT_INTERVAL", "20")
    with pytest.raises(ConfigError, match="dead_after"):
        load_settings()


def test_types_and_schema_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGQ_TYPES", '["a", "b"]')
    monkeypatch.setenv("PGQ_SCHEMA", "tenant_1")
    s = load_settings()
    assert s.types == ["a", "b"]
    assert s.db_schema == "tenant_1"
    assert load_settings(types="x, y,,z").types == ["x", "y", "z"]
    assert load_settings(db_schema="other").db_schema == "other"


def test_retention_accepts_durations() -> None:
    s = load_settings(retain_succeeded="7d", retain_failed="12h")
    assert (s.retain_succeeded, s.retain_failed) == (7 * 86400, 12 * 3600)
    with pytest.raises(ConfigError, match="retain_succeeded"):
        load_settings(retain_succeeded="soon")


def test_retention_is_bounded_by_default_and_forever_keeps_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGQ_RETAIN_SUCCEEDED", raising=False)
    monkeypatch.delenv("PGQ_RETAIN_FAILED", raising=False)
    s = load_settings()
    assert (s.retain_succeeded, s.retain_failed) == (86400, 7 * 86400)
    s = load_settings(retain_succeeded="forever", retain_failed="None")
    assert (s.retain_succeeded, s.retain_failed) == (None, None)
    monkeypatch.setenv("PGQ_RETAIN_FAILED", "forever")
    assert load_settings().retain_failed is None


def test_unparsable_dsn_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid setting dsn"):
        load_settings(dsn="host=a port")
    assert load_settings(dsn="postgresql://u@h/db").dsn == "postgresql://u@h/db"


def test_listen_dsn_and_prepare_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert (s.listen_dsn, s.prepare_threshold) == (None, 5)  # listen_dsn unset: the dsn
    monkeypatch.setenv("PGQ_PREPARE_THRESHOLD", "None")
    monkeypatch.setenv("PGQ_LISTEN_DSN", "host=db port=5432")
    s = load_settings()
    assert (s.listen_dsn, s.prepare_threshold) == ("host=db port=5432", None)
    assert load_settings(prepare_threshold="0").prepare_threshold == 0
    with pytest.raises(ConfigError, match="invalid setting prepare_threshold"):
        load_settings(prepare_threshold="-1")
    with pytest.raises(ConfigError, match="invalid setting listen_dsn"):
        load_settings(listen_dsn="host=a port")
