"""Events: the explanation committed with every state change.

An :class:`Event` is one row of the ``events`` table as readers see it. It has
no hash field: the hash lives only in the table (see :mod:`agentrt.chain`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

__all__ = ["ALL_EVENT_TYPES", "Event", "EventType", "Observer"]


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


@dataclass(frozen=True, slots=True)
class Event:
    """One event: its global commit-order ``seq``, run, step ('' for run-level
    events), time, type and the payload bytes exactly as stored."""

    seq: int
    run_id: str
    step_id: str
    at: datetime
    type: str
    payload: bytes


#: Receives each event after its transaction commits, in seq order.
Observer = Callable[[Event], None]
