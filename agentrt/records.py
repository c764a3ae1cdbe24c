"""The records the tables hold, their enumerations, and their JSON forms.

Field order in every ``to_json`` is the reference's struct order and empty
optional fields are left out as Go's ``omitempty`` does, so a database written
here is byte-compatible with one the reference wrote. Raw JSON values (tool
arguments, results, capabilities, schemas) are carried as ``bytes``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from agentrt.canonical import canonical_text
from agentrt.gojson import Raw, dumps, raw_members
from agentrt.timefmt import format_time_nano, parse_time

__all__ = [
    "DEFAULT_LEASE_TTL",
    "INTERRUPTED_SIDE_EFFECT",
    "MAX_PAGE_TEXT",
    "PRE_LEASE_OWNER",
    "SCHEMA_VERSION",
    "Approval",
    "ApprovalStatus",
    "Decision",
    "DecisionKind",
    "Limits",
    "ModelCall",
    "ModelCallStatus",
    "Observation",
    "ObservationKind",
    "PolicyDecision",
    "PolicyOutcome",
    "Reason",
    "ReconcileOutcome",
    "Run",
    "RunStatus",
    "SideEffect",
    "Step",
    "StepStatus",
    "ToolRequest",
    "ToolSpec",
    "Usage",
    "approval_hash",
    "default_limits",
    "duration_ns",
    "ns_duration",
]

SCHEMA_VERSION = 6
MAX_PAGE_TEXT = 64 << 10
DEFAULT_LEASE_TTL = timedelta(seconds=30)
PRE_LEASE_OWNER = "agentrt:pre-lease-version"
INTERRUPTED_SIDE_EFFECT = "interrupted_side_effect"


class RunStatus(StrEnum):
    RUNNING = "RUNNING"
    WAITING_FOR_APPROVAL = "WAITING_FOR_APPROVAL"
    INTERRUPTED = "INTERRUPTED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class Reason(StrEnum):
    """Why a run ended (``runs.reason``); "" while it runs or waits."""

    GOAL_COMPLETED = "goal_completed"
    GOAL_FAILED = "goal_failed"
    LIMIT_STEPS = "limit_steps"
    LIMIT_MODEL_CALLS = "limit_model_calls"
    LIMIT_TOKENS = "limit_tokens"
    LIMIT_COST = "limit_cost"
    LIMIT_ACTIVE_TIME = "limit_active_time"
    LIMIT_ELAPSED_TIME = "limit_elapsed_time"
    APPROVAL_EXPIRED = "approval_expired"
    MODEL_UNAVAILABLE = "model_unavailable"
    REPEATED_TOOL_FAILURES = "repeated_tool_failures"
    LOOP_DETECTED = "loop_detected"
    POLICY_ABORT = "policy_abort"
    TOOL_ABORT = "tool_abort"
    APPROVAL_REJECTED = "approval_rejected"
    OPERATOR_CANCELLED = "operator_cancelled"
    RECONCILE_CONFLICT = "reconcile_conflict"
    AGENT_ERROR = "agent_error"
    INTERNAL_ERROR = "internal_error"


class StepStatus(StrEnum):
    DECIDING = "deciding"
    AWAITING_APPROVAL = "awaiting_approval"
    EXECUTING = "executing"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


class DecisionKind(StrEnum):
    TOOL_CALL = "tool_call"
    COMPLETE = "complete"
    FAIL = "fail"
    #: Pseudo kinds a model agent may record; always invalid.
    TRUNCATED = "truncated"
    NO_TOOL_CALL = "no_tool_call"


# Read once: ``Member.value`` is a Python-level property (and ``Enum.MEMBER``
# goes through the enum type's ``__getattr__``); these are read every step.
_TOOL_CALL = DecisionKind.TOOL_CALL.value

class ObservationKind(StrEnum):
    TOOL_RESULT = "tool_result"
    TOOL_ERROR = "tool_error"
    POLICY_DENIED = "policy_denied"
    INVALID_DECISION = "invalid_decision"
    INTERRUPTED = "interrupted"


_TOOL_RESULT = ObservationKind.TOOL_RESULT.value


class SideEffect(StrEnum):
    READ_ONLY = "read_only"
    LOCAL_MUTATION = "local_mutation"
    REMOTE_MUTATION = "remote_mutation"
    DESTRUCTIVE = "destructive"


class PolicyOutcome(StrEnum):
    ALLOW = "allow"
    REQUIRE_APPROVAL = "require_approval"
    DENY = "deny"
    ABORT = "abort"


class ReconcileOutcome(StrEnum):
    CONTINUE = "continue"
    COMPLETED = "completed"
    WAITING = "waiting"
    CONFLICT = "conflict"


class ModelCallStatus(StrEnum):
    DISPATCHED = "dispatched"
    OK = "ok"
    ERROR = "error"
    AMBIGUOUS = "ambiguous"


def duration_ns(d: timedelta) -> int:
    """A timedelta as Go's integer nanoseconds."""
    return (d.days * 86_400 + d.seconds) * 1_000_000_000 + d.microseconds * 1000


