"""Sinks: where a follower hands each event. A sink raises to refuse one.

The follower treats any ``Exception`` from a sink as a refusal: it stops with
the cursor before that event, so the next start hands it over again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO

from agentrt.errors import described
from agentrt.events import Event
from agentrt.trace import LineWriter, jsonl_record
from agentrt_export.follower import FollowError, PartialPage

__all__ = ["JSONLSink"]


class JSONLSink:
    """Writes one JSON Lines record per event, the same bytes a live
    :func:`agentrt.trace.jsonl` observer writes for it.

    Prefer a binary stream (``sys.stdout.buffer``): records go out exactly as
    built. A text stream works too, with its encoding and newline handling.

    A follower hands it whole pages (:meth:`handle_page`): a page's records
    go out in one write and are flushed before the follower saves the cursor,
    so a write that fails (a closed pipe, a full disk) stops the follower
    before the cursor moves past the page. Called per event, records are
    buffered by the stream until :meth:`flush`. The first failure is kept:
    every later event, page and flush raises it again.
    """

    def __init__(self, stream: IO[bytes] | IO[str]) -> None:
        if not callable(getattr(stream, "write", None)):
            hint = (": open the file first, such as open(path, 'ab')"
                    if isinstance(stream, (str, bytes, os.PathLike)) else "")
            raise FollowError(f"JSONLSink needs a stream with write(), such as "
                              f"sys.stdout.buffer; it was given {described(stream)}{hint}")
        if getattr(stream, "closed", False) is True:
            raise FollowError(f"JSONLSink was given a closed stream ({described(stream)}): "
                              "pass one that is open for writing")
        self._out = LineWriter(stream, flush_each=False)
        self._write = self._out.write

    def __call__(self, event: Event) -> None:
        """Write ``event``'s record; raise the write failure, if any."""
        self._write(jsonl_record(event))

    def handle_page(self, events: Sequence[Event]) -> None:
        """Write the records of a page at once and flush them; raise the failure, if any.

        The same bytes as calling the sink per event and then :meth:`flush`,
        with one write per page instead of one per record. When a write fails
        after whole records arrived (a disk that filled up mid-page), it
        raises :class:`~agentrt_export.follower.PartialPage` saying how many,
        so the cursor moves past them and a restart writes none of them twice.
        """
        records = [jsonl_record(e) for e in events]
        try:
            self._out.write_through(b"".join(records))
        except Exception as exc:
            accepted, arrived = 0, self._out.arrived
            for record in records:
                arrived -= len(record)
                if arrived < 0:
                    break
                accepted += 1
            if accepted:
                raise PartialPage(accepted, exc) from exc
            raise

    def flush(self) -> None:
        """Push written records to their destination; raise on failure."""
        self._out.flush()

    def err(self) -> Exception | None:
        """The first write or flush failure, or None."""
        return self._out.err()
