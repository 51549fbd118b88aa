-- pgq_supervisor schema, version 11 (issue 14): the W3C traceparent of the span that was
-- current when the job was enqueued, when OpenTelemetry is installed and a span was recording;
-- NULL otherwise. Each attempt's span links to it (pgq_supervisor/tracing.py). No index
-- includes it.
ALTER TABLE job ADD COLUMN trace_context text;
