"""Rows to records: the column lists every read selects and how each decodes.

A row that will not decode does not make its run unreadable: steps and
approvals come back with ``decode_error`` set and the undecodable fields
empty, so the run can still be listed, shown and cancelled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from agentrt.events import Event
from agentrt.records import (
    Approval,
    Decision,
    Limits,
    ModelCall,
    Observation,
    PolicyDecision,
    Run,
    Step,
    ToolRequest,
    Usage,
)
from agentrt.timefmt import ZERO_TIME, parse_time

__all__ = [
    "APPROVAL_COLUMNS",
    "EVENT_COLUMNS",
    "MODEL_CALL_COLUMNS",
    "RUN_COLUMNS",
    "STEP_COLUMNS",
    "approval_from_row",
    "event_from_row",
    "model_call_from_row",
    "run_from_row",
    "step_from_row",
]

RUN_COLUMNS = (
    "id, goal, status, reason, reason_detail, limits_json, step_count, created_at, "
    "started_at, finished_at, result_json, model_calls, input_tokens, output_tokens, "
    "cached_input_tokens, estimated_cost_micros, active_ms, lease_owner, lease_expires_at"
)
STEP_COLUMNS = (
    "id, run_id, idx, status, decision_json, policy_json, observation_json, "
    "observation_hash, started_at, finished_at, spec_hash, policy_id"
)
APPROVAL_COLUMNS = (
    "id, run_id, step_id, kind, capability_json, presentation_json, request_json, hash, "
    "status, created_at, expires_at, decided_at, decided_by, note"
)
MODEL_CALL_COLUMNS = (
    "id, run_id, step_id, attempt, status, model, input_tokens, output_tokens, "
    "cached_input_tokens, cost_micros, latency_ms, error, dispatched_at, completed_at"
)
EVENT_COLUMNS = "seq, run_id, step_id, at, type, payload_json"

T = TypeVar("T")


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _bytes(v: Any) -> bytes:
    if v is None:
        return b""
    if isinstance(v, bytes):
        return v
    return str(v).encode("utf-8")


def _lenient_time(text: Any) -> datetime | None:
    try:
        return parse_time(_text(text))
    except ValueError:
        return None


def _decode(errors: list[str], label: str, fn: Callable[[], T], default: T) -> T:
    try:
        return fn()
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
        errors.append(f"{label}: {exc}")
        return default


def _time(errors: list[str], label: str, text: Any) -> datetime | None:
    return _decode(errors, label, lambda: parse_time(_text(text)), None)


def run_from_row(row: Sequence[Any], *, lenient: bool = False) -> Run:
    """A run; ``lenient`` (page reads) reads damaged limits as zero and bad times as zero.

    Strict reads raise ValueError on damage: the driver must not act on a run
    it cannot read.
    """
    limits_text = _text(row[5])
    if lenient:
        try:
            limits = Limits.from_json(limits_text)
        except (ValueError, TypeError, RecursionError):
            limits = Limits()
        parse: Callable[[Any], datetime | None] = _lenient_time
    else:
        limits = Limits.from_json(limits_text)

        def parse(v: Any) -> datetime | None:
            return parse_time(_text(v))

    return Run(
        id=_text(row[0]),
        goal=_text(row[1]),
        status=_text(row[2]),
        reason=_text(row[3]),
        reason_detail=_text(row[4]),
        limits=limits,
        step_count=int(row[6] or 0),
        created_at=parse(row[7]),
        started_at=parse(row[8]),
        finished_at=parse(row[9]),
        result=_bytes(row[10]),
        model_calls=int(row[11] or 0),
        usage=Usage(int(row[12] or 0), int(row[13] or 0), int(row[14] or 0)),
        estimated_cost_micros=int(row[15] or 0),
        active_ms=int(row[16] or 0),
        lease_owner=_text(row[17]),
        lease_expires_at=parse(row[18]),
    )


def step_from_row(row: Sequence[Any]) -> Step:
    errors: list[str] = []
    decision_text, policy_text, observation_text = _text(row[4]), _text(row[5]), _text(row[6])
    decision = (
        _decode(errors, "decision", lambda: Decision.from_json(decision_text), None)
        if decision_text else None
    )
    policy = (
        _decode(errors, "policy", lambda: PolicyDecision.from_json(policy_text), None)
        if policy_text else None
    )
    observation = (
        _decode(errors, "observation", lambda: Observation.from_json(observation_text), None)
        if observation_text else None
    )
    started = _time(errors, "started_at", row[8])
    finished = _time(errors, "finished_at", row[9])
    return Step(
        id=_text(row[0]),
        run_id=_text(row[1]),
        index=int(row[2] or 0),
        status=_text(row[3]),
        decision=decision,
        policy=policy,
        observation=observation,
        started_at=started,
        finished_at=finished,
        spec_hash=_text(row[10]),
        policy_id=_text(row[11]),
        decode_error="; ".join(errors),
    )


def approval_from_row(row: Sequence[Any]) -> Approval:
    errors: list[str] = []
    request_text = _text(row[6])
    request = _decode(errors, "request", lambda: ToolRequest.from_json(request_text), None)
    created = _time(errors, "created_at", row[9])
    expires = _time(errors, "expires_at", row[10])
    decided = _time(errors, "decided_at", row[11])
    return Approval(
        id=_text(row[0]),
        run_id=_text(row[1]),
        step_id=_text(row[2]),
        kind=_text(row[3]),
        capability=_bytes(row[4]),
        presentation=_bytes(row[5]),
        request=request,
        hash=_text(row[7]),
        status=_text(row[8]),
        created_at=created,
        expires_at=expires,
        decided_at=decided,
        decided_by=_text(row[12]),
        note=_text(row[13]),
        decode_error="; ".join(errors),
    )


def model_call_from_row(row: Sequence[Any]) -> ModelCall:
    return ModelCall(
        id=_text(row[0]),
        run_id=_text(row[1]),
        step_id=_text(row[2]),
        attempt=int(row[3] or 0),
        status=_text(row[4]),
        model=_text(row[5]),
        usage=Usage(int(row[6] or 0), int(row[7] or 0), int(row[8] or 0)),
        cost_micros=int(row[9] or 0),
        latency_ms=int(row[10] or 0),
        error=_text(row[11]),
        dispatched_at=_lenient_time(row[12]),
        completed_at=_lenient_time(row[13]),
    )


def event_from_row(row: Sequence[Any]) -> Event:
    """An event; a time that does not parse reads as the zero time."""
    at = _lenient_time(row[3])
    return Event(
        int(row[0]),
        _text(row[1]),
        _text(row[2]),
        at if at is not None else ZERO_TIME,
        _text(row[4]),
        _bytes(row[5]),
    )
