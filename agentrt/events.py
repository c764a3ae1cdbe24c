"""Events: the explanation committed with every state change.

An :class:`Event` is one row of the ``events`` table as readers see it. It has
no hash field: the hash lives only in the table (see :mod:`agentrt.chain`).

An event is an immutable tuple of the stored fields, ``at`` included as its
stored text (:attr:`Event.at_text`); :attr:`Event.at` parses that text when
asked. Readers page through millions of events, and building each one from
its row costs one tuple copy instead of an object with six attributes and a
parsed datetime (see ``bench/bench_store.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from functools import lru_cache, partial
from typing import Any, NamedTuple

from agentrt.timefmt import ZERO_TIME, format_time, parse_time

__all__ = ["ALL_EVENT_TYPES", "Event", "EventType", "Observer", "event_from_fields"]


class EventType(StrEnum):
    RUN_CREATED = "run.created"
    RUN_STARTED = "run.started"
    RUN_FINISHED = "run.finished"
    RUN_RESUMED = "run.resumed"
    LEASE_TAKEN_OVER = "lease.taken_over"
    STEP_STARTED = "step.started"
    STEP_DECIDED = "step.decided"
    STEP_POLICY = "step.policy"
    STEP_TOOL_STARTED = "step.tool_started"
    STEP_TOOL_FINISHED = "step.tool_finished"
    STEP_FAILED = "step.failed"
    STEP_INTERRUPTED = "step.interrupted"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    LIMIT_EXCEEDED = "limit.exceeded"
    LOOP_DETECTED = "loop.detected"
    MODEL_DISPATCHED = "model.dispatched"
    MODEL_COMPLETED = "model.completed"
    MODEL_FAILED = "model.failed"


#: The 19 event types the runtime writes.
ALL_EVENT_TYPES: tuple[str, ...] = tuple(t.value for t in EventType)


@lru_cache(maxsize=4096)
def _parse_at(text: str) -> datetime:
    try:
        t = parse_time(text)
    except ValueError:
        return ZERO_TIME
    return ZERO_TIME if t is None else t


class _EventFields(NamedTuple):
    seq: int
    run_id: str
    step_id: str
    at_text: str
    type: str
    payload: bytes


class Event(_EventFields):
    """One event: its global commit-order ``seq``, run, step ('' for run-level
    events), time, type and the payload bytes exactly as stored.

    Construct it as ``Event(seq, run_id, step_id, at, type, payload)`` with
    ``at`` a datetime (stored as UTC, microseconds) or the stored text.
    ``at`` reads back as an aware UTC datetime; a stored time that does not
    parse reads as :data:`agentrt.timefmt.ZERO_TIME`. Two events are equal
    when their stored fields are, so an event the observer received equals
    the same event read back from the table.
    """

    __slots__ = ()

    def __new__(
        cls,
        seq: int,
        run_id: str,
        step_id: str,
        at: datetime | str,
        type: str,
        payload: bytes,
    ) -> Event:
        text = at if isinstance(at, str) else format_time(at)
        return tuple.__new__(cls, (seq, run_id, step_id, text, type, payload))

    @property
    def at(self) -> datetime:
        """The event's time (UTC); the zero time when the stored text does not parse."""
        return _parse_at(self.at_text)

    def __repr__(self) -> str:
        return (
            f"Event(seq={self.seq!r}, run_id={self.run_id!r}, step_id={self.step_id!r}, "
            f"at={self.at_text!r}, type={self.type!r}, payload={self.payload!r})"
        )


#: Builds an Event from a sequence of its six stored fields without any check
#: (``at`` as stored text, ``payload`` as bytes): the readers' fast path.
event_from_fields: Callable[[Any], Event] = partial(tuple.__new__, Event)

#: Receives each event after its transaction commits, in seq order.
Observer = Callable[[Event], None]
