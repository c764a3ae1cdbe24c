"""The step loop: limits, start, decide, validate, ask the policy, execute, record.

An ordinary step is four transactions: (1) the step starts, (2) the decision
is recorded before it is validated (so a malformed request is in the log
verbatim), (3) the policy's ruling commits with the tool's start (so the
runtime cannot act without the event that says it did), (4) the outcome. An
invalid decision, a denial, a pause, a completion or a failure is three.
"""

from __future__ import annotations

import base64
import copy
from datetime import datetime, timedelta
from typing import Any

import apsw

from agentrt.canonical import check_and_forms, check_json
from agentrt.driver.agent import StepInput
from agentrt.driver.checks import clipped, close_if_coroutine, fit
from agentrt.driver.core import policy_form
from agentrt.driver.errors import (
    CancelledError,
    DriverFunctionError,
    LimitError,
    ModelUnavailableError,
    find_cause,
)
from agentrt.driver.limits import check_before_step
from agentrt.driver.model import ModelCaller
from agentrt.driver.policy import RunView
from agentrt.driver.session import (
    RUNNING,
    WAITING,
    Ending,
    PreEvent,
    Session,
    StepEnd,
    blank_as_empty,
    encode,
    observation,
    require_latest,
)
from agentrt.driver.snapshot import Snapshot, copy_run
from agentrt.driver.stored import evolve
from agentrt.driver.toolrun import ToolOutcome, run_tool
from agentrt.driver.tools import check_args
from agentrt.errors import (
    EncodeError,
    LeaseLostError,
    RunLeasedError,
    RunStateError,
    exception_text,
)
from agentrt.events import EventType
from agentrt.gojson import Raw, encode_string, sorted_map
from agentrt.records import (
    Approval,
    ApprovalStatus,
    Decision,
    DecisionKind,
    ObservationKind,
    PolicyDecision,
    PolicyOutcome,
    Reason,
    Run,
    RunStatus,
    Step,
    StepStatus,
    ToolRequest,
    ToolSpec,
    approval_hash,
)
from agentrt.store.tx import StoreWriteError
from agentrt.store.writes import start_step, transition

__all__ = ["apply", "evaluate", "run_loop"]

DECIDING = (StepStatus.DECIDING.value,)
EXECUTING = (StepStatus.EXECUTING.value,)
# Enum values read once: ``Member.value`` is a Python-level property, and even
# ``Enum.MEMBER`` goes through the enum type's ``__getattr__`` hook (some ten
# times a module global); the loop reads a dozen per step.
_DONE = StepStatus.DONE.value
_FAILED = StepStatus.FAILED.value
_TOOL_CALL = DecisionKind.TOOL_CALL.value
_COMPLETE = DecisionKind.COMPLETE.value
_FAIL = DecisionKind.FAIL.value
_ALLOW = PolicyOutcome.ALLOW.value
_STEP_STARTED = EventType.STEP_STARTED.value
_STEP_DECIDED = EventType.STEP_DECIDED.value
_STEP_POLICY = EventType.STEP_POLICY.value
_STEP_TOOL_STARTED = EventType.STEP_TOOL_STARTED.value
_ORIGINS = frozenset(("", "model", "plan", "operator"))
SpecEntry = tuple[str, bytes]
Current = tuple[ToolSpec, str, bytes, Any]


def _q(text: str) -> str:
    return encode_string(text, html=False)


def run_loop(s: Session) -> Run:
    """Step until the run pauses or ends; return it as it then stands."""
    while True:
        try:
            result = _iteration(s)
        except EncodeError as exc:
            return s.fail_internal(str(exc), RUNNING)
        except apsw.TooBigError as exc:
            return s.fail_internal(too_big_text(exc), RUNNING)
        except (RunStateError, LeaseLostError) as exc:
            return s.lost(exc)
        if result is not None:
            return result


def too_big_text(exc: apsw.TooBigError) -> str:
    """Why a write failed past SQLite's length limit, where no narrower cause is known."""
    return f"a value given to the driver is too large to store ({exc})"


def _iteration(s: Session) -> Run | None:
    s.check_cancel()
    run = s.reload()
    if run.status != RUNNING[0]:
        return run
    if not s.lease.ok():
        return s.lost(None)
    if s.steps is None:
        problem = s.load()
        if problem:
            return s.fail_internal(problem, RUNNING)
    assert s.steps is not None
    stop = check_before_step(run, s.steps, s.core.now, s.signatures)
    if stop is not None:
        ending, pre = stop
        return s.settle(RUNNING, ending, pre=pre)
    step = _start_step(s, run)
    return _decide(s, run, step)


