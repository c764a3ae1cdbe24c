"""Crash recovery: resuming a RUNNING run whose driver stopped.

The runtime never re-executes a step on its own. A resume takes the lease
over (``lease.taken_over`` when another owner, or this one, let it expire),
marks every step caught mid-flight ``interrupted``, and then either asks the
consumer's reconcile function what happened, or, without one, pauses a tool
call that was executing (and is not read-only) on an
``interrupted_side_effect`` approval: only a person can say "run it again".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

import apsw

from agentrt.canonical import check_json
from agentrt.driver.checks import close_if_coroutine, fit
from agentrt.driver.loop import _q, mistyped_policy
from agentrt.driver.policy import RunView
from agentrt.driver.session import (
    ACTIVE,
    Ending,
    Session,
    StepEnd,
    observation,
)
from agentrt.driver.snapshot import copy_run
from agentrt.driver.tools import RegisteredTool, check_args
from agentrt.errors import RunLeasedError, described, exception_text
from agentrt.events import EventType
from agentrt.gojson import Raw, dumps, sorted_map
from agentrt.records import (
    INTERRUPTED_SIDE_EFFECT,
    DecisionKind,
    ObservationKind,
    PolicyDecision,
    PolicyOutcome,
    Reason,
    ReconcileOutcome,
    Run,
    RunStatus,
    SideEffect,
    Step,
    StepStatus,
    ToolRequest,
)
from agentrt.store.writes import take_lease, transition
from agentrt.timefmt import format_time

__all__ = ["NOTICE", "Reconcile", "Reconciliation", "recover"]

NOTICE = (
    "This tool call started, and the process stopped before its outcome was recorded, "
    "so whether it took effect is unknown. Approving runs it again with these arguments; "
    "rejecting ends the run."
)
_IN_FLIGHT = (StepStatus.DECIDING.value, StepStatus.EXECUTING.value)


@dataclass(slots=True)
class Reconciliation:
    """What the consumer found out about an interrupted run.

    ``continue`` goes on with the agent; ``completed`` ends the run with
    ``result``; ``conflict`` fails it as reconcile_conflict; ``waiting`` pauses
    the interrupted tool call on ``pause`` (a require_approval decision).
    """

    outcome: str
    detail: str = ""
    result: bytes | None = None
    pause: PolicyDecision | None = None


Reconcile = Callable[[RunView], Reconciliation]


def _was_executing(step: Step) -> bool:
    obs = step.observation
    if step.status != StepStatus.INTERRUPTED or obs is None or not obs.content:
        return False
    try:
        return bool(json.loads(obs.content).get("previous_status") == StepStatus.EXECUTING)
    except (ValueError, AttributeError):
        return False


def recover(s: Session) -> Run | None:
    """Take the run over; None means the loop goes on with the agent."""
    core = s.core
    assert s.run is not None
    run = s.run
    wall_now = core.wall()
    owner, expires = run.lease_owner, run.lease_expires_at
    if owner and owner != core.owner and expires is not None and expires > wall_now:
        raise RunLeasedError(s.run_id, owner, expires)
    problem = s.load()
    assert s.steps is not None
    now = core.now()
    in_flight = [st for st in s.steps if st.status in _IN_FLIGHT]
    executing = next((st for st in s.steps if st.status == StepStatus.EXECUTING), None)
    if executing is None and s.steps and _was_executing(s.steps[-1]):
        executing = s.steps[-1]
    with s.tx() as tx:
        prev_owner, prev_expires = take_lease(tx, s.run_id, core.owner, wall_now + core.lease_ttl,
                                              wall_now)
        s.lease.taking()  # written, not yet committed: a refusal above took nothing
        if prev_owner and (prev_owner != core.owner or prev_expires is None
                           or prev_expires <= wall_now):
            s.append(tx, "", now, EventType.LEASE_TAKEN_OVER, sorted_map({
                "owner": core.owner,
                "previous_expires_at": format_time(prev_expires),
                "previous_owner": prev_owner,
            }))
        if not problem:
            for st in in_flight:
                obs = observation(ObservationKind.INTERRUPTED.value,
                                  {"previous_status": st.status},
                                  f"step interrupted while {st.status}")
                marked = replace(st, status=StepStatus.INTERRUPTED.value, observation=obs,
                                 finished_at=now)
                stored = s.write_step(tx, marked, (st.status,))
                if executing is not None and executing.id == st.id:
                    executing = stored
                assert obs.content is not None
                s.append(tx, st.id, now, EventType.STEP_INTERRUPTED,
                         {"previous_status": Raw(obs.content)})
    s.lease.start(wall_now)
    if problem:
        return s.fail_internal(problem, ACTIVE)
    if core.reconcile is not None:
        return _reconcile(s, run, executing, now)
    if executing is not None and not _read_only(core.tools, executing):
        return _pause_interrupted(s, executing, now)
    _continue(s, now)
    return None


def _read_only(tools: Mapping[str, RegisteredTool], step: Step) -> bool:
    """Whether the step's tool is registered and states itself read-only now; a
    tool whose spec cannot be read is not (its pause then says why it cannot wait)."""
    registered = tools.get(step.decision.tool) if step.decision else None
    if registered is None:
        return False
    try:
        return registered.current()[0].side_effect == SideEffect.READ_ONLY
    except ValueError:
        return False


def _continue(s: Session, now: datetime) -> None:
    with s.tx() as tx:
        transition(tx, s.run_id, ACTIVE, RunStatus.RUNNING.value, owner=s.core.owner,
                   lease_owner=s.core.owner, lease_expires=s.lease.expires_at)
        s.append(tx, "", now, EventType.RUN_RESUMED, {"after": "interruption"})


def _failed(reason: Reason, detail: str) -> Ending:
    return Ending(RunStatus.FAILED.value, reason.value, detail)


def _pausable(s: Session, step: Step | None) -> tuple[ToolRequest | None, str, str, bytes, bool]:
    """(request, why not, spec hash, spec text, the arguments fail the current schema)."""
    if step is None:
        return None, "no step was executing", "", b"", False
    d = step.decision
    if d is None or d.kind != DecisionKind.TOOL_CALL:
        return None, f"step {step.index} holds no tool call", "", b"", False
    registered = s.core.tools.get(d.tool)
    if registered is None:
        return None, f"tool {_q(d.tool)} is not registered", "", b"", False
    if d.invalid_args:
        return None, "its arguments are not usable JSON", "", b"", False
    try:
        spec, spec_hash, text, validator = registered.current()
    except ValueError as exc:
        return None, f"tool {_q(d.tool)}: {exc}", "", b"", False
    problem = check_args(validator, d.args)
    if problem is not None:
        return None, problem, "", b"", True
    return ToolRequest(s.run_id, step.id, spec, d.args or b"{}"), "", spec_hash, text, False


def _refuse_pause(s: Session, step: Step | None, why: str, schema: bool, detail: str) -> Run:
    end = None
    if schema and step is not None:
        obs = observation(ObservationKind.INVALID_DECISION.value, {"error": why},
                          f"invalid decision on recovery: {why}")
        end = StepEnd(replace(step, status=StepStatus.FAILED.value, observation=obs),
                      (step.status,), detail=obs.summary)
    return s.settle(ACTIVE, _failed(Reason.RECONCILE_CONFLICT, detail), end=end)


def _pause(s: Session, step: Step, request: ToolRequest, pd: PolicyDecision, now: datetime,
           entry: tuple[str, bytes]) -> Run:
    """Pause the interrupted call through the ordinary pause; its ``step.policy``
    carries the spec it names but no view and no policy id."""
    cleared = replace(step, observation=None, finished_at=None, policy_id="")
    event = pd.to_json()
    if entry[0]:
        event["spec_hash"] = entry[0]
    return s.pause(cleared, (step.status,), request, pd, dumps(event), now, ACTIVE, entry)


def _pause_interrupted(s: Session, step: Step, now: datetime) -> Run:
    request, why, spec_hash, text, schema = _pausable(s, step)
    if request is None:
        return _refuse_pause(
            s, step, why, schema,
            f"step {step.index} was interrupted while executing a tool call whose outcome "
            f"is unknown, and it cannot wait for an operator: {why}")
    shown = {"args": Raw(request.args), "tool": request.spec.name}
    pd = PolicyDecision(
        PolicyOutcome.REQUIRE_APPROVAL.value,
        "interrupted while executing; outcome unknown",
        INTERRUPTED_SIDE_EFFECT,
        dumps(sorted_map(shown)),
        dumps(sorted_map({**shown, "notice": NOTICE, "side_effect": request.spec.side_effect})),
    )
    return _pause(s, step, request, pd, now, (spec_hash, text))


def _reconcile(s: Session, run: Run, executing: Step | None, now: datetime) -> Run | None:
    core = s.core
    assert core.reconcile is not None and s.steps is not None
    view = RunView(copy_run(run), s.step_snapshot(len(s.steps)), s.approval_snapshot())
    try:
        rec = core.reconcile(view)
    except Exception as exc:  # noqa: BLE001 - a reconcile error fails the run
        return fit(lambda text: s.settle(ACTIVE, _failed(Reason.INTERNAL_ERROR,
                                                         f"reconcile: {text}")),
                   exception_text(exc))
    if not isinstance(rec, Reconciliation):
        close_if_coroutine(rec)
        return s.settle(ACTIVE, _failed(
            Reason.INTERNAL_ERROR,
            f"reconcile: returned {type(rec).__name__}, not a Reconciliation"))
    mistyped = _mistyped(rec)
    if mistyped:
        return s.settle(ACTIVE, _failed(Reason.INTERNAL_ERROR, f"reconcile: {mistyped}"))
    try:
        return _apply_reconciliation(s, rec, executing, now)
    except apsw.TooBigError as exc:
        return s.settle(ACTIVE, _failed(Reason.INTERNAL_ERROR, _too_big(rec, exc)))


def _too_big(rec: Reconciliation, exc: apsw.TooBigError) -> str:
    """Why a reconciliation SQLite cannot hold (past its length limit) failed the run."""
    pd = rec.pause
    sizes = [("detail", len(rec.detail.encode("utf-8", "replace"))),
             ("result", len(rec.result or b""))]
    if pd is not None:
        sizes += [("pause reason", len(pd.reason.encode("utf-8", "replace"))),
                  ("pause capability", len(pd.capability or b"")),
                  ("pause presentation", len(pd.presentation or b""))]
    name, size = max(sizes, key=lambda item: item[1])
    return f"reconcile: the {name} ({size} bytes) is too large to store ({exc})"


def _apply_reconciliation(s: Session, rec: Reconciliation, executing: Step | None,
                          now: datetime) -> Run | None:
    """Act on a well-typed reconciliation; a detail too large to store is clipped."""
    outcome = rec.outcome
    if outcome == ReconcileOutcome.CONTINUE:
        _continue(s, now)
        return None
    if outcome == ReconcileOutcome.COMPLETED:
        result = rec.result if rec.result is not None and rec.result.strip() else None
        problem = check_json(result) if result is not None else None
        if problem is not None:
            return s.settle(ACTIVE, _failed(Reason.INTERNAL_ERROR,
                                            f"reconcile: result is not usable JSON: {problem}"))
        return fit(lambda detail: s.settle(ACTIVE, Ending(
            RunStatus.COMPLETED.value, Reason.GOAL_COMPLETED.value,
            f"completed by reconciliation: {detail}", result=result or b"")), rec.detail)
    if outcome == ReconcileOutcome.CONFLICT:
        return fit(lambda detail: s.settle(ACTIVE, _failed(Reason.RECONCILE_CONFLICT, detail)),
                   rec.detail)
    if outcome == ReconcileOutcome.WAITING:
        return _reconcile_wait(s, rec, executing, now)
    return s.settle(ACTIVE, _failed(Reason.INTERNAL_ERROR,
                                    f"reconcile: unknown outcome {_q(outcome)}"))


def _mistyped(rec: Reconciliation) -> str:
    """Why a reconciliation holds a field its record cannot take, or '' (checked as
    a policy's decision is: a wrong type fails the run, not the resume)."""
    for name, value in (("outcome", rec.outcome), ("detail", rec.detail)):
        if not isinstance(value, str):
            return f"the reconciliation's {name} is {described(value)}, not a str"
    if rec.result is not None and not isinstance(rec.result, bytes):
        return f"the reconciliation's result is {described(rec.result)}, not JSON as bytes"
    pd = rec.pause
    if pd is not None and not isinstance(pd, PolicyDecision):
        return f"the reconciliation's pause is {described(pd)}, not a PolicyDecision"
    return mistyped_policy(pd, "the reconciliation's pause") if pd is not None else ""


def _reconcile_wait(s: Session, rec: Reconciliation, executing: Step | None,
                    now: datetime) -> Run:
    pd = rec.pause
    if pd is None:
        suffix = f": {rec.detail}" if rec.detail else ""
        return s.settle(ACTIVE, _failed(
            Reason.RECONCILE_CONFLICT,
            f"reconciliation asked to wait but gave no approval to wait for{suffix}"))
    if pd.outcome != PolicyOutcome.REQUIRE_APPROVAL:
        return s.settle(ACTIVE, _failed(
            Reason.INTERNAL_ERROR,
            f"reconcile: pause outcome {_q(pd.outcome)} is not require_approval"))
    for name, part in (("capability", pd.capability), ("presentation", pd.presentation)):
        problem = check_json(part) if part is not None and part.strip() else None
        if problem is not None:
            return s.settle(ACTIVE, _failed(
                Reason.INTERNAL_ERROR, f"reconcile: {name} is not usable JSON: {problem}"))
    request, why, spec_hash, text, schema = _pausable(s, executing)
    if request is None:
        return _refuse_pause(
            s, executing, why, schema,
            f"reconciliation asked to wait but no interrupted tool call can be paused ({why})")
    assert executing is not None
    return _pause(s, executing, request, pd, now, (spec_hash, text))

