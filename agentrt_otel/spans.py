"""Span records turned into the SDK's ``ReadableSpan`` objects, directly.

The SDK normally makes spans through a tracer, an id generator and a span
processor. None of that is needed here: the mapping already knows every id,
time and attribute, and the batching processor drops spans when its queue
fills and hides export failures (DESIGN.md decision 6). So a finished
:class:`SpanRecord` becomes a ``ReadableSpan`` in one step, and the transport
hands a page of them to the exporter's ``export()``.

Instrumentation scope: the reference's ``github.com/joeylking/agent-runtime/
export/otel``, kept so a backend query on the scope finds the spans of either
runtime, which write the same ids and attributes for the same database.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, StatusCode, TraceFlags
from opentelemetry.trace.status import Status

from agentrt_otel.records import SpanRecord

__all__ = ["SCOPE", "SCOPE_NAME", "to_readable_span", "to_readable_spans"]

SCOPE_NAME = "github.com/joeylking/agent-runtime/export/otel"
SCOPE = InstrumentationScope(SCOPE_NAME)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_OK = Status(StatusCode.OK)


def to_readable_span(record: SpanRecord, resource: Resource) -> ReadableSpan:
    """One record as an SDK span of ``resource``, under :data:`SCOPE`.

    The parent is a remote span context: it need not have been exported (a
    run's span appears only when the run finishes) or made by this process.
    """
    tid = record.trace_id
    context = SpanContext(tid, record.span_id, False, _SAMPLED)
    parent = None
    if record.parent_span_id is not None:
        parent = SpanContext(tid, record.parent_span_id, True, _SAMPLED)
    if record.status_code is StatusCode.ERROR:
        status = Status(StatusCode.ERROR, record.status_description or None)
    elif record.status_code is StatusCode.OK:
        status = _OK
    else:
        status = _UNSET
    events = [SpanEvent(e.name, e.attributes, e.time_ns) for e in record.events]
    return ReadableSpan(
        name=record.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=record.attributes,
        events=events,
        kind=record.kind,
        status=status,
        start_time=record.start_ns,
        end_time=record.end_ns,
        instrumentation_scope=SCOPE,
    )


def to_readable_spans(records: Iterable[SpanRecord], resource: Resource) -> list[ReadableSpan]:
    return [to_readable_span(r, resource) for r in records]