def _start_step(s: Session, run: Run) -> Step:
    core = s.core
    now = core.now()
    index = run.step_count
    step = Step(core.new_id(), s.run_id, index, DECIDING[0], started_at=now)
    with s.tx() as tx:
        start_step(tx, s.run_id, index, core.owner)
        stored = s.write_step(tx, step, None)
        # {"index": index} as the encoder writes it (an int is its digits).
        s.append(tx, step.id, now, _STEP_STARTED, b'{"index":%d}' % index)
    run.step_count += 1
    return stored


def _decide(s: Session, run: Run, step: Step) -> Run | None:
    core = s.core
    assert core.agent is not None and s.steps is not None
    model = None
    if core.model is not None:
        try:
            model = ModelCaller(
                config=core.model, store=core.store, run_id=s.run_id, step_id=step.id,
                step_started_at=step.started_at, owner=core.owner, lease=s.lease, now=core.now,
                wall=core.wall, new_id=core.new_id, observer=core.observer, cancel=s.cancel,
                in_flight=s.model_in_flight)
        except ModelUnavailableError as exc:  # the model's name() failed
            return _agent_failed(s, step, exc)
    current: dict[str, Current | ValueError] = {}
    for name, registered in core.tools.items():
        try:
            current[name] = registered.current()
        except ValueError as exc:  # the tool now states a spec it cannot compile
            current[name] = exc
    # Snapshots are immutable (each read is a copy): the policy is shown these same two.
    shown = (s.step_snapshot(step.index), s.approval_snapshot())
    given = StepInput(
        run=copy_run(run),
        steps=shown[0],
        approvals=shown[1],
        tools=[_copy_spec(c[0]) for c in current.values() if not isinstance(c, ValueError)],
        model=model,
        cancel=s.cancel,
    )
    try:
        decision = core.agent.decide(given)
    except Exception as exc:  # noqa: BLE001 - recorded as agent_error (or the limit it hit)
        return _agent_failed(s, step, exc)
    finally:
        if model is not None:
            model.close()
    if not isinstance(decision, Decision):
        close_if_coroutine(decision)
        err = TypeError(f"the agent returned {type(decision).__name__}, not a Decision")
        return _agent_failed(s, step, err)
    mistyped = _mistyped_text(decision)
    if mistyped:
        return _agent_failed(s, step, TypeError(mistyped))
    return _propose(s, run, step, decision, current, shown)


_DECISION_TEXT = ("kind", "tool", "reason", "message", "origin")


def _mistyped_text(decision: Decision) -> str:
    """Why a decision's text field is not text, or its arguments or result not raw
    JSON, or '' (records hold no floats or other values where the reference
    writes a string, and a dict is not the JSON bytes it would stand for)."""
    d = decision
    args, result = d.args, d.result
    if (isinstance(d.kind, str) and isinstance(d.tool, str) and isinstance(d.reason, str)
            and isinstance(d.message, str) and isinstance(d.origin, str)
            and (args is None or isinstance(args, (bytes, str)))
            and (result is None or isinstance(result, (bytes, str)))):
        return ""  # the usual decision; otherwise say which field, in this order:
    for name in _DECISION_TEXT:
        value = getattr(decision, name)
        if not isinstance(value, str):
            return f"the agent's decision has a {type(value).__name__} {name}, not a str"
    if args is not None and not isinstance(args, (bytes, str)):
        return (f"the agent's decision has a {type(args).__name__} args, "
                "not JSON as bytes or str")
    if result is not None and not isinstance(result, (bytes, str)):
        return (f"the agent's decision has a {type(result).__name__} result, "
                "not JSON as bytes or str")
    return ""


def _copy_spec(spec: ToolSpec) -> ToolSpec:
    """A copy of a tool's spec for the agent: ``copy.copy``, without its generic
    machinery for the usual exact ToolSpec."""
    if type(spec) is not ToolSpec:
        return copy.copy(spec)
    return ToolSpec(spec.name, spec.description, spec.input_schema, spec.side_effect,
                    spec.timeout, spec.terminal)