def ns_duration(ns: int) -> timedelta:
    # A positive duration under 1 µs (Go's Limits{GrantTTL: 500}) is still a limit,
    # not the 0 that means none: it becomes the least a timedelta holds.
    return timedelta(microseconds=ns // 1000 if ns <= 0 or ns >= 1000 else 1)


def _str(raw: dict[str, bytes], key: str) -> str:
    v = raw.get(key)
    if v is None:
        return ""
    out = json.loads(v)
    if out is None:
        return ""
    if not isinstance(out, str):
        raise ValueError(f"{key} is not a string")
    return out


def _int(raw: dict[str, bytes], key: str) -> int:
    v = raw.get(key)
    if v is None:
        return 0
    out = json.loads(v)
    if out is None:
        return 0
    if not isinstance(out, int) or isinstance(out, bool):
        raise ValueError(f"{key} is not an integer")
    return out


def _bool(raw: dict[str, bytes], key: str) -> bool:
    v = raw.get(key)
    if v is None or v == b"null":
        return False
    out = json.loads(v)
    if not isinstance(out, bool):
        raise ValueError(f"{key} is not a boolean")
    return out


def _raw(raw: dict[str, bytes], key: str) -> bytes | None:
    v = raw.get(key)
    return None if v is None or v == b"null" else v


def _members(data: bytes | str) -> dict[str, bytes]:
    return raw_members(data)


@dataclass(slots=True)
class Limits:
    """Bounds on a run; zero means unlimited for the optional ones."""

    max_steps: int = 0
    max_consecutive_tool_failures: int = 0
    loop_threshold: int = 0
    max_model_calls: int = 0
    max_output_tokens_per_call: int = 0
    max_total_tokens: int = 0
    max_estimated_cost_micros: int = 0
    max_active_time: timedelta = timedelta(0)
    max_elapsed_time: timedelta = timedelta(0)
    approval_ttl: timedelta = timedelta(0)
    grant_ttl: timedelta = timedelta(0)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_steps": self.max_steps,
            "max_consecutive_tool_failures": self.max_consecutive_tool_failures,
            "loop_threshold": self.loop_threshold,
        }
        for key in ("max_model_calls", "max_output_tokens_per_call", "max_total_tokens",
                    "max_estimated_cost_micros"):
            v = getattr(self, key)
            if v:
                out[key] = v
        for key in ("max_active_time", "max_elapsed_time", "approval_ttl", "grant_ttl"):
            v = duration_ns(getattr(self, key))
            if v:
                out[key] = v
        return out

    @classmethod
    def from_json(cls, data: bytes | str) -> Limits:
        raw = _members(data)
        out = cls()
        for key in ("max_steps", "max_consecutive_tool_failures", "loop_threshold",
                    "max_model_calls", "max_output_tokens_per_call", "max_total_tokens",
                    "max_estimated_cost_micros"):
            setattr(out, key, _int(raw, key))
        for key in ("max_active_time", "max_elapsed_time", "approval_ttl", "grant_ttl"):
            setattr(out, key, ns_duration(_int(raw, key)))
        return out


def default_limits() -> Limits:
    """50 steps, 3 consecutive failures, a loop after 3 identical calls."""
    return Limits(max_steps=50, max_consecutive_tool_failures=3, loop_threshold=3)


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }
        if self.cached_input_tokens:
            out["cached_input_tokens"] = self.cached_input_tokens
        return out

    @classmethod
    def from_members(cls, raw: dict[str, bytes]) -> Usage:
        return cls(_int(raw, "input_tokens"), _int(raw, "output_tokens"),
                   _int(raw, "cached_input_tokens"))


