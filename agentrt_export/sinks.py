"""Sinks: where a follower hands each event. A sink raises to refuse one.

The follower treats any ``Exception`` from a sink as a refusal: it stops with
the cursor before that event, so the next start hands it over again.
"""

from __future__ import annotations

from typing import IO

from agentrt.events import Event
from agentrt.trace import LineWriter, jsonl_record

__all__ = ["JSONLSink"]


class JSONLSink:
    """Writes one JSON Lines record per event, the same bytes a live
    :func:`agentrt.trace.jsonl` observer writes for it.

    Prefer a binary stream (``sys.stdout.buffer``): records go out exactly as
    built. A text stream works too, with its encoding and newline handling.

    Lines are buffered by the stream; :meth:`flush` pushes them out and is
    what a follower calls after each page, before it saves the cursor, so a
    write that fails late (a closed pipe, a full disk) still stops the
    follower before the cursor moves past it. The first failure is kept:
    every later event and flush raises it again.
    """

    def __init__(self, stream: IO[bytes] | IO[str]) -> None:
        self._out = LineWriter(stream, flush_each=False)
        self._write = self._out.write

    def __call__(self, event: Event) -> None:
        """Write ``event``'s record; raise the write failure, if any."""
        self._write(jsonl_record(event))

    def flush(self) -> None:
        """Push written records to their destination; raise on failure."""
        self._out.flush()

    def err(self) -> Exception | None:
        """The first write or flush failure, or None."""
        return self._out.err()
