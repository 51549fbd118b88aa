"""OpenTelemetry (issue 14, item 6): enqueue records the current span's traceparent, each
attempt runs in a span linked to it. In-process with the SDK's in-memory exporter; the paths
without OpenTelemetry (not installed, not configured) in a fresh interpreter each, since a
tracer provider, once set, stays for the process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import pgq_supervisor as pgq
from pgq_supervisor.db import Conn
from pgq_supervisor.testing import drain

NO_BACKOFF = pgq.RetryPolicy(base=0.0, cap=0.0)


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    yield memory
    provider.shutdown()  # later tests' spans go nowhere


def _traceparent(span: trace.Span) -> str:
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


def test_every_attempt_is_a_span_linked_to_the_enqueue(
    dsn: str, conn: Conn, exporter: InMemorySpanExporter
) -> None:
    registry = pgq.Registry()
    tracer = trace.get_tracer("test")

    @registry.handler("traced", retry=NO_BACKOFF, max_retry_count=3)
    def traced(payload: dict[str, int], job: pgq.Job) -> None:
        with tracer.start_as_current_span("inside"):  # the handler's own span
            if payload["fail"] and job.attempt == 1:
                raise RuntimeError("first attempt fails")

    async def enqueue_async() -> pgq.JobId:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await pgq.enqueue_async(aconn, "traced", {"fail": 0})

    with tracer.start_as_current_span("producer") as producer:
        ids = [
            pgq.enqueue(conn, "traced", {"fail": 1}),
            pgq.enqueue(conn, "traced", {"fail": 0}, unique_key="k1"),
            *pgq.enqueue_many(conn, [pgq.NewJob("traced", {"fail": 0}, unique_key="k2")]),
            *pgq.enqueue_many(conn, [pgq.NewJob("traced", {"fail": 0})] * 2),  # COPY
            asyncio.run(enqueue_async()),
        ]
        bundle = pgq.enqueue_bundle(conn, "b", [pgq.NewJob("traced", {"fail": 0})])
        in_bundle = conn.execute("SELECT id FROM pgq.job WHERE bundle_id = %s", (bundle.id,))
        ids += [row[0] for row in in_bundle.fetchall()]
    untraced = pgq.enqueue(conn, "traced", {"fail": 0})
    stored: dict[object, object] = dict(
        conn.execute("SELECT id, trace_context FROM pgq.job").fetchall()
    )
    assert {stored[i] for i in ids} == {_traceparent(producer)}
    assert stored[untraced] is None

    assert drain(conn, registry, batch=2).succeeded == len(ids) + 1
    spans = [s for s in exporter.get_finished_spans() if s.name == "pgq.run traced"]
    attempts = sorted(
        (
            (str(a["pgq.job.id"]), int(str(a["pgq.job.attempt"])), s)
            for s in spans
            if (a := s.attributes)
        ),
        key=lambda t: t[:2],
    )
    first = str(ids[0])
    assert [(a[0], a[1]) for a in attempts if a[0] == first] == [(first, 1), (first, 2)]
    assert len(attempts) == len(ids) + 2  # one span per attempt: the first job ran twice
    producer_context = producer.get_span_context()
    for job_id, attempt, span in attempts:
        assert span.kind is trace.SpanKind.CONSUMER
        attributes = dict(span.attributes or {})
        assert attributes["pgq.job.type"] == "traced"
        failed = job_id == first and attempt == 1
        assert attributes["pgq.job.outcome"] == ("error" if failed else "succeeded")
        assert span.status.is_ok is not failed
        links = [(link.context.trace_id, link.context.span_id) for link in span.links]
        want = (producer_context.trace_id, producer_context.span_id)
        assert links == ([] if job_id == str(untraced) else [want])
    inside = [s for s in exporter.get_finished_spans() if s.name == "inside"]
    assert {s.parent.span_id for s in inside if s.parent} == {
        s.context.span_id for _, _, s in attempts
    }, "the handler's spans are children of its attempt's"


def test_an_async_handler_attempt_is_a_span_too(conn: Conn, exporter: InMemorySpanExporter) -> None:
    """Async handlers (run on the child's loop with many in flight) go through the same hook."""
    registry = pgq.Registry()
    tracer = trace.get_tracer("test")

    @registry.handler("traced_async", retry=NO_BACKOFF, max_retry_count=0)
    async def traced_async(payload: dict[str, int]) -> None:
        await asyncio.sleep(0)  # a real suspension: the attempt's span spans an await
        if payload["fail"]:
            raise RuntimeError("it fails")

    with tracer.start_as_current_span("producer") as producer:
        ok = pgq.enqueue(conn, "traced_async", {"fail": 0})
        bad = pgq.enqueue(conn, "traced_async", {"fail": 1})
    assert drain(conn, registry).succeeded == 1
    spans = {
        str((s.attributes or {})["pgq.job.id"]): s
        for s in exporter.get_finished_spans()
        if s.name == "pgq.run traced_async"
    }
    assert set(spans) == {str(ok), str(bad)}
    assert (spans[str(ok)].attributes or {})["pgq.job.outcome"] == "succeeded"
    assert (spans[str(bad)].attributes or {})["pgq.job.outcome"] == "error"
    assert not spans[str(bad)].status.is_ok
    want = producer.get_span_context().span_id
    assert all([link.context.span_id for link in s.links] == [want] for s in spans.values())


SCRIPT = """
import sys
if sys.argv[2] == "absent":
    sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
import psycopg
import pgq_supervisor as pgq
from pgq_supervisor import tracing
from pgq_supervisor.testing import drain
registry = pgq.Registry()
registry.handler("t")(lambda payload: None)
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    if sys.argv[2] == "unconfigured":  # the API alone: its default tracer records nothing
        from opentelemetry import trace
        with trace.get_tracer("app").start_as_current_span("producer"):
            pgq.enqueue(conn, "t", {})
            pgq.enqueue_many(conn, [pgq.NewJob("t")] * 2)
    else:
        pgq.enqueue(conn, "t", {})
        pgq.enqueue_many(conn, [pgq.NewJob("t")] * 2)
    done = drain(conn, registry).succeeded
    contexts = conn.execute("SELECT count(trace_context) FROM pgq.job").fetchone()[0]
print(done, contexts, tracing.attempt_tracer())
"""


@pytest.mark.parametrize("otel", ["absent", "unconfigured"])
def test_without_opentelemetry_nothing_is_recorded_and_jobs_run(dsn: str, otel: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, dsn, otel], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "0", "None"]
