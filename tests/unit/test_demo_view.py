"""The demo's live view: counts from the database turned into lines and terminal writes."""

from __future__ import annotations

import io

from pgq_supervisor.demo import PLAIN_EVERY, TYPES, LiveView, plain_line, render, tally
from pgq_supervisor.jobs import JobState


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


ROWS = [
    ("demo.fib", JobState.SUCCEEDED, 7, 0.01, 0),
    ("demo.fib", JobState.RUNNING, 2, None, 0),
    ("demo.flaky", JobState.PENDING, 3, None, 4),
    ("demo.flaky", JobState.SUCCEEDED, 5, 0.0, 6),
    ("demo.flaky", JobState.FAILED, 1, 0.0, 4),  # 4 failed attempts, the last not retried
    ("demo.part", JobState.CANCELLED, 1, None, 0),
]


def test_tally_counts_states_and_retries_per_type() -> None:
    counts = tally(ROWS)
    assert list(counts)[: len(TYPES)] == list(TYPES)
    fib, flaky, part, report = (counts[t] for t in TYPES)
    assert (fib.done, fib.running, fib.pending, fib.finished) == (7, 2, 0, 7)
    assert (flaky.done, flaky.pending, flaky.failed, flaky.retried) == (5, 3, 1, 4 + 6 + 3)
    assert flaky.finished == 6 and part.finished == 1 and part.done == 0
    assert report.finished == 0


def test_render_has_a_header_and_one_row_per_type() -> None:
    lines = render(tally(ROWS), elapsed=2.0, total=28, procs=4)
    assert len(lines) == 3 + len(TYPES)
    assert "2.0 s" in lines[0] and "7 jobs/s" in lines[0] and "4 procs" in lines[0]
    assert lines[0].endswith("] 14/28") and "#" * 12 + "." * 12 in lines[0]
    # more running than procs, said why (issue 36)
    assert lines[1] == "  2 running on 4 procs (up to 200 in flight per child, run one at a time)"
    assert lines[2].split() == ["type", "done", "running", "pending", "retried", "failed"]
    assert lines[4].split() == ["demo.flaky", "5", "0", "3", "13", "1"]
    one = render(tally(ROWS), elapsed=0.0, total=28, procs=1, claim_batch=10, concurrency=4)
    assert "- jobs/s  1 proc  [" in one[0]  # nothing measured yet: no "0 jobs/s"
    assert one[1] == "  2 running on 1 proc (up to 10 in flight per child, run up to 4 at a time)"
    line = plain_line(tally(ROWS), elapsed=2.0, total=28)
    assert line == "progress 2.0 s: 14/28 finished  running 2  pending 3  retried 13  failed 1"


def test_terminal_view_redraws_in_place_and_restores_the_cursor() -> None:
    out = Terminal()
    view = LiveView(out)
    view.show(["a", "bb"], "plain", 0.0)
    first = out.getvalue()
    assert first == "\x1b[?25la\x1b[K\nbb\x1b[K\n"
    view.show(["c", "dd"], "plain", 0.25)
    assert out.getvalue()[len(first) :] == "\x1b[2A\rc\x1b[K\ndd\x1b[K\n"
    view.close()
    assert out.getvalue().endswith("\x1b[?25h") and "plain" not in out.getvalue()


def test_piped_view_prints_a_plain_line_every_few_seconds_and_the_last_one() -> None:
    out = io.StringIO()
    view = LiveView(out)
    for tick in range(int(PLAIN_EVERY * 4) + 1):  # a quarter of a second apart
        view.show(["view"], f"line {tick}", tick / 4)
    view.show(["view"], "final", PLAIN_EVERY * 1.1, final=True)
    view.close()
    assert out.getvalue().splitlines() == ["line 0", f"line {int(PLAIN_EVERY * 4)}", "final"]
