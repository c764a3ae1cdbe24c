"""Events: the explanation committed with every state change.

An :class:`Event` is one row of the ``events`` table as readers see it. It has
no hash field: the hash lives only in the table (see :mod:`agentrt.chain`).

An event is an immutable tuple of the stored fields, ``at`` included as its
stored text (:attr:`Event.at_text`); :attr:`Event.at` parses that text when
asked. Readers page through millions of events, and building each one from
its row is at most one tuple copy in C instead of an object with six
attributes and a parsed datetime; the follower's page read turns the row
itself into the event (``agentrt/_eventrows.c``; see ``bench/bench_store.py``).
"""

from __future__ import annotations

from abc import ABCMeta
from collections import _tuplegetter  # type: ignore[attr-defined]  # namedtuple's accessor
from collections.abc import Callable, Iterable
from datetime import datetime
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

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


#: Longer than any time the runtime writes or Go parses (35 characters at most):
#: such a text is read without the cache, which would otherwise keep up to
#: 4096 capped cells of 64 Ki characters each for the life of the process.
_CACHED_AT_LENGTH = 64


def _parse_at(text: str) -> datetime:
    if len(text) > _CACHED_AT_LENGTH:
        return _parse_at_uncached(text)
    return _parse_short_at(text)


def _parse_at_uncached(text: str) -> datetime:
    try:
        t = parse_time(text)
    except ValueError:
        return ZERO_TIME
    return ZERO_TIME if t is None else t


_parse_short_at = lru_cache(maxsize=4096)(_parse_at_uncached)


class _EventFields(tuple[Any, ...]):
    """The six stored fields of an event and the ways to read them.

    It defines no ``__new__``, so building one from a row (``_StoredEvent(row)``)
    is tuple's own C constructor: the readers' fast path.
    """

    __slots__ = ()
    _fields = ("seq", "run_id", "step_id", "at_text", "type", "payload")
    __match_args__ = ("seq", "run_id", "step_id", "at_text", "type", "payload")

    if TYPE_CHECKING:

        @property
        def seq(self) -> int: ...
        @property
        def run_id(self) -> str: ...
        @property
        def step_id(self) -> str: ...
        @property
        def at_text(self) -> str: ...
        @property
        def type(self) -> str: ...
        @property
        def payload(self) -> bytes: ...

    else:
        seq = _tuplegetter(0, "The event's global commit-order sequence number.")
        run_id = _tuplegetter(1, "The run it explains.")
        step_id = _tuplegetter(2, "The step, or '' for a run-level event.")
        at_text = _tuplegetter(3, "The time exactly as stored.")
        type = _tuplegetter(4, "The event type, e.g. 'step.started'.")
        payload = _tuplegetter(5, "The payload bytes exactly as stored.")

    @property
    def at(self) -> datetime:
        """The event's time (UTC); the zero time when the stored text does not parse."""
        return _parse_at(self.at_text)

    def _replace(self, **changes: Any) -> Event:
        fields = dict(zip(self._fields, self, strict=True))
        if "at" in changes:
            at = changes.pop("at")
            changes["at_text"] = at if isinstance(at, str) else format_time(at)
        fields.update(changes)
        return _StoredEvent(fields[f] for f in self._fields)  # type: ignore[return-value]

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))

    def __repr__(self) -> str:
        return (
            f"Event(seq={self.seq!r}, run_id={self.run_id!r}, step_id={self.step_id!r}, "
            f"at={self.at_text!r}, type={self.type!r}, payload={self.payload!r})"
        )


class Event(_EventFields, metaclass=ABCMeta):
    """One event: its global commit-order ``seq``, run, step ('' for run-level
    events), time, type and the payload bytes exactly as stored.

    Construct it as ``Event(seq, run_id, step_id, at, type, payload)`` with
    ``at`` a datetime (stored as UTC, microseconds) or the stored text.
    ``at`` reads back as an aware UTC datetime; a stored time that does not
    parse reads as :data:`agentrt.timefmt.ZERO_TIME`. Two events are equal
    when their stored fields are, so an event the observer received equals
    the same event read back from the table.

    Events read from the table are instances of a private sibling class that
    skips this constructor (``isinstance(e, Event)`` holds for them): a
    Python-level ``__new__`` cost a follower paging a million events a third
    of its speed (see ``bench/bench_store.py``).
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

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)


class _StoredEvent(_EventFields):
    """An event read from the table; see :class:`Event`."""

    __slots__ = ()


Event.register(_StoredEvent)

#: Builds an Event from an iterable of its six stored fields without any check
#: (``at`` as stored text, ``payload`` as bytes): the readers' fast path.
event_from_fields = cast(Callable[[Iterable[Any]], Event], _StoredEvent)

#: The exact classes of the events this package builds: code that reads an
#: event's stored fields by position trusts these, and no subclass, whose
#: properties could say otherwise.
OWN_EVENT_CLASSES: tuple[type, ...] = (Event, _StoredEvent)

#: Receives each event after its transaction commits, a transaction's events in
#: the order they were appended (rising seq). Transactions on other threads
#: deliver independently: an observer they share may see a later transaction's
#: event between two of an earlier one's (seq 1, 3, 2).
Observer = Callable[[Event], None]