def _agent_failed(s: Session, step: Step, exc: Exception) -> Run | None:
    unwritten = find_cause(exc, StoreWriteError)
    if unwritten is not None:  # a model call's record met a full disk: not the agent's error
        raise unwritten
    # The driver's own clock or ids failed in a model call: stop as a crashed
    # driver would, the run left for a resume, as anywhere else in the loop.
    mine = find_cause(exc, DriverFunctionError) or _reused_call_id(exc)
    if mine is not None:
        raise mine
    if s.cancel.done:  # the deadline's timer may not have fired yet
        raise CancelledError(s.cancel.reason) from exc
    lost = find_cause(exc, LeaseLostError)
    if lost is not None or not s.lease.ok():
        return s.lost(lost or exc)
    limit = find_cause(exc, LimitError)
    if limit is not None:
        reason = limit.reason
    elif find_cause(exc, ModelUnavailableError) is not None:
        reason = Reason.MODEL_UNAVAILABLE.value
    else:
        reason = Reason.AGENT_ERROR.value
    failed = evolve(step, status=StepStatus.FAILED.value)

    def settle(text: str) -> Run:
        end = StepEnd(evolve(failed), DECIDING, detail=f"agent error: {text}")
        ending = Ending(RunStatus.FAILED.value, reason, text,
                        limit=reason != Reason.AGENT_ERROR.value)
        return s.settle(RUNNING, ending, end=end)

    return fit(settle, exception_text(exc))


def _reused_call_id(exc: Exception) -> apsw.ConstraintError | None:
    """The refusal of a model call's row whose id ``new_id()`` had already given
    (the driver says it as the id function's error), or None."""
    refused = find_cause(exc, apsw.ConstraintError)
    if refused is not None and str(refused).endswith("UNIQUE constraint failed: model_calls.id"):
        return refused
    return None


# -- the decision --------------------------------------------------------------


def _as_bytes(v: bytes | str | None) -> bytes | None:
    if v is None:
        return None
    data = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v
    return data if data.strip() else None


def _out_of_band(data: bytes, as_base64: bool) -> str:
    return base64.b64encode(data).decode("ascii") if as_base64 else data.decode("utf-8")


#: The arguments' policy form and canonical form (b"" when absent or not usable).
ArgsForms = tuple[bytes, bytes]
_NO_FORMS: ArgsForms = (b"", b"")


def _normalise(decision: Decision) -> tuple[Decision, Decision, str | None, ArgsForms]:
    """(the decision with blank values absent, its recorded form, the args' JSON
    problem, the args' forms).

    Arguments or a result that are not usable JSON are kept out of band, as text
    (base64 for both when either is not UTF-8), so the log holds them verbatim.
    """
    args, result = _as_bytes(decision.args), _as_bytes(decision.result)
    d = decision
    original = Decision(d.kind, d.tool, args, d.reason, result, d.message, d.origin,
                        d.invalid_args, d.invalid_result, d.invalid_base64)
    args_problem, forms = None, _NO_FORMS
    if args is not None:
        args_problem, policy_args, canonical_args = check_and_forms(args)
        forms = (policy_args, canonical_args)
    result_problem = check_json(result) if result is not None else None
    if (args_problem is None and result_problem is None and d.invalid_args == ""
            and d.invalid_result == "" and d.invalid_base64 is False):
        return original, original, None, forms  # the usual case: both forms are one
    recorded = Decision(d.kind, d.tool, args, d.reason, result, d.message, d.origin)
    if args_problem is not None or result_problem is not None:
        bad = [b for b, p in ((args, args_problem), (result, result_problem))
               if b is not None and p is not None]
        as_b64 = False
        for b in bad:
            try:
                b.decode("utf-8")
            except UnicodeDecodeError:
                as_b64 = True
        if args is not None and args_problem is not None:
            recorded.invalid_args = _out_of_band(args, as_b64)
            recorded.args = None
        if result is not None and result_problem is not None:
            recorded.invalid_result = _out_of_band(result, as_b64)
            recorded.result = None
        recorded.invalid_base64 = as_b64
    return original, recorded, args_problem, forms


def _record_decision(s: Session, step: Step, recorded: Decision, entry: SpecEntry,
                     now: Any) -> Step:
    """Transaction #2: the decision as recorded, its tool's spec, ``step.decided``."""
    new = evolve(step, decision=recorded, spec_hash=entry[0])
    with s.tx() as tx:
        stored = s.write_step(tx, new, DECIDING, running=True)
        s.put_spec(tx, *entry)
        s.append(tx, step.id, now, _STEP_DECIDED, s.decision_json().encode("utf-8"))
    return stored


