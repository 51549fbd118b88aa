"""Registry: handler registration and payload validation. No database."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from datetime import timedelta

import pydantic
import pytest

import pgq_supervisor as pgq
from pgq_supervisor.errors import ConfigError
from pgq_supervisor.jobs import JobId, JsonValue, LeaseToken
from pgq_supervisor.limits import Rate
from pgq_supervisor.registry import (
    DEFAULT_MAX_RETRY_COUNT,
    UNHANDLED,
    ClaimPolicy,
    Handler,
    RetryPolicy,
)


class Resize(pydantic.BaseModel):
    path: str
    width: int = pydantic.Field(gt=0)


def _only(registry: pgq.Registry) -> Handler:
    (handler,) = registry.handlers.values()
    return handler


def test_handler_defaults_and_what_it_asks_for() -> None:
    registry = pgq.Registry()

    @registry.handler("plain")
    def plain(payload: dict[str, int]) -> None:
        return None

    @registry.handler("full", timeout=60, max_retry_count=5)
    def full(payload: Resize, job: pgq.Job, conn: object) -> None:
        return None

    assert registry.types == ["full", "plain"]
    p, f = registry.get("plain"), registry.get("full")
    assert (p.wants_job, p.wants_conn, p.timeout, p.max_retry_count) == (
        False,
        False,
        None,
        DEFAULT_MAX_RETRY_COUNT,
    )
    assert (f.wants_job, f.wants_conn, f.timeout, f.max_retry_count) == (True, True, 60, 5)
    # the decorator gives back a TaskHandle of the function, unchanged, which calls through
    assert f.func is full.func and p.func is plain.func and plain.type == "plain"
    assert plain({"a": 1}) is None and full.__name__ == "full"


@pytest.mark.parametrize("type_", ["", "x" * 101, "two words"])
def test_bad_type_name_is_a_config_error(type_: str) -> None:
    registry = pgq.Registry()
    with pytest.raises(ConfigError, match="invalid job type"):
        registry.handler(type_)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"timeout": 0}, "timeout must be > 0"),
        ({"timeout": -1.5}, "timeout must be > 0"),
        ({"max_retry_count": -1}, "max_retry_count must be >= 0"),
        ({"concurrency": 0}, "concurrency must be an integer >= 1"),
        ({"concurrency": 2.5}, "concurrency must be an integer >= 1"),
        ({"concurrency": True}, "concurrency must be an integer >= 1"),
    ],
)
def test_bad_handler_options_are_config_errors(options: dict[str, float], match: str) -> None:
    registry = pgq.Registry()
    with pytest.raises(ConfigError, match=match):
        registry.handler("t", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "rate",
    [(20, 0), (20, 0.0), (20, timedelta(0)), (0, 1), (-5, 1), (20, -1), (1.5, 1), (True, 1),
     ("20", 1), (20, "1s"), (20, float("nan")), (20, float("inf")), (20,), 20, (1, 2, 3)],
)  # fmt: skip
def test_an_invalid_rate_is_one_config_error_at_registration(rate: object) -> None:
    registry = pgq.Registry()
    with pytest.raises(ConfigError, match=r"handler 't': rate must be \(max_starts, period\)"):
        registry.handler("t", rate=rate)  # type: ignore[arg-type]
    assert registry.handlers == {}


def test_a_rate_takes_seconds_or_a_timedelta() -> None:
    registry = pgq.Registry()
    registry.handler("a", rate=(20, 1))(lambda payload: None)
    registry.handler("b", rate=(5, timedelta(minutes=2)))(lambda payload: None)
    registry.handler("c", rate=[3, 0.5])(lambda payload: None)  # type: ignore[arg-type]
    registry.handler("d")(lambda payload: None)
    assert registry.rates(["a", "b", "c", "d", "unknown"]) == {
        "a": Rate(20, 1.0),
        "b": Rate(5, 120.0),
        "c": Rate(3, 0.5),
    }


def test_a_type_cannot_have_two_handlers() -> None:
    registry = pgq.Registry()

    @registry.handler("t")
    def first(payload: dict[str, int]) -> None:
        return None

    with pytest.raises(ConfigError, match="two handlers"):

        @registry.handler("t")
        def second(payload: dict[str, int]) -> None:
            return None

    assert registry.get("t").func is first.func


def test_handler_signature_is_checked() -> None:
    registry = pgq.Registry()

    def no_params() -> None:
        return None

    def keyword_only(*, payload: dict[str, int]) -> None:
        return None

    # mypy rejects these at the decorator already; typed loosely, the runtime check is seen
    loose: list[tuple[Callable[..., None], str]] = [(no_params, "none"), (keyword_only, "kw")]
    for bad, name in loose:
        with pytest.raises(ConfigError, match="payload as its first parameter"):
            registry.handler(name)(bad)

    with pytest.raises(ConfigError, match=r"unknown parameters \['session'\]"):

        @registry.handler("extra")
        def extra(payload: dict[str, int], session: object) -> None:
            return None

    assert registry.handlers == {}


def test_unknown_type_lookup_names_the_type() -> None:
    with pytest.raises(pgq.InvalidInput, match="no handler for job type 'nope'"):
        pgq.Registry().get("nope")


def test_payload_is_validated_into_its_model() -> None:
    registry = pgq.Registry()

    @registry.handler("resize")
    def resize(payload: Resize) -> None:
        return None

    handler = _only(registry)
    assert handler.validate({"path": "a.png", "width": 3}) == Resize(path="a.png", width=3)
    with pytest.raises(pgq.InvalidInput, match=r"payload for 'resize' is invalid: width:"):
        handler.validate({"path": "a.png", "width": 0})
    with pytest.raises(pgq.InvalidInput, match=r"path: Field required \(\+1 more\)"):
        handler.validate({})


def test_dict_annotation_is_validated_and_no_annotation_passes_through() -> None:
    registry = pgq.Registry()

    @registry.handler("typed")
    def typed(payload: dict[str, int]) -> None:
        return None

    @registry.handler("untyped")
    def untyped(payload):  # type: ignore[no-untyped-def]
        return None

    assert registry.get("typed").validate({"a": 1}) == {"a": 1}
    with pytest.raises(pgq.InvalidInput, match="typed"):
        registry.get("typed").validate({"a": "not a number"})
    with pytest.raises(pgq.InvalidInput):
        registry.get("typed").validate([1, 2])
    anything: list[JsonValue] = [1, "two", None]
    assert registry.get("untyped").validate(anything) is anything


def test_unresolvable_annotation_is_a_config_error() -> None:
    registry = pgq.Registry()
    with pytest.raises(ConfigError, match="cannot resolve annotations"):

        @registry.handler("t")
        def handler(payload: NoSuchModel) -> None:  # type: ignore[name-defined]  # noqa: F821
            return None


def test_custom_backoff_is_kept() -> None:
    registry = pgq.Registry()

    def fixed(attempt: int, rng: random.Random) -> float:
        return 7.0

    @registry.handler("t", retry=fixed)
    def handler(payload: dict[str, int]) -> None:
        return None

    assert registry.get("t").backoff(3, random.Random(0)) == 7.0


def test_default_backoff_is_the_default_retry_policy() -> None:
    registry = pgq.Registry()

    @registry.handler("t")
    def handler(payload: dict[str, int]) -> None:
        return None

    assert registry.get("t").backoff == RetryPolicy()


def _job(type_: str, timeout: float | None) -> pgq.Job:
    return pgq.Job(
        id=JobId(uuid.uuid4()),
        type=type_,
        payload={},
        priority=0,
        attempt=1,
        max_retry_count=3,
        timeout=timeout,
        bundle_id=None,
        lease=LeaseToken(uuid.uuid4()),
    )


def test_policy_answers_timeout_and_retry_delay_for_its_type() -> None:
    registry = pgq.Registry()

    def linear(attempt: int, rng: random.Random) -> float:
        return 2.0 * attempt

    @registry.handler("slow", timeout=60, max_retry_count=5, retry=linear)
    def slow(payload: dict[str, int]) -> None:
        return None

    policy = registry.policy("slow")
    assert (policy.timeout, policy.max_retry_count) == (60, 5)
    assert policy.timeout_for(_job("slow", None)) == 60
    assert policy.timeout_for(_job("slow", 5.0)) == 5.0  # the job's own timeout wins
    assert policy.retry_delay(3, random.Random(0)) == 6.0
    # the supervisor asks the handler: the same policy answers
    assert registry.handlers["slow"].backoff(3, random.Random(0)) == 6.0


def test_a_type_without_handler_has_no_timeout_of_its_own() -> None:
    registry = pgq.Registry()
    assert registry.policy("nobody") is UNHANDLED
    assert UNHANDLED.timeout_for(_job("nobody", None)) is None
    assert UNHANDLED.timeout_for(_job("nobody", 3.0)) == 3.0


def test_claim_policy_pairs_each_type_with_its_retry_budget() -> None:
    registry = pgq.Registry()

    @registry.handler("a")
    def a(payload: dict[str, int]) -> None:
        return None

    @registry.handler("b", max_retry_count=0)
    def b(payload: dict[str, int]) -> None:
        return None

    assert registry.claim_policy(["b", "a"]) == ClaimPolicy(
        ("b", "a"), (0, DEFAULT_MAX_RETRY_COUNT)
    )
    with pytest.raises(pgq.InvalidInput, match="nobody"):
        registry.claim_policy(["a", "nobody"])


def test_a_handler_may_cap_its_type_and_be_async() -> None:
    registry = pgq.Registry()

    @registry.handler("fetch", concurrency=5)
    async def fetch(payload: dict[str, int]) -> None:
        return None

    @registry.handler("plain")
    def plain(payload: dict[str, int]) -> None:
        return None

    assert registry.handlers["fetch"].concurrency == 5 and registry.handlers["fetch"].is_async
    assert registry.handlers["plain"].concurrency is None
    assert not registry.handlers["plain"].is_async
