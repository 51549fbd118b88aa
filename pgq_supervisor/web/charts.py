"""Throughput charts as SVG geometry, drawn by the server: a stacked bar per bucket (succeeded
below, failed above), the newest rightmost. No database here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pgq_supervisor.db.web_rows import ThroughputMinute

CHART_MINUTES = 60
TOP_ROOM = 16  # above the tallest bar: the scale's label
# date_bin's origin in type_throughput: buckets start on whole multiples of their width from it
BUCKET_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Window:
    """A chart's time span: `bucket` seconds a bar, `bars` bars."""

    name: str
    seconds: int
    bucket: int
    label: str

    @property
    def bars(self) -> int:
        return self.seconds // self.bucket


WINDOWS = {
    w.name: w
    for w in (
        Window("1h", 3600, 60, "per minute over the last hour"),
        Window("24h", 86400, 1800, "per half hour over the last 24 hours"),
        Window("7d", 7 * 86400, 4 * 3600, "per 4 hours over the last 7 days"),
    )
}


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    height: float
    kind: str  # "succeeded" | "failed"
    title: str


@dataclass
class Chart:
    """A chart's bars; `top` is the largest bucket's total, `start` the left edge's label."""

    width: int = 720
    height: int = 160
    bars: list[Bar] = field(default_factory=list)
    top: int = 0
    bar_width: float = 0.0
    start: str = "-60 min"
    unit: str = "min"


def chart(minutes: list[ThroughputMinute], now: datetime) -> Chart:
    """Bars for the last CHART_MINUTES minutes up to `now` (the database's clock)."""
    return bars(minutes, now, WINDOWS["1h"])


def bars(buckets: Sequence[ThroughputMinute], now: datetime, window: Window) -> Chart:
    """Bars for `window` up to `now` (the database's clock), one per bucket; buckets of
    width `window.bucket` start on whole multiples of it from BUCKET_ORIGIN."""
    c = Chart(start=f"-{window.name}", unit={60: "min", 1800: "30 min"}.get(window.bucket, "4 h"))
    step = timedelta(seconds=window.bucket)
    current = BUCKET_ORIGIN + ((now - BUCKET_ORIGIN) // step) * step
    first = current - (window.bars - 1) * step
    # a window's oldest bucket may start before its first bar: it is not drawn nor scaled for
    by_start = {b.minute.astimezone(UTC): b for b in buckets if b.minute >= first}
    c.top = max((b.succeeded + b.failed for b in by_start.values()), default=0)
    c.bar_width = c.width / window.bars
    plot = c.height - 20  # room for the axis labels
    scale = (plot - TOP_ROOM) / c.top if c.top else 0.0
    for i in range(window.bars):
        start = current - (window.bars - 1 - i) * step
        b = by_start.get(start.astimezone(UTC))
        if b is None:
            continue
        x = i * c.bar_width
        label = f"{start:%Y-%m-%d %H:%M} UTC: {b.succeeded} succeeded, {b.failed} failed"
        ok_h, bad_h = b.succeeded * scale, b.failed * scale
        if b.succeeded:
            c.bars.append(Bar(x, plot - ok_h, ok_h, "succeeded", label))
        if b.failed:
            c.bars.append(Bar(x, plot - ok_h - bad_h, bad_h, "failed", label))
    return c
