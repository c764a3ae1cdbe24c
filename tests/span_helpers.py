"""Reading the span records a mapper produced, for the mapping tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrt.events import Event
from agentrt_otel import SpanMapper, SpanRecord, SpanStartSource
from agentrt_otel.testing import EventStream, StreamSource


def spans_of(stream: EventStream, mapper: SpanMapper | None = None) -> list[SpanRecord]:
    return (mapper or SpanMapper()).map_all(stream.events)


def full(span: SpanRecord) -> tuple[Any, ...]:
    """Everything a span is: what must not change across restarts."""
    return (*span.identity(), span.kind, span.start_ns, span.end_ns,
            tuple(sorted(span.attributes.items())),
            tuple((e.name, e.time_ns, tuple(sorted(e.attributes.items()))) for e in span.events),
            span.status_code, span.status_description)


def one_pass(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    return sorted(map(full, SpanMapper().map_all(events)))


def restarted(events: Sequence[Event], cuts: Sequence[int],
              source: SpanStartSource | None = None) -> list[SpanRecord]:
    """The spans of a fresh mapper per segment, each starting after a cut
    (a clean restart on a saved cursor), with the store as source."""
    source = source if source is not None else StreamSource(list(events))
    bounds = [0, *sorted(set(cuts)), len(events)]
    out: list[SpanRecord] = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        out.extend(SpanMapper(source).map_all(events[lo:hi]))
    return out


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