def _unstorable_decision(s: Session, step: Step, recorded: Decision, entry: SpecEntry,
                         now: Any, exc: apsw.TooBigError) -> tuple[Step, str]:
    """(the step, why it is invalid) for a decision SQLite cannot hold (past its
    length limit): it is recorded with its kind, tool and origin only (or, if even
    those are too large, as an empty decision), and is an invalid decision that
    says so; unrecorded, it raised out of the loop with the step left deciding."""
    s.specs_written.discard(entry[0])  # its put may have been rolled back
    size = len(encode(recorded.to_json()))
    problem = f"the decision ({size} bytes as JSON) is too large to store ({exc})"
    if len(entry[1]) > size:
        problem = (f"the spec of tool {_q(clipped(recorded.tool))} ({len(entry[1])} bytes) "
                   f"is too large to store ({exc})")
    try:
        kept = Decision(recorded.kind, recorded.tool, origin=recorded.origin)
        return _record_decision(s, step, kept, ("", b""), now), problem
    except apsw.TooBigError:
        return _record_decision(s, step, Decision(""), ("", b""), now), problem


def _invalid(d: Decision, validator: Any, args_problem: str | None, spec_problem: str,
             registered: bool) -> str | None:
    if d.origin not in _ORIGINS:
        return f"unknown decision origin {_q(d.origin)}"
    kind = d.kind
    if kind == _COMPLETE:
        if d.result is not None:
            problem = check_json(d.result)
            if problem is not None:
                return f"result is not usable JSON: {problem}"
        return None
    if kind == _FAIL:
        return None
    if kind == _TOOL_CALL:
        if not d.tool:
            return "tool_call without a tool name"
        if not registered:
            return f"unknown tool {_q(d.tool)}"
        if spec_problem:
            return spec_problem
        if args_problem is not None:
            return f"arguments are not usable JSON: {args_problem}"
        return check_args(validator, d.args, checked=True)
    if kind == "":
        return "decision has no kind"
    if kind == DecisionKind.TRUNCATED:
        return "the reply was cut off by the output cap before a tool call"
    if kind == DecisionKind.NO_TOOL_CALL:
        return "the reply contained no tool call"
    return f"unknown decision kind {_q(kind)}"


def _propose(s: Session, run: Run, step: Step, decision: Decision,
             current: dict[str, Current | ValueError],
             shown: tuple[Snapshot[Step], Snapshot[Approval]]) -> Run | None:
    core = s.core
    original, recorded, args_problem, forms = _normalise(decision)
    found = current.get(original.tool) if original.kind == _TOOL_CALL else None
    spec: ToolSpec | None = None
    validator: Any = None
    entry: SpecEntry = ("", b"")
    spec_problem = ""
    if isinstance(found, ValueError):
        spec_problem = f"tool {_q(original.tool)}: {found}"
    elif found is not None:
        spec, spec_hash, text, validator = found
        entry = (spec_hash, text)
    now = core.now()
    problem: str | None
    try:
        stored = _record_decision(s, step, recorded, entry, now)
    except apsw.TooBigError as exc:
        stored, problem = _unstorable_decision(s, step, recorded, entry, now, exc)
    else:
        problem = _invalid(original, validator, args_problem, spec_problem, found is not None)
    if problem is not None:
        obs = observation(ObservationKind.INVALID_DECISION.value, {"error": problem},
                          f"invalid decision: {problem}")
        s.end_step(StepEnd(evolve(stored, status=StepStatus.FAILED.value, observation=obs),
                           DECIDING, detail=obs.summary))
        return None
    if original.kind == _COMPLETE:
        done = StepEnd(evolve(stored, status=_DONE), DECIDING)
        return s.settle(RUNNING, Ending(RunStatus.COMPLETED.value, Reason.GOAL_COMPLETED.value,
                                        result=original.result or b""), end=done)
    if original.kind == _FAIL:
        done = StepEnd(evolve(stored, status=_DONE), DECIDING)
        return s.settle(RUNNING, Ending(RunStatus.FAILED.value, Reason.GOAL_FAILED.value,
                                        original.message), end=done)
    assert spec is not None
    request = ToolRequest(s.run_id, step.id, spec, original.args or b"{}")
    policy_args, canonical_args = forms
    if canonical_args:
        # The loop check's key for these arguments (limits._signature): the
        # canonical form just made with their check, hashed only for a loop found.
        s.signatures[step.id] = canonical_args
    # The policy gets copies to keep or change; the record says what it was shown.
    pd, perr = evaluate(s, request, RunView(copy_run(run), *shown), policy_args or None)
    return apply(s, stored, DECIDING, request, pd, perr, RunView(run, *shown), entry)


