"""Follow the events table read-only and ship every event, once.

The names below are imported when first used (PEP 562), so that the command's
entry (:mod:`agentrt_export.entry`) can take the stop signals before the
imports, a fifth of a second, begin.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: Each public name and the module that defines it.
_HOMES = {
    "Cursor": "cursor", "CursorError": "cursor", "CursorHeldError": "cursor",
    "CursorSeqError": "cursor", "FileCursor": "cursor", "MemoryCursor": "cursor",
    "DEFAULT_PAGE_SIZE": "follower", "MAX_PAGE_SIZE": "follower", "EventSink": "follower",
    "Follower": "follower", "FollowError": "follower", "HeadNotFoundError": "follower",
    "PageSink": "follower", "PartialPage": "follower",
    "stop_on_signals": "signals",
    "JSONLSink": "sinks", "OutputStopped": "sinks",
}

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


#: The submodules, reachable as attributes once the package is imported, as
#: they were when it imported them all (``agentrt_export.follower.HeadNotFoundError``).
_SUBMODULES = frozenset({"cli", "cursor", "entry", "follower", "signals", "sinks", "wake"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"agentrt_export.{name}")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'agentrt_export' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"agentrt_export.{home}"), name)
    globals()[name] = value  # once: later reads find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
