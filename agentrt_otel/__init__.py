"""Agent runs as OpenTelemetry traces: the event stream mapped to spans.

One trace per run, every id derived from what the span stands for, spans
built directly and shipped one page at a time over OTLP (gRPC or
http/protobuf), the cursor saved only after the collector accepted them.

- :mod:`~agentrt_otel.ids`: :func:`trace_id`, :func:`span_id`.
- :mod:`~agentrt_otel.mapping`: :class:`SpanMapper`, events to
  :class:`SpanRecord` (pure; it only reads earlier events from its source,
  to replay a run after a restart).
- :mod:`~agentrt_otel.spans`: records to SDK ``ReadableSpan`` objects.
- :mod:`~agentrt_otel.config`: settings from arguments and ``OTEL_*``.
- :mod:`~agentrt_otel.transport`: :class:`OTelSink`, what a follower drives.
- :mod:`~agentrt_otel.testing`: hand-written event streams and scenarios.
"""

from agentrt_otel.config import (
    ConfigError,
    OTelConfig,
    build_exporter,
    build_resource,
    resolve_config,
)
from agentrt_otel.ids import span_id, span_id_hex, trace_id, trace_id_hex
from agentrt_otel.mapping import SpanMapper
from agentrt_otel.records import (
    SPAN_NAMES,
    SpanEventRecord,
    SpanRecord,
    SpanStartSource,
)
from agentrt_otel.spans import SCOPE_NAME, to_readable_span, to_readable_spans
from agentrt_otel.text import DEFAULT_MAX_TEXT, truncate
from agentrt_otel.transport import Backoff, ExportStopped, OTelSink

__all__ = [
    "Backoff",
    "ConfigError",
    "DEFAULT_MAX_TEXT",
    "ExportStopped",
    "OTelConfig",
    "OTelSink",
    "SCOPE_NAME",
    "SPAN_NAMES",
    "SpanEventRecord",
    "SpanMapper",
    "SpanRecord",
    "SpanStartSource",
    "build_exporter",
    "build_resource",
    "resolve_config",
    "span_id",
    "span_id_hex",
    "to_readable_span",
    "to_readable_spans",
    "trace_id",
    "trace_id_hex",
    "truncate",
]