def evaluate(s: Session, request: ToolRequest, view: RunView, args_form: bytes | None = None,
             ) -> tuple[PolicyDecision | None, BaseException | None]:
    """Ask the policy about the request in policy form (``args_form``: the arguments'
    policy form, when already made); its exception is a policy error."""
    try:
        pd = s.core.policy.evaluate(policy_form(request, args_form), view)
    except Exception as exc:  # noqa: BLE001 - a policy error fails the run, not the driver
        return None, exc
    if not isinstance(pd, PolicyDecision):
        close_if_coroutine(pd)
        return None, TypeError(f"the policy returned {type(pd).__name__}, not a PolicyDecision")
    cap, pres = pd.capability, pd.presentation
    if not (isinstance(pd.outcome, str) and isinstance(pd.reason, str)
            and isinstance(pd.kind, str) and (cap is None or isinstance(cap, bytes))
            and (pres is None or isinstance(pres, bytes))):
        return None, TypeError(mistyped_policy(pd))
    return pd, None


def mistyped_policy(pd: PolicyDecision, whose: str = "the policy's decision") -> str:
    """Why a policy decision holds a field of the wrong type, or ''."""
    texts: tuple[tuple[str, object], ...] = (
        ("outcome", pd.outcome), ("reason", pd.reason), ("kind", pd.kind))
    for name, value in texts:
        if not isinstance(value, str):
            return f"{whose} has a {type(value).__name__} {name}, not a str"
    parts: tuple[tuple[str, object], ...] = (
        ("capability", pd.capability), ("presentation", pd.presentation))
    for name, value in parts:
        if value is not None and not isinstance(value, bytes):
            return (f"{whose} has a {type(value).__name__} {name}, not JSON "
                    "as bytes (PolicyDecision.need_approval encodes a value)")
    return ""


# -- the policy's ruling -------------------------------------------------------


def policy_event(pd: PolicyDecision, policy_id: str, spec_hash: str,
                 view: RunView | None) -> bytes:
    """``step.policy``: the decision, then the policy's identity, the spec it judged,
    and a summary of the view it was shown."""
    out = pd.to_json()
    if policy_id:
        out["policy_id"] = policy_id
    if spec_hash:
        out["spec_hash"] = spec_hash
    if view is not None:
        r = view.run
        out["view"] = {
            "status": r.status,
            "step_count": r.step_count,
            "model_calls": r.model_calls,
            "input_tokens": r.usage.input_tokens,
            "output_tokens": r.usage.output_tokens,
            "cached_input_tokens": r.usage.cached_input_tokens,
            "estimated_cost_micros": r.estimated_cost_micros,
            "active_ms": r.active_ms,
            "steps": len(view.steps),
            "approvals": len(view.approvals),
        }
    return encode(out)


def _same_grant(pd: PolicyDecision, request: ToolRequest, grant: Approval) -> bool:
    """Whether the policy asks again for exactly the approval granted, hashed as the
    pause hashed it (a blank capability or presentation is ``{}``)."""
    try:
        digest = approval_hash(pd.kind, blank_as_empty(pd.capability),
                               blank_as_empty(pd.presentation), request)
    except (ValueError, TypeError) as exc:
        raise EncodeError(f"approval hash: {exc}") from exc
    return digest == grant.hash


def apply(
    s: Session,
    step: Step,
    expected: tuple[str, ...],
    request: ToolRequest,
    pd: PolicyDecision | None,
    perr: BaseException | None,
    view: RunView,
    entry: SpecEntry,
    grant: Approval | None = None,
    resumed_at: Any = None,
) -> Run | None:
    """Act on the policy's ruling; shared by the loop and by an approved resume."""
    core = s.core
    from_ = WAITING if grant is not None else RUNNING
    # This function's own copy of the step: changed in place below.
    step = evolve(step, policy_id=core.policy_id,
                  # the approval wait is not active time
                  started_at=resumed_at if grant is not None else step.started_at)
    if perr is not None or pd is None:
        text = exception_text(perr) if perr is not None else "None"
        return _policy_failed(s, step, expected, from_, text, grant=grant)
    paused = step.policy  # the ruling a resumed step was paused on (None otherwise)
    try:
        return _rule(s, step, expected, request, pd, view, entry, grant, resumed_at)
    except apsw.TooBigError as exc:
        # Raised before the tool started (an outcome too large is a tool error).
        step.policy = paused  # _rule set the ruling that could not be stored
        s.specs_written.discard(entry[0])  # its put may have been rolled back
        size = _ruling_size(pd, core.policy_id, entry[0], view)
        return _policy_failed(s, step, expected, from_,
                              f"the ruling ({size} bytes as JSON) is too large to store ({exc})",
                              entry, grant=grant)