@dataclass(slots=True)
class Decision:
    """What the agent asked for. ``args`` and ``result`` are raw JSON bytes."""

    kind: str
    tool: str = ""
    args: bytes | None = None
    reason: str = ""
    result: bytes | None = None
    message: str = ""
    origin: str = ""
    invalid_args: str = ""
    invalid_result: str = ""
    invalid_base64: bool = False

    @classmethod
    def tool_call(cls, tool: str, args: bytes | str | None = None, reason: str = "",
                  origin: str = "") -> Decision:
        data = args.encode("utf-8") if isinstance(args, str) else args
        return cls(_TOOL_CALL, tool, data, reason, origin=origin)

    @classmethod
    def complete(cls, result: bytes | str | None = None, reason: str = "",
                 origin: str = "") -> Decision:
        data = result.encode("utf-8") if isinstance(result, str) else result
        return cls(DecisionKind.COMPLETE.value, result=data, reason=reason, origin=origin)

    @classmethod
    def fail(cls, message: str, reason: str = "", origin: str = "") -> Decision:
        return cls(DecisionKind.FAIL.value, message=message, reason=reason, origin=origin)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.tool:
            out["tool"] = self.tool
        if self.args:
            out["args"] = Raw(self.args)
        if self.reason:
            out["reason"] = self.reason
        if self.result:
            out["result"] = Raw(self.result)
        if self.message:
            out["message"] = self.message
        if self.origin:
            out["origin"] = self.origin
        if self.invalid_args:
            out["invalid_args"] = self.invalid_args
        if self.invalid_result:
            out["invalid_result"] = self.invalid_result
        if self.invalid_base64:
            out["invalid_base64"] = True
        return out

    @classmethod
    def from_json(cls, data: bytes | str) -> Decision:
        raw = _members(data)
        return cls(
            kind=_str(raw, "kind"),
            tool=_str(raw, "tool"),
            args=_raw(raw, "args"),
            reason=_str(raw, "reason"),
            result=_raw(raw, "result"),
            message=_str(raw, "message"),
            origin=_str(raw, "origin"),
            invalid_args=_str(raw, "invalid_args"),
            invalid_result=_str(raw, "invalid_result"),
            invalid_base64=_bool(raw, "invalid_base64"),
        )


@dataclass(slots=True)
class PolicyDecision:
    """What the policy ruled. ``capability`` and ``presentation`` are raw JSON."""

    outcome: str
    reason: str = ""
    kind: str = ""
    capability: bytes | None = None
    presentation: bytes | None = None

    @classmethod
    def allow(cls, reason: str = "") -> PolicyDecision:
        return cls(PolicyOutcome.ALLOW.value, reason)

    @classmethod
    def deny(cls, reason: str = "") -> PolicyDecision:
        return cls(PolicyOutcome.DENY.value, reason)

    @classmethod
    def abort(cls, reason: str = "") -> PolicyDecision:
        return cls(PolicyOutcome.ABORT.value, reason)

    @classmethod
    def need_approval(cls, kind: str, reason: str = "", capability: Any = None,
                      presentation: Any = None) -> PolicyDecision:
        """An approval request; ``capability``/``presentation`` are values to encode
        (None -> ``{}``) or raw JSON bytes."""

        def enc(v: Any) -> bytes:
            if v is None:
                return b"{}"
            if isinstance(v, bytes):
                return v
            return dumps(v)

        return cls(PolicyOutcome.REQUIRE_APPROVAL.value, reason, kind, enc(capability),
                   enc(presentation))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.outcome}
        if self.reason:
            out["reason"] = self.reason
        if self.kind:
            out["kind"] = self.kind
        # Blank JSON is absent, as the step's row keeps it (it would encode as null).
        if self.capability and self.capability.strip():
            out["capability"] = Raw(self.capability)
        if self.presentation and self.presentation.strip():
            out["presentation"] = Raw(self.presentation)
        return out

    @classmethod
    def from_json(cls, data: bytes | str) -> PolicyDecision:
        raw = _members(data)
        return cls(_str(raw, "outcome"), _str(raw, "reason"), _str(raw, "kind"),
                   _raw(raw, "capability"), _raw(raw, "presentation"))


@dataclass(slots=True)
class Observation:
    """What came of a step: a tool result, an error, a denial..."""

    kind: str
    content: bytes | None = None
    summary: str = ""
    content_hash: str = ""

    @property
    def failure(self) -> bool:
        """Every kind but tool_result counts toward the consecutive-failure limit."""
        return self.kind != _TOOL_RESULT

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.content:
            out["content"] = Raw(self.content)
        if self.summary:
            out["summary"] = self.summary
        if self.content_hash:
            out["content_hash"] = self.content_hash
        return out

    @classmethod
    def from_json(cls, data: bytes | str) -> Observation:
        raw = _members(data)
        return cls(_str(raw, "kind"), _raw(raw, "content"), _str(raw, "summary"),
                   _str(raw, "content_hash"))


