"""OpenTelemetry, when it is there: from the span that enqueued a job to the attempts that ran it.

Enqueue records the W3C traceparent of the current span with the job (`job.trace_context`);
each attempt runs its handler inside a span of its own ("pgq.run <type>", kind CONSUMER)
linked to it, with the job's id, type, attempt and outcome as attributes, so spans the
handler starts are children of the attempt's.

Nothing happens without the `otel` extra (opentelemetry-api; checked once, at import), and
nothing is recorded unless the application configured a tracer provider before the worker
started (checked once per worker, by `attempt_tracer`): enqueue then finds no recording
span, and the worker no tracer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pgq_supervisor.jobs import Job

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed: every function here does nothing
    HAVE_OTEL = False
else:
    HAVE_OTEL = True
    _PROPAGATOR = TraceContextTextMapPropagator()

# records an attempt's outcome as the handler's run ended ("succeeded", "error", "permanent")
# and the error's message, if any
Outcome = Callable[[str, str | None], None]


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, or None (no OpenTelemetry, no span, or a span
    that is not sampled: an unsampled one would only link attempts to nothing)."""
    if not HAVE_OTEL:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def attempt_tracer() -> Tracer | None:
    """The tracer for attempt spans, or None when OpenTelemetry is not installed or no tracer
    provider is configured (the API's default proxy records nothing)."""
    if not HAVE_OTEL:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("pgq_supervisor")


@contextmanager
def attempt_span(tracer: Tracer, job: Job) -> Iterator[Outcome]:
    """A span for one attempt of `job`, current while the handler runs, linked to the span
    that enqueued it. Yields the function that records the attempt's outcome."""
    links = []
    if job.trace_context is not None:
        carrier = {"traceparent": job.trace_context}
        linked = trace.get_current_span(_PROPAGATOR.extract(carrier))
        if linked.get_span_context().is_valid:
            links.append(trace.Link(linked.get_span_context()))
    attributes: dict[str, str | int] = {
        "pgq.job.id": str(job.id),
        "pgq.job.type": job.type,
        "pgq.job.attempt": job.attempt,
    }
    with tracer.start_as_current_span(
        f"pgq.run {job.type}",
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,  # a handler's exception is the job's outcome, never raised
    ) as span:

        def outcome(value: str, error: str | None) -> None:
            span.set_attribute("pgq.job.outcome", value)
            if error is not None:
                span.set_status(trace.StatusCode.ERROR, error)

        yield outcome
