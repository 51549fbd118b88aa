"""The dashboard's pure parts: the throughput chart's geometry, the jobs page's query string."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from pgq_supervisor.db.web_rows import ThroughputMinute
from pgq_supervisor.jobs import JobState
from pgq_supervisor.web.charts import CHART_MINUTES, TOP_ROOM, WINDOWS, bars, chart
from pgq_supervisor.web.filters import ago, when_text
from pgq_supervisor.web.jobs_view import JobsQuery, payload_filter

NOW = datetime(2026, 11, 30, 13, 45, 30, tzinfo=UTC)


def test_the_chart_puts_each_minute_at_its_place_scaled_to_the_busiest() -> None:
    this_minute = NOW.replace(second=0)
    minutes = [
        ThroughputMinute(this_minute, 30, 10),  # the busiest: full height, rightmost
        ThroughputMinute(this_minute - timedelta(minutes=59), 20, 0),  # leftmost
        ThroughputMinute(this_minute - timedelta(minutes=60), 99, 99),  # an hour ago: left out
    ]
    c = chart(minutes[:2], NOW)
    plot = c.height - 20
    room = plot - TOP_ROOM  # the tallest bar's height: under the scale's label
    assert c.top == 40
    right = [b for b in c.bars if b.x == (CHART_MINUTES - 1) * c.bar_width]
    assert sorted(b.kind for b in right) == ["failed", "succeeded"]
    ok = next(b for b in right if b.kind == "succeeded")
    bad = next(b for b in right if b.kind == "failed")
    assert ok.height == pytest.approx(room * 30 / 40) and ok.y + ok.height == pytest.approx(plot)
    assert bad.y + bad.height == pytest.approx(ok.y) and bad.y == pytest.approx(TOP_ROOM)
    (left,) = [b for b in c.bars if b.x == 0]
    assert left.height == pytest.approx(room / 2) and "20 succeeded, 0 failed" in left.title
    assert len(chart(minutes, NOW).bars) == 3  # the minute before the hour is not drawn
    assert chart([], NOW).bars == [] and chart([], NOW).top == 0


def test_the_jobs_query_reads_filters_and_the_keyset() -> None:
    job = uuid.uuid4()
    q = JobsQuery.parse(
        {"state": "failed", "type": "mail", "q": f" {job} ", "since": "2026-11-30T10:00",
         "before": f"{NOW.isoformat()},{job}"}
    )  # fmt: skip
    assert q.state is JobState.FAILED and q.type == "mail" and q.job_id == job
    assert q.since == datetime(2026, 11, 30, 10, 0, tzinfo=UTC) and q.until is None
    assert q.before == (NOW, job)
    assert JobsQuery.parse({"q": "order-42"}).job_id is None
    assert JobsQuery.parse({}) == JobsQuery(raw=JobsQuery.parse({}).raw)


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"state": "done"}, "invalid state: 'done'"),
        ({"type": "a b"}, "invalid job type 'a b'"),
        ({"since": "yesterday"}, "invalid since: 'yesterday' is not a date and time"),
        ({"before": "garbage"}, "invalid before"),
    ],
)
def test_a_bad_query_names_what_is_wrong(params: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        JobsQuery.parse(params)


def test_ages_and_stored_times_read_short() -> None:
    assert [ago(s) for s in (None, 3, 300, 10_000, 500_000)] == ["-", "3 s", "5 min", "3 h", "6 d"]
    assert when_text("2026-11-30T13:45:30.5+00:00") == "2026-11-30 13:45:30"
    assert when_text(None) == "-" and when_text("not a time") == "not a time"


def test_a_windows_buckets_line_up_with_the_databases_date_bin() -> None:
    """24h: half hours from 2000-01-01 UTC; the newest is the one `now` falls in."""
    day = WINDOWS["24h"]
    newest = NOW.replace(minute=30, second=0)  # 13:45:30 falls in the 13:30 bucket
    c = bars([ThroughputMinute(newest, 5, 1), ThroughputMinute(newest - timedelta(hours=24), 9, 9)],
             NOW, day)  # fmt: skip
    assert day.bars == 48 and c.top == 6  # the bucket before the first bar is not scaled for
    right = [b for b in c.bars if b.x == (day.bars - 1) * c.bar_width]
    assert {b.kind for b in right} == {"succeeded", "failed"} and len(c.bars) == 2
    assert "2026-11-30 13:30 UTC: 5 succeeded, 1 failed" in right[0].title


@pytest.mark.parametrize(
    ("search", "contains"),
    [
        ("payload.user_id = 42", '{"user_id":42}'),
        ('payload.user_id="42"', '{"user_id":"42"}'),
        ("payload.a.b = true", '{"a":{"b":true}}'),
        ("payload.kind = mail", '{"kind":"mail"}'),  # not JSON: text
        ("payload.note = x = y", '{"note":"x = y"}'),  # the first "=" splits
        ("order-42", None),  # a unique key
        ("payload", None),
    ],
)
def test_the_search_reads_payload_fields_as_json_containment(
    search: str, contains: str | None
) -> None:
    assert payload_filter(search) == contains
    q = JobsQuery.parse({"q": search})
    assert q.payload == contains and (q.unique_key is None) == (contains is not None)


def test_a_payload_search_without_a_value_is_refused() -> None:
    with pytest.raises(ValueError, match="has no value after '='"):
        JobsQuery.parse({"q": "payload.user_id = "})