@dataclass(slots=True)
class ToolSpec:
    """A tool as the agent and the policy see it. ``input_schema`` is raw JSON."""

    name: str
    description: str
    input_schema: bytes
    side_effect: str
    timeout: timedelta
    terminal: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "input_schema": Raw(self.input_schema),
            "side_effect": self.side_effect,
            "timeout": duration_ns(self.timeout),
        }
        if self.terminal:
            out["terminal"] = True
        return out

    @classmethod
    def from_members(cls, raw: dict[str, bytes]) -> ToolSpec:
        return cls(_str(raw, "name"), _str(raw, "description"),
                   _raw(raw, "input_schema") or b"", _str(raw, "side_effect"),
                   ns_duration(_int(raw, "timeout")), _bool(raw, "terminal"))

    @classmethod
    def from_json(cls, data: bytes | str) -> ToolSpec:
        return cls.from_members(_members(data))

    def spec_hash(self) -> tuple[str, bytes]:
        """(hash, canonical text): the spec's identity in ``tool_specs``."""
        text = canonical_text(dumps(self.to_json()))
        return hashlib.sha256(text).hexdigest(), text


@dataclass(slots=True)
class ToolRequest:
    """The exact request an approval binds: run, step, spec and arguments."""

    run_id: str
    step_id: str
    spec: ToolSpec
    args: bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "step_id": self.step_id,
            "spec": self.spec.to_json(),
            "args": Raw(self.args),
        }

    @classmethod
    def from_json(cls, data: bytes | str) -> ToolRequest:
        raw = _members(data)
        spec_raw = raw.get("spec")
        spec = ToolSpec.from_json(spec_raw) if spec_raw else ToolSpec("", "", b"", "",
                                                                       timedelta(0))
        return cls(_str(raw, "run_id"), _str(raw, "step_id"), spec,
                   _raw(raw, "args") or b"")


def approval_hash(kind: str, capability: bytes | None, presentation: bytes | None,
                  request: ToolRequest) -> str:
    """Hex sha256 of the canonical form of what an approval grants.

    Raises ValueError when a part will not encode: never a stand-in hash.
    """
    value = {
        "capability": Raw(capability or b"{}"),
        "kind": kind,
        "presentation": Raw(presentation or b"{}"),
        "request": request.to_json(),
    }
    return hashlib.sha256(canonical_text(dumps(value))).hexdigest()


def _time_or_none(text: str) -> datetime | None:
    return parse_time(text)


@dataclass(slots=True)
class Run:
    id: str
    goal: str
    status: str
    limits: Limits = field(default_factory=Limits)
    reason: str = ""
    reason_detail: str = ""
    step_count: int = 0
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: bytes = b""
    model_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    estimated_cost_micros: int = 0
    active_ms: int = 0
    lease_owner: str = ""
    lease_expires_at: datetime | None = None


@dataclass(slots=True)
class Step:
    id: str
    run_id: str
    index: int
    status: str
    decision: Decision | None = None
    policy: PolicyDecision | None = None
    observation: Observation | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    spec_hash: str = ""
    policy_id: str = ""
    #: Set when a stored column would not decode; the fields it fed are empty.
    decode_error: str = ""


@dataclass(slots=True)
class Approval:
    id: str
    run_id: str
    step_id: str
    kind: str
    capability: bytes
    presentation: bytes
    request: ToolRequest | None
    hash: str
    status: str
    created_at: datetime | None = None
    expires_at: datetime | None = None
    decided_at: datetime | None = None
    decided_by: str = ""
    note: str = ""
    decode_error: str = ""

    def to_json(self) -> dict[str, Any]:
        """The API/CLI form (not a column): zero times and empty fields left out."""
        out: dict[str, Any] = {
            "id": self.id,
            "run_id": self.run_id,
            "step_id": self.step_id,
            "kind": self.kind,
            "capability": Raw(self.capability or b"{}"),
            "presentation": Raw(self.presentation or b"{}"),
            "request": self.request.to_json() if self.request is not None else None,
            "hash": self.hash,
            "status": self.status,
            # Go marshals a time.Time as RFC 3339 with nanoseconds; created_at
            # is not omitzero, so an unreadable one is the zero time, not "".
            "created_at": format_time_nano(self.created_at),
        }
        if self.expires_at is not None:
            out["expires_at"] = format_time_nano(self.expires_at)
        if self.decided_at is not None:
            out["decided_at"] = format_time_nano(self.decided_at)
        if self.decided_by:
            out["decided_by"] = self.decided_by
        if self.note:
            out["note"] = self.note
        if self.decode_error:
            out["decode_error"] = self.decode_error
        return out


@dataclass(slots=True)
class ModelCall:
    id: str
    run_id: str
    step_id: str
    attempt: int
    status: str
    model: str
    usage: Usage = field(default_factory=Usage)
    cost_micros: int = 0
    latency_ms: int = 0
    error: str = ""
    dispatched_at: datetime | None = None
    completed_at: datetime | None = None


def invalid_bytes_text(data: bytes) -> tuple[str, bool]:
    """How unusable bytes are kept out of band: the text, or base64 if not UTF-8."""
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True
