"""Reading the span records a mapper produced, for the mapping tests."""

from __future__ import annotations

from agentrt_otel import SpanMapper, SpanRecord
from agentrt_otel.testing import EventStream


def spans_of(stream: EventStream, mapper: SpanMapper | None = None) -> list[SpanRecord]:
    return (mapper or SpanMapper()).map_all(stream.events)


def named(spans: list[SpanRecord], name: str) -> list[SpanRecord]:
    return [s for s in spans if s.name == name]


def one(spans: list[SpanRecord], name: str) -> SpanRecord:
    found = named(spans, name)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def event_names(span: SpanRecord) -> list[str]:
    return [e.name for e in span.events]


def an_event(span: SpanRecord, name: str) -> dict[str, object]:
    found = [e for e in span.events if e.name == name]
    assert len(found) == 1, event_names(span)
    return dict(found[0].attributes)
