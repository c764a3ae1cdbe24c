"""Event streams written by hand, for testing what the exporter makes of them.

:class:`EventStream` writes events with the payloads the runtime writes (keys
and shapes of the event catalogue), on a clock that advances one millisecond
per event; :meth:`EventStream.source` answers the replay reads of
:class:`agentrt_otel.SpanMapper` over them like a read-only store would. The
``scenario_*`` functions write the shapes the reference's fixtures make (a
completed run, a pause and resume, a crash and takeover, a cancel with a late
tool result, retried model calls, limit / loop / fail), so a dashboard, a
collector configuration or a mapping change can be tried without a driver.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrt.events import Event, EventType
from agentrt.gojson import Raw, dumps, sorted_map
from agentrt.records import (
    Decision,
    Limits,
    Observation,
    PolicyDecision,
    default_limits,
)
from agentrt.timefmt import format_time

__all__ = [
    "SCENARIOS",
    "EventStream",
    "StreamSource",
    "scenario_cancelled",
    "scenario_completed",
    "scenario_crash_takeover",
    "scenario_failed",
    "scenario_limit",
    "scenario_loop",
    "scenario_model_retry",
    "scenario_paused",
]

#: Where every stream's clock starts.
EPOCH = datetime(2026, 9, 25, 14, 3, 4, tzinfo=UTC)
HASH = "ab" * 32


class StreamSource:
    """Events as a store would hold them, answering the one read
    :class:`agentrt_otel.SpanStartSource` names. A plain object that records
    each call in ``calls``."""

    def __init__(self, events: list[Event]) -> None:
        self.events = sorted(events, key=lambda e: e.seq)
        self.calls: list[tuple[str, int, int]] = []

    def list_events_after(self, run_id: str, seq: int, limit: int) -> list[Event]:
        self.calls.append((run_id, seq, limit))
        out: list[Event] = []
        for e in self.events:
            if len(out) == limit:
                break
            if e.seq > seq and (not run_id or e.run_id == run_id):
                out.append(e)
        return out


class EventStream:
    """Runtime-shaped events for one or more runs, in seq order.

    ``use(run_id)`` switches the run the next events belong to; seqs are
    global, as in the events table.
    """

    def __init__(self, run_id: str = "run-1", *, start: datetime = EPOCH,
                 tick: timedelta = timedelta(milliseconds=1)) -> None:
        self.run_id = run_id
        self.events: list[Event] = []
        self.now = start
        self.tick = tick

    # -- plumbing -----------------------------------------------------------

    def use(self, run_id: str) -> EventStream:
        self.run_id = run_id
        return self

    def emit(self, type_: str, payload: dict[str, Any] | bytes, step_id: str = "") -> Event:
        """Append one event at the next clock reading."""
        self.now += self.tick
        data = payload if isinstance(payload, bytes) else dumps(payload)
        event = Event(len(self.events) + 1, self.run_id, step_id, self.now, type_, data)
        self.events.append(event)
        return event

    def source(self) -> StreamSource:
        return StreamSource(list(self.events))

    # -- run events ---------------------------------------------------------

    def run_created(self, goal: str = "g", limits: Limits | None = None) -> Event:
        limits = limits if limits is not None else default_limits()
        return self.emit(EventType.RUN_CREATED,
                         {"goal": goal, "limits": limits.to_json(), "tools": [HASH]})

    def run_started(self) -> Event:
        return self.emit(EventType.RUN_STARTED, {})

    def run_resumed(self, step_id: str = "", approval_id: str = "", after: str = "") -> Event:
        payload = {"approval_id": approval_id} if approval_id else {"after": after}
        return self.emit(EventType.RUN_RESUMED, payload, step_id)

    def lease_taken_over(self, previous_owner: str, owner: str) -> Event:
        return self.emit(EventType.LEASE_TAKEN_OVER, sorted_map({
            "previous_owner": previous_owner,
            "previous_expires_at": format_time(self.now),
            "owner": owner,
        }))

    def limit_exceeded(self, reason: str, detail: str) -> Event:
        return self.emit(EventType.LIMIT_EXCEEDED, {"detail": detail, "reason": reason})

    def loop_detected(self, repeats: int, tool: str) -> Event:
        return self.emit(EventType.LOOP_DETECTED, {
            "args_hash": HASH, "observation_hash": "cd" * 32, "repeats": repeats, "tool": tool,
        })

    def run_finished(self, status: str, reason: str, detail: str = "", steps: int = 0,
                     by: str = "") -> Event:
        payload: dict[str, Any] = {"detail": detail, "reason": reason, "status": status,
                                   "steps": steps}
        if by:
            payload["by"] = by
        return self.emit(EventType.RUN_FINISHED, sorted_map(payload))

    # -- step events --------------------------------------------------------

    def step_started(self, step_id: str, index: int) -> Event:
        return self.emit(EventType.STEP_STARTED, {"index": index}, step_id)

    def step_decided(self, step_id: str, decision: Decision) -> Event:
        return self.emit(EventType.STEP_DECIDED, decision.to_json(), step_id)

    def step_policy(self, step_id: str, policy: PolicyDecision, policy_id: str = "",
                    spec_hash: str = HASH) -> Event:
        payload = policy.to_json()
        if policy_id:
            payload["policy_id"] = policy_id
        if spec_hash:
            payload["spec_hash"] = spec_hash
        return self.emit(EventType.STEP_POLICY, payload, step_id)

    def tool_started(self, step_id: str, tool: str, args: bytes = b"{}",
                     approval_id: str = "") -> Event:
        payload: dict[str, Any] = {"tool": tool, "args": Raw(args)}
        if approval_id:
            payload["approval_id"] = approval_id
        return self.emit(EventType.STEP_TOOL_STARTED, payload, step_id)

    def tool_finished(self, step_id: str, tool: str, duration_ms: int, summary: str = "",
                      error: str | None = None, late: bool = False,
                      content: bytes = b'{"ok":true}') -> Event:
        payload: dict[str, Any] = {}
        if late:
            obs = Observation("tool_result", content, summary, HASH)
            payload = {"late": True, "observation": obs.to_json(), "tool": tool,
                       "duration_ms": duration_ms, "summary": summary, "content_hash": HASH}
        else:
            payload = {"tool": tool, "duration_ms": duration_ms}
            if error is None:
                payload["summary"] = summary
                payload["content_hash"] = HASH
            else:
                payload["error"] = error
        return self.emit(EventType.STEP_TOOL_FINISHED, payload, step_id)

    def step_failed(self, step_id: str, detail: str, observation: str,
                    content_hash: str = HASH) -> Event:
        return self.emit(EventType.STEP_FAILED, {"detail": detail, "observation": observation,
                                                 "content_hash": content_hash}, step_id)

    def step_interrupted(self, step_id: str, previous: str = "executing") -> Event:
        return self.emit(EventType.STEP_INTERRUPTED,
                         {"previous_status": {"previous_status": previous}}, step_id)

    # -- approvals and model calls ------------------------------------------

    def approval_requested(self, step_id: str, approval_id: str, kind: str,
                           reason: str = "", tool: str = "publish") -> Event:
        capability = dumps({"args": Raw(b"{}"), "tool": tool})
        presentation = dumps({"args": Raw(b"{}"), "tool": tool})
        return self.emit(EventType.APPROVAL_REQUESTED, {
            "approval_id": approval_id, "kind": kind, "reason": reason,
            "capability": Raw(capability), "presentation": Raw(presentation), "hash": HASH,
        }, step_id)

    def approval_decided(self, step_id: str, approval_id: str, status: str, by: str = "",
                         note: str = "") -> Event:
        payload: dict[str, Any] = {"approval_id": approval_id, "status": status}
        if by or note:
            payload = {"approval_id": approval_id, "by": by, "note": note, "status": status}
        return self.emit(EventType.APPROVAL_DECIDED, payload, step_id)

    def model_dispatched(self, step_id: str, call_id: str, attempt: int,
                         model: str = "scripted-model") -> Event:
        return self.emit(EventType.MODEL_DISPATCHED,
                         {"attempt": attempt, "call_id": call_id, "model": model}, step_id)

    def model_result(self, step_id: str, call_id: str, attempt: int, status: str = "ok",
                     usage: tuple[int, int, int] = (0, 0, 0), cost_micros: int = 0,
                     latency_ms: int | None = None, error: str = "",
                     model: str = "scripted-model") -> Event:
        """model.completed (status ok) or model.failed; ``latency_ms`` defaults
        to the time since the previous event."""
        if latency_ms is None:
            latency_ms = self.tick // timedelta(milliseconds=1)
        usage_json: dict[str, Any] = {"input_tokens": usage[0], "output_tokens": usage[1]}
        if usage[2]:
            usage_json["cached_input_tokens"] = usage[2]
        payload = {"attempt": attempt, "call_id": call_id, "cost_micros": cost_micros,
                   "error": error, "latency_ms": latency_ms, "model": model, "status": status,
                   "usage": usage_json}
        kind = EventType.MODEL_COMPLETED if status == "ok" else EventType.MODEL_FAILED
        return self.emit(kind, payload, step_id)

    # -- common shapes ------------------------------------------------------

    def tool_step(self, step_id: str, index: int, tool: str, args: bytes = b'{"n":1}',
                  reason: str = "", summary: str | None = None) -> None:
        """An allowed tool call: started, decided, policy, tool started/finished."""
        self.step_started(step_id, index)
        self.step_decided(step_id, Decision.tool_call(tool, args, reason))
        self.step_policy(step_id, PolicyDecision.allow("side effect read_only is allow by policy"))
        self.tool_started(step_id, tool, args)
        self.tool_finished(step_id, tool, 3, summary if summary is not None else f"{tool} done")


def scenario_completed(s: EventStream, goal: str = "g" * 3000) -> None:
    """Five steps: a read, a schema-invalid write, a denied wipe, a read, complete."""
    s.run_created(goal, replace(default_limits(), max_steps=10))
    s.run_started()
    s.tool_step("s0", 0, "read", b'{"n":1}', reason="because " * 400)
    s.step_started("s1", 1)
    s.step_decided("s1", replace(Decision.tool_call("write", b'{"n":"x"}'),
                                 invalid_args="n: expected integer"))
    s.step_failed("s1", "invalid arguments: n: expected integer", "invalid_decision")
    s.step_started("s2", 2)
    s.step_decided("s2", Decision.tool_call("wipe", b"{}"))
    s.step_policy("s2", PolicyDecision.deny("side effect destructive is deny by policy"))
    s.step_failed("s2", "side effect destructive is deny by policy", "policy_denied")
    s.tool_step("s3", 3, "read", b'{"n":2}')
    s.step_started("s4", 4)
    s.step_decided("s4", Decision.complete(b'{"done":true}'))
    s.run_finished("COMPLETED", "goal_completed", steps=5)


def scenario_paused(s: EventStream) -> None:
    """A read, then publish waits for approval; approved, resumed, completed."""
    s.run_created("publish with approval")
    s.run_started()
    s.tool_step("p0", 0, "read")
    s.step_started("p1", 1)
    s.step_decided("p1", Decision.tool_call("publish", b"{}"))
    need = PolicyDecision.need_approval("remote_mutation", "side effect remote_mutation is "
                                        "require_approval by policy")
    s.step_policy("p1", need, policy_id="policy-1")
    s.approval_requested("p1", "a1", "remote_mutation", need.reason)
    s.approval_decided("p1", "a1", "approved", "operator", "looks right")
    s.run_resumed("p1", approval_id="a1")
    s.step_policy("p1", PolicyDecision.allow("granted"), policy_id="policy-1")
    s.tool_started("p1", "publish", b"{}", approval_id="a1")
    s.tool_finished("p1", "publish", 4, "publish done")
    s.step_started("p2", 2)
    s.step_decided("p2", Decision.complete(b'{"shipped":true}'))
    s.run_finished("COMPLETED", "goal_completed", steps=3)


def scenario_crash_takeover(s: EventStream) -> None:
    """The 18 events of a write interrupted by a crash, approved and re-run."""
    s.run_created("survive a crash")
    s.run_started()
    s.step_started("c0", 0)
    s.step_decided("c0", Decision.tool_call("write", b'{"n":1}'))
    s.step_policy("c0", PolicyDecision.allow("side effect local_mutation is allow by policy"),
                  policy_id="policy-1")
    s.tool_started("c0", "write", b'{"n":1}')
    s.lease_taken_over("crasher/1234", "resumer/5678")
    s.step_interrupted("c0")
    s.step_policy("c0", PolicyDecision.need_approval(
        "interrupted_side_effect", "interrupted while executing; outcome unknown"))
    s.approval_requested("c0", "a-crash", "interrupted_side_effect",
                         "interrupted while executing; outcome unknown", tool="write")
    s.approval_decided("c0", "a-crash", "approved", "operator", "run it again")
    s.run_resumed("c0", approval_id="a-crash")
    s.step_policy("c0", PolicyDecision.allow("side effect local_mutation is allow by policy"))
    s.tool_started("c0", "write", b'{"n":1}', approval_id="a-crash")
    s.tool_finished("c0", "write", 2, "write done")
    s.step_started("c1", 1)
    s.step_decided("c1", Decision.complete(b'{"written":true}'))
    s.run_finished("COMPLETED", "goal_completed", steps=2)


def scenario_cancelled(s: EventStream) -> None:
    """A blocking tool; the operator cancels; the tool's outcome arrives late."""
    s.run_created("cancel me")
    s.run_started()
    s.step_started("k0", 0)
    s.step_decided("k0", Decision.tool_call("block", b"{}"))
    s.step_policy("k0", PolicyDecision.allow("side effect local_mutation is allow by policy"))
    s.tool_started("k0", "block", b"{}")
    s.run_finished("CANCELLED", "operator_cancelled", "changed my mind", steps=1,
                   by="operator")
    s.tool_finished("k0", "block", 5, "finished after cancel", late=True,
                    content=b'{"late":true}')