def _ruling_size(pd: PolicyDecision, policy_id: str, spec_hash: str, view: RunView) -> int:
    """The bytes of ``step.policy`` for the ruling (without capability and presentation
    when they are not JSON: that ruling is recorded without them)."""
    try:
        return len(policy_event(pd, policy_id, spec_hash, view))
    except EncodeError:
        reduced = PolicyDecision(pd.outcome, pd.reason, pd.kind)
        return len(policy_event(reduced, policy_id, spec_hash, view))


def _policy_failed(s: Session, step: Step, expected: tuple[str, ...], from_: tuple[str, ...],
                   text: str, entry: SpecEntry = ("", b""), *,
                   grant: Approval | None = None) -> Run:
    """A policy error: the run fails as internal_error, the step with it, and no
    ``step.policy`` is written; an error text too large to store is clipped."""
    failed = evolve(step, status=StepStatus.FAILED.value)

    def settle(text: str) -> Run:
        end = StepEnd(evolve(failed), expected, detail=f"policy error: {text}")
        return s.settle(from_, Ending(RunStatus.FAILED.value, Reason.INTERNAL_ERROR.value,
                                      f"policy: {text}"), end=end, spec_entry=entry,
                        grant=grant)

    return fit(settle, text)


def _rule(s: Session, step: Step, expected: tuple[str, ...], request: ToolRequest,
          pd: PolicyDecision, view: RunView, entry: SpecEntry, grant: Approval | None,
          resumed_at: Any) -> Run | None:
    """:func:`apply` for a ruling the policy gave."""
    core = s.core
    from_ = WAITING if grant is not None else RUNNING
    policy_at = resumed_at if grant is not None else core.now()
    parts = (() if pd.capability is None and pd.presentation is None  # allow, deny: none
             else (("capability", pd.capability), ("presentation", pd.presentation)))
    for name, part in parts:
        problem = check_json(part) if part is not None and part.strip() else None
        if problem is not None:
            reduced = PolicyDecision(pd.outcome, pd.reason, pd.kind)
            detail = f"policy: {name} is not usable JSON: {problem}"
            reduced_event = PreEvent(step.id, policy_at, EventType.STEP_POLICY.value,
                                     policy_event(reduced, core.policy_id, entry[0], view))
            end = StepEnd(evolve(step, policy=reduced, status=StepStatus.FAILED.value),
                          expected, detail=detail)
            return s.settle(from_, Ending(RunStatus.FAILED.value, Reason.INTERNAL_ERROR.value,
                                          detail), end=end, pre=[reduced_event],
                            spec_entry=entry, grant=grant)
    step.policy = pd
    event = policy_event(pd, core.policy_id, entry[0], view)
    outcome = pd.outcome
    tool = request.spec.name
    if outcome == _ALLOW or (
            grant is not None and outcome == PolicyOutcome.REQUIRE_APPROVAL
            and _same_grant(pd, request, grant)):
        return execute(s, step, expected, request, event, policy_at, entry, grant)
    if outcome == PolicyOutcome.DENY:
        suffix = " on resume" if grant is not None else ""
        obs = observation(ObservationKind.POLICY_DENIED.value, {"reason": pd.reason, "tool": tool},
                          f"denied{suffix}: {pd.reason}")
        end = StepEnd(evolve(step, status=StepStatus.FAILED.value, observation=obs), expected,
                      detail=obs.summary)
        _end_with_policy(s, end, event, policy_at, entry, grant, resumed_at)
        return None
    pre = [PreEvent(step.id, policy_at, EventType.STEP_POLICY.value, event)]
    if outcome == PolicyOutcome.ABORT:
        obs = observation(ObservationKind.POLICY_DENIED.value, {"reason": pd.reason, "tool": tool},
                          f"aborted: {pd.reason}")
        end = StepEnd(evolve(step, status=StepStatus.FAILED.value, observation=obs), expected,
                      detail=obs.summary)
        return s.settle(from_, Ending(RunStatus.FAILED.value, Reason.POLICY_ABORT.value,
                                      pd.reason), end=end, pre=pre, spec_entry=entry,
                        grant=grant)
    if outcome == PolicyOutcome.REQUIRE_APPROVAL:
        return s.pause(step, expected, request, pd, event, policy_at, from_, entry,
                       grant=grant)
    end = StepEnd(evolve(step, status=StepStatus.FAILED.value), expected,
                  detail="unknown policy outcome")
    return s.settle(from_, Ending(RunStatus.FAILED.value, Reason.INTERNAL_ERROR.value,
                                  f"unknown policy outcome {_q(outcome)}"),
                    end=end, pre=pre, spec_entry=entry, grant=grant)


