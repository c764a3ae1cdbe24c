"""Reading a run's earlier events back, to replay them after a restart.

A mapper that meets a run in the middle (it started on a cursor past the
run's first events) rebuilds the run's state by mapping those events again,
read from the optional :class:`SpanStartSource` (a read-only store) through
the same capped page read a follower uses, so they are byte for byte what the
first pass mapped. Pages hold at most :data:`REPLAY_PAGE` events, so a long
run is never held in memory at once.
"""

from __future__ import annotations

from collections.abc import Iterator

from agentrt.events import Event
from agentrt_otel.records import SpanStartSource

__all__ = ["REPLAY_PAGE", "ReadFailed", "earlier_events"]

#: Events read per page when a run is replayed.
REPLAY_PAGE = 200


class ReadFailed(Exception):
    """The source could not be read; the replay is abandoned."""


def earlier_events(source: SpanStartSource, run_id: str, before_seq: int) -> Iterator[Event]:
    """The run's events with seq below ``before_seq``, in seq order, a page
    at a time. A read that fails raises :class:`ReadFailed`."""
    after = 0
    while True:
        try:
            page = source.list_events_after(run_id, after, REPLAY_PAGE)
        except Exception as err:
            raise ReadFailed(f"{type(err).__name__}: {err}") from err
        for event in page:
            if event.seq >= before_seq:
                return
            if event.seq <= after:  # a source that does not move on
                return
            after = event.seq
            if event.run_id == run_id:
                yield event
        if len(page) < REPLAY_PAGE:
            return
