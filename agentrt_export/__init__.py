"""Follow the events table read-only and ship every event, once."""

from agentrt_export.cursor import (
    Cursor,
    CursorError,
    CursorHeldError,
    CursorSeqError,
    FileCursor,
    MemoryCursor,
)
from agentrt_export.follower import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    EventSink,
    Follower,
    FollowError,
    HeadNotFoundError,
    PageSink,
    PartialPage,
)
from agentrt_export.signals import stop_on_signals
from agentrt_export.sinks import JSONLSink, OutputStopped

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "Cursor",
    "CursorError",
    "CursorHeldError",
    "CursorSeqError",
    "EventSink",
    "FileCursor",
    "FollowError",
    "Follower",
    "HeadNotFoundError",
    "JSONLSink",
    "MemoryCursor",
    "OutputStopped",
    "PageSink",
    "PartialPage",
    "stop_on_signals",
]