def scenario_model_retry(s: EventStream) -> None:
    """A 429 on the first attempt, a retry that asks for a read, then done."""
    s.run_created("read seven", replace(default_limits(), max_model_calls=10))
    s.run_started()
    s.step_started("m0", 0)
    s.model_dispatched("m0", "call-1", 1)
    s.model_result("m0", "call-1", 1, "error", error="transient: 429 slow down")
    s.model_dispatched("m0", "call-2", 2)
    s.model_result("m0", "call-2", 2, "ok", (100, 20, 0), 200)
    s.step_decided("m0", Decision.tool_call("read", b'{"n":7}', origin="model"))
    s.step_policy("m0", PolicyDecision.allow("side effect read_only is allow by policy"))
    s.tool_started("m0", "read", b'{"n":7}')
    s.tool_finished("m0", "read", 1, "read done")
    s.step_started("m1", 1)
    s.model_dispatched("m1", "call-3", 1)
    s.model_result("m1", "call-3", 1, "ok", (120, 5, 50), 175)
    s.step_decided("m1", Decision.complete(b'"done"', origin="model"))
    s.run_finished("COMPLETED", "goal_completed", steps=2)


def scenario_limit(s: EventStream) -> None:
    s.run_created("too many steps", replace(default_limits(), max_steps=1))
    s.run_started()
    s.tool_step("l0", 0, "read")
    s.limit_exceeded("limit_steps", "1 steps taken, limit 1")
    s.run_finished("FAILED", "limit_steps", "1 steps taken, limit 1", steps=1)


def scenario_loop(s: EventStream) -> None:
    s.run_created("loop", replace(default_limits(), loop_threshold=2))
    s.run_started()
    s.tool_step("o0", 0, "read")
    s.tool_step("o1", 1, "read")
    s.loop_detected(2, "read")
    s.run_finished("FAILED", "loop_detected", "read repeated 2 times", steps=2)


def scenario_failed(s: EventStream) -> None:
    s.run_created("give up")
    s.run_started()
    s.step_started("f0", 0)
    s.step_decided("f0", Decision.fail("no " * 1000))
    s.run_finished("FAILED", "goal_failed", "no " * 1000, steps=1)


#: Every scenario above, for tests that run them all.
SCENARIOS = (scenario_completed, scenario_paused, scenario_crash_takeover, scenario_cancelled,
             scenario_model_retry, scenario_limit, scenario_loop, scenario_failed)