def resume_run(s: Session, grant: Approval, resumed_at: Any, wall_at: Any, tx: Any) -> None:
    """Inside a transaction: the approved WAITING run becomes RUNNING under this
    session's lease, with ``run.resumed`` naming the grant.

    The grant must still be the step's latest approval, and approved: a slower
    resumer that read it before another process paused the step again (a new
    approval, the run WAITING as before) would otherwise act on a replaced
    grant, and run the tool a second time that no one approved. The run is
    checked first: a resumer that lost the race to expire the grant (the run
    ended) is told the run is no longer waiting, not of a pause that never was;
    the transaction undoes the move when the grant is refused."""
    transition(tx, s.run_id, WAITING, RunStatus.RUNNING.value, lease_owner=s.core.owner,
               lease_expires=wall_at + s.core.lease_ttl)
    require_latest(tx, grant, ApprovalStatus.APPROVED.value)
    s.lease.taking()  # the compare-and-set above refuses a concurrent resume's loser first
    s.append(tx, grant.step_id, resumed_at, EventType.RUN_RESUMED, {"approval_id": grant.id})


def _end_with_policy(s: Session, end: StepEnd, event: bytes, policy_at: Any, entry: SpecEntry,
                     grant: Approval | None, resumed_at: Any) -> None:
    """A denial: ``step.policy`` and the failed step in one transaction (which, on
    resume, also moves the run back to RUNNING)."""
    core = s.core
    step_at = core.now()
    wall_at = core.wall()
    with s.tx() as tx:
        if grant is not None:
            resume_run(s, grant, resumed_at, wall_at, tx)
        s.put_spec(tx, *entry)
        s.append(tx, end.step.id, policy_at, EventType.STEP_POLICY, event)
        s.end_in_tx(tx, end, step_at, running=grant is None)
    if grant is not None:
        s.lease.start(wall_at)


# -- the tool ------------------------------------------------------------------


def grant_expired(s: Session, grant: Approval, at: datetime) -> bool:
    """Whether the run's grant TTL has passed at ``at`` since the grant was decided."""
    assert s.run is not None
    ttl = s.run.limits.grant_ttl
    return ttl > timedelta(0) and grant.decided_at is not None and at > grant.decided_at + ttl


def execute(s: Session, step: Step, expected: tuple[str, ...], request: ToolRequest,
            event: bytes, policy_at: Any, entry: SpecEntry, grant: Approval | None) -> Run | None:
    """Commit the ruling with the tool's start, run the tool, record what came of it.

    ``step`` is :func:`apply`'s own copy, which becomes the executing step."""
    core = s.core
    start_at = core.now() if grant is not None else policy_at
    if grant is not None and grant_expired(s, grant, start_at):
        # Spec 13: executing a grant judges its TTL again by the tool start's own
        # reading; a policy asked again at resume may have taken past it.
        from agentrt.driver.approvals import expire  # approvals imports this module

        return expire(core.store, core.observer, grant, start_at)
    executing = step
    executing.status = EXECUTING[0]
    if grant is not None:
        executing.started_at = start_at
    started: bytes | dict[str, Any]
    if grant is None:
        # {"args": Raw(request.args), "tool": ...} as encode writes it, without
        # compacting and checking the arguments again (a Raw costs a dozen times
        # its bytes here): they passed their check (_invalid), and the decision
        # just recorded holds them as Raw is written, compacted and escaped.
        assert step.decision is not None
        started = b'{"args":%b,"tool":%b}' % (step.decision.args or b"{}",
                                               encode(request.spec.name))
    else:
        started = {"approval_id": grant.id, "args": Raw(request.args),
                   "tool": request.spec.name}
    with s.tx() as tx:
        # Read once the write lock is held: BEGIN IMMEDIATE may wait up to the
        # busy timeout, and the tool must not start on a lease that ran out meanwhile.
        wall_at = core.wall()
        if grant is not None:
            resume_run(s, grant, policy_at, wall_at, tx)
            stored = s.write_step(tx, executing, expected)
        else:
            # check_run(..., live_at=wall_at) and the write, in one statement
            # while the lease expiry last read is still the stored one.
            stored = s.write_step(tx, executing, expected, live_at=wall_at)
        s.put_spec(tx, *entry)
        s.append(tx, step.id, policy_at, _STEP_POLICY, event)
        s.append(tx, step.id, start_at, _STEP_TOOL_STARTED, started)
    if grant is not None:
        s.lease.start(wall_at)
    tool = core.tools[request.spec.name].tool
    outcome = run_tool(s.worker, tool, request.spec, s.run_id, step.id, request.args, s.cancel,
                       core.monotonic)
    return _record_tool(s, stored, request.spec, outcome)


