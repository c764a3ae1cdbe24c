"""Follow the events table read-only and ship every event, once."""

from agentrt_export.cursor import Cursor, CursorError, FileCursor, MemoryCursor
from agentrt_export.sinks import JSONLSink

__all__ = [
    "Cursor",
    "CursorError",
    "FileCursor",
    "JSONLSink",
    "MemoryCursor",
]
