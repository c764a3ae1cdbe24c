"""What the mapping produces: finished spans as plain, resource-free values.

A :class:`SpanRecord` is everything OpenTelemetry needs to know about one
finished span, and nothing about where it goes: no resource, no scope, no SDK
object. Keeping the mapping's output in plain immutable values lets tests
compare spans directly and lets the transport turn them into SDK spans in one
place. They are named tuples rather than frozen dataclasses because an export
of a million events makes a few hundred thousand of them, and a frozen
dataclass costs three times as much to construct.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

from opentelemetry.trace import SpanKind, StatusCode

from agentrt.events import Event

__all__ = [
    "SPAN_NAMES",
    "AttributeValue",
    "SpanEventRecord",
    "SpanRecord",
    "SpanStartSource",
]

#: Attribute values the mapping produces.
AttributeValue = str | int | bool

#: The only span names the mapping ever uses (nothing model-chosen names a span).
SPAN_NAMES = (
    "agentrt.run",
    "agentrt.step",
    "agentrt.model",
    "agentrt.approval",
    "agentrt.tool.late",
    "agentrt.event",
)


class SpanEventRecord(NamedTuple):
    """A span event: a point in time on a span, with its own attributes."""

    name: str
    time_ns: int
    attributes: Mapping[str, AttributeValue]


class SpanRecord(NamedTuple):
    """One finished span. Ids are integers (128-bit trace, 64-bit span);
    ``parent_span_id`` is None for a run span, the root of its trace.
    ``status_description`` is set only with ``StatusCode.ERROR``."""

    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    kind: SpanKind
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttributeValue]
    events: tuple[SpanEventRecord, ...]
    status_code: StatusCode
    status_description: str

    def identity(self) -> tuple[str, int, int, int | None]:
        """(name, trace, span, parent): what must match across restarts."""
        return (self.name, self.trace_id, self.span_id, self.parent_span_id)


class SpanStartSource(Protocol):
    """Read-only access to the events before the cursor, for a mapper that
    meets a run in the middle (it started after a restart) and rebuilds the
    run by replaying them. A read-only agentrt store satisfies it.

    ``list_events_after(run_id, seq, limit)`` returns at most ``limit`` of
    the run's events with seq above ``seq``, in seq order. It is the capped
    page read a follower uses, so a hostile database cannot make the exporter
    load a huge row, and the replayed events are the ones the first pass saw.
    """

    def list_events_after(self, run_id: str, seq: int, limit: int) -> list[Event]: ...
