"""What leaves the process in its spans. Without ``[telemetry] capture_content``, no span carries
an exception's message or stack trace, or a status description: those can quote a prompt, a
file or a provider's answer (Temporal's tracing interceptor records an activity's failure
whole). The exception's type stays, so a failure is still seen and counted.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status

# The exception event's attributes that hold text of the failure's own.
CONTENT_ATTRIBUTES = frozenset({"exception.message", "exception.stacktrace"})


def content_free(span: ReadableSpan) -> ReadableSpan:
    """``span`` without exception messages, stack traces and status description."""
    events = [
        Event(
            e.name,
            {k: v for k, v in (e.attributes or {}).items() if k not in CONTENT_ATTRIBUTES},
            e.timestamp,
        )
        for e in span.events
    ]
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        events=events,
        attributes=span.attributes,
        links=span.links,
        kind=span.kind,
        status=Status(span.status.status_code),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class ContentFreeExporter(SpanExporter):
    """Hands ``inner`` every span ``content_free``."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([content_free(s) for s in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)