def _record_tool(s: Session, step: Step, spec: ToolSpec, outcome: ToolOutcome, *,
                 first: bool = True) -> Run | None:
    """Record the outcome whatever the caller's cancellation says; after an
    operator's cancel, append it late instead."""
    obs = outcome.observation
    failed = obs.failure
    end = StepEnd(
        evolve(step, status=_FAILED if failed else _DONE,
                observation=obs),
        EXECUTING, detail=obs.summary if failed else "", tool=spec.name,
        duration_ms=outcome.duration_ms)
    result: Run | None = None
    try:
        if outcome.abort is not None:
            result = s.settle(RUNNING, Ending(RunStatus.FAILED.value, Reason.TOOL_ABORT.value,
                                              outcome.abort), end=end, detached=True)
        elif spec.terminal and not failed:
            result = s.settle(RUNNING, Ending(RunStatus.COMPLETED.value,
                                              Reason.GOAL_COMPLETED.value,
                                              f"terminal tool {spec.name}",
                                              result=outcome.content), end=end, detached=True)
        else:
            s.end_step(end, detached=True)
    except apsw.TooBigError as exc:
        if not first:  # the tool ran: no ruling's failure (apply would call it one)
            return s.fail_internal(too_big_text(exc), RUNNING)
        return _record_tool(s, step, spec, _too_big(spec, outcome, exc), first=False)
    except RunLeasedError as exc:
        raise LeaseLostError(exc.detail) from exc
    except RunStateError as exc:
        late = _record_late(s, step, spec, outcome)
        return late if late is not None else s.lost(exc)
    if outcome.cancelled:
        raise CancelledError(s.cancel.reason)
    return result


def _too_big(spec: ToolSpec, outcome: ToolOutcome, exc: apsw.TooBigError) -> ToolOutcome:
    """An outcome SQLite cannot hold (past its length limit) as a tool error saying so:
    unrecorded, the step stayed executing and a resume asked whether the tool ran."""
    obs = outcome.observation
    size = len(obs.content or b"") + len(obs.summary.encode("utf-8", "surrogatepass"))
    error = f"the tool's outcome ({size} bytes of {obs.kind}) is too large to store: {exc}"
    too_big = observation(ObservationKind.TOOL_ERROR.value, {
        "error": error, "failure": "invalid_content", "tool": spec.name},
        f"{spec.name} returned {error}")
    abort = clipped(outcome.abort) if outcome.abort is not None else None
    return ToolOutcome(too_big, outcome.duration_ms, abort=abort, cancelled=outcome.cancelled)


def _record_late(s: Session, step: Step, spec: ToolSpec, outcome: ToolOutcome, *,
                 first: bool = True) -> Run | None:
    """An operator cancelled the run while the tool ran: the run stays cancelled and
    the step keeps what the cancel wrote, and the tool's outcome is appended after
    ``run.finished`` as a late ``step.tool_finished``."""
    core = s.core
    obs = outcome.observation
    at = core.now()
    payload: dict[str, Any] = {
        "duration_ms": outcome.duration_ms,
        "late": True,
        "observation": Raw(encode(obs.to_json())),
        "tool": spec.name,
    }
    if obs.kind == ObservationKind.TOOL_RESULT:
        payload["summary"] = obs.summary
        payload["content_hash"] = obs.content_hash
    try:
        with core.store.tx(core.observer) as tx:
            row = tx.one("SELECT status, reason FROM runs WHERE id = ?", (s.run_id,))
            if row is None or (str(row[0]), str(row[1])) != (
                    RunStatus.CANCELLED.value, Reason.OPERATOR_CANCELLED.value):
                return None
            tx.append(s.run_id, step.id, at, EventType.STEP_TOOL_FINISHED.value,
                      sorted_map(payload))
    except apsw.TooBigError as exc:  # appended as the tool error saying so, as on time
        if not first:
            raise
        return _record_late(s, step, spec, _too_big(spec, outcome, exc), first=False)
    return s.reload()
