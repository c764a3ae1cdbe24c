"""Approvals: deciding one, letting one expire, and resuming a run on a grant.

An approval binds the exact request it was asked for by a hash (kind,
capability, presentation, the request with the tool's whole spec). A decision
is compare-and-set on that hash, so an operator who approved what was shown
cannot approve something else. Resume acts only on the step's latest approval,
re-checks the arguments against the current schema and asks the policy again:
the grant is permission for that request, not a bypass of the rules. Expiry is
judged lazily, when the approval is next touched, by the caller's clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime

import apsw

from agentrt.driver.checks import check_text
from agentrt.driver.errors import ConfigError
from agentrt.driver.loop import apply, evaluate, grant_expired, resume_run
from agentrt.driver.policy import RunView
from agentrt.driver.session import WAITING, Session, StepEnd, observation, require_latest
from agentrt.driver.tools import check_args
from agentrt.errors import (
    ApprovalChangedError,
    ApprovalExpiredError,
    ApprovalHashError,
    NotPendingError,
    RunStateError,
    described,
)
from agentrt.events import EventType, Observer
from agentrt.gojson import dumps, sorted_map
from agentrt.records import (
    Approval,
    ApprovalStatus,
    ObservationKind,
    Reason,
    Run,
    RunStatus,
    Step,
    StepStatus,
    ToolRequest,
    approval_hash,
)
from agentrt.store import Store
from agentrt.store.tx import Tx
from agentrt.store.writes import (
    decide_approval,
    expire_approval,
    read_approval,
    read_run,
    set_step_outcome,
    transition,
)

__all__ = ["check_operator", "check_shown", "decide", "expire", "refusing_too_big",
           "resume_approved", "verify_hash"]


def check_operator(run_id: object, by: object, note: object,
                   approval_id: object = "") -> None:
    """Refuse an operator call's arguments before anything is read or written: a
    decision must name who made it, in text, and say what it says in text."""
    check_text("run_id", run_id)
    check_text("approval_id", approval_id)
    check_text("by", by, blank="a decision must name who made it")
    check_text("note", note)


@contextmanager
def refusing_too_big(action: str, by: str, note: str) -> Iterator[None]:
    """Around an operator's transaction: a ``by`` or ``note`` SQLite cannot hold
    (past its length limit) is refused in one sentence, the transaction rolled back,
    where it raised apsw.TooBigError."""
    try:
        yield
    except apsw.TooBigError as exc:
        name, value = max((("note", note), ("by", by)),
                          key=lambda nv: len(nv[1].encode("utf-8", "surrogatepass")))
        raise ConfigError(f"{action}: {name} is {len(value)} characters, too large to store "
                          f"({exc}); nothing was changed") from None


def check_shown(shown_hash: object) -> str:
    """The hash an ``*_shown`` decision is bound to: a str (empty is refused later, as
    the reference does, as no hash shown)."""
    if not isinstance(shown_hash, str):
        raise ConfigError(
            f"shown_hash is {described(shown_hash)}, not a str: a decision bound to what "
            "was shown needs the hash that was shown (use approve or reject for one "
            "that is not bound)")
    return shown_hash


def _rfc3339(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ") if t is not None else ""


def _expired_text(a: Approval) -> str:
    if a.expires_at is not None:
        return f"approval {a.id} expired at {_rfc3339(a.expires_at)}"
    return f"approval {a.id} has expired"


def verify_hash(a: Approval) -> None:
    """Refuse an approval whose stored hash is not the hash of its stored request."""
    if a.decode_error or a.request is None:
        raise ApprovalHashError(
            f"approval {a.id} does not decode: {a.decode_error or 'it has no request'}")
    try:
        digest = approval_hash(a.kind, a.capability, a.presentation, a.request)
    except (ValueError, TypeError) as exc:
        raise ApprovalHashError(f"approval {a.id}: {exc}") from exc
    if digest != a.hash:
        raise ApprovalHashError(f"approval {a.id}")


def _check(a: Approval, shown: str | None) -> None:
    if a.status == ApprovalStatus.EXPIRED:
        raise ApprovalExpiredError(_expired_text(a))
    if a.status != ApprovalStatus.PENDING:
        raise NotPendingError(f"approval {a.id} is already {a.status}")
    if shown is not None and shown != a.hash:
        raise ApprovalChangedError(
            f"approval {a.id}: the hash shown was {shown}, it is now {a.hash}")
    verify_hash(a)


def _finished(tx: Tx, run_id: str, at: datetime, status: str, reason: str, detail: str,
              by: str = "") -> Run:
    run = read_run(tx, run_id)
    payload = {"detail": detail, "reason": reason, "status": status, "steps": run.step_count}
    if by:
        payload["by"] = by
    tx.append(run_id, "", at, EventType.RUN_FINISHED.value, sorted_map(payload))
    return run


def expire(store: Store, observer: Observer | None, a: Approval, now: datetime) -> Run:
    """The approval (pending, or an approved grant past its grant TTL) expires and
    the waiting run is cancelled as approval_expired.

    The run moves first: a caller that lost the race to expire it (a concurrent
    resume or decision) is told the run is no longer waiting, as any later call is.
    """
    detail = f"approval {a.id} expired"
    with store.tx(observer) as tx:
        transition(tx, a.run_id, WAITING, RunStatus.CANCELLED.value,
                   reason=Reason.APPROVAL_EXPIRED.value, detail=detail, finished_at=now)
        if a.status == ApprovalStatus.APPROVED:  # a grant read before a later pause
            require_latest(tx, a, a.status)
            # ... or before another resume acted on it: its step moved on, and the run
            # may be WAITING on a later step's approval, which this must not cancel.
            step = tx.one("SELECT status FROM steps WHERE id = ?", (a.step_id,))
            if step is None or str(step[0]) != StepStatus.AWAITING_APPROVAL.value:
                raise RunStateError(
                    f"approval {a.id} was already acted on: step {a.step_id} is "
                    f"{step[0] if step is not None else 'gone'}, not awaiting_approval")
        pending = a.status == ApprovalStatus.PENDING
        if not expire_approval(tx, a.id, a.status, now if pending else None):
            raise NotPendingError(f"approval {a.id} is no longer {a.status}")
        tx.append(a.run_id, a.step_id, now, EventType.APPROVAL_DECIDED.value,
                  {"approval_id": a.id, "status": ApprovalStatus.EXPIRED.value})
        run = _finished(tx, a.run_id, now, RunStatus.CANCELLED.value,
                        Reason.APPROVAL_EXPIRED.value, detail)
    return run


def decide(
    store: Store,
    observer: Observer | None,
    clock: Callable[[], datetime],
    run_id: str,
    approval_id: str,
    *,
    approve: bool,
    by: str,
    note: str,
    shown_hash: str | None = None,
) -> Approval:
    """Approve or reject a pending approval of a waiting run.

    Approving leaves the run WAITING (only a resume executes); rejecting fails
    the awaiting step and cancels the run as approval_rejected. ``shown_hash``
    binds the decision to the approval the person was shown.
    """
    check_operator(run_id, by, note, approval_id)
    run = store.get_run(run_id)
    if run.status != RunStatus.WAITING_FOR_APPROVAL:
        raise RunStateError(f"run {run_id} is {run.status}, not waiting for approval")
    a = store.get_approval(run_id, approval_id)
    if shown_hash is not None and not shown_hash:
        raise ApprovalChangedError(f"approval {approval_id}: no hash was shown")
    _check(a, shown_hash)
    now = clock()
    if a.expires_at is not None and now > a.expires_at:
        expire(store, observer, a, now)
        raise ApprovalExpiredError(_expired_text(a))
    status = ApprovalStatus.APPROVED.value if approve else ApprovalStatus.REJECTED.value
    action = f"{'approve' if approve else 'reject'} approval {approval_id}"
    with refusing_too_big(action, by, note), store.tx(observer) as tx:
        state = tx.one("SELECT status FROM runs WHERE id = ?", (run_id,))
        if state is None or state[0] != RunStatus.WAITING_FOR_APPROVAL:
            current = state[0] if state is not None else "gone"
            raise RunStateError(f"run {run_id} is {current}, not waiting for approval")
        fresh = read_approval(tx, run_id, approval_id)
        if fresh is None:
            raise NotPendingError(f"approval {approval_id} is gone")
        _check(fresh, shown_hash if shown_hash is not None else a.hash)
        if not decide_approval(tx, approval_id, status, now, by, note, fresh.hash):
            raise NotPendingError(f"approval {approval_id} was decided meanwhile")
        tx.append(run_id, a.step_id, now, EventType.APPROVAL_DECIDED.value, sorted_map({
            "approval_id": approval_id, "by": by, "note": note, "status": status}))
        if not approve:
            obs = observation(ObservationKind.POLICY_DENIED.value,
                              {"approval_id": approval_id, "note": note},
                              f"approval rejected: {note}")
            with contextlib.suppress(RunStateError):  # a step no longer waiting stays as is
                set_step_outcome(tx, a.step_id, (StepStatus.AWAITING_APPROVAL.value,),
                                 StepStatus.FAILED.value, dumps(obs.to_json()),
                                 obs.content_hash, now)
            transition(tx, run_id, WAITING, RunStatus.CANCELLED.value,
                       reason=Reason.APPROVAL_REJECTED.value, detail=note, finished_at=now)
            _finished(tx, run_id, now, RunStatus.CANCELLED.value,
                      Reason.APPROVAL_REJECTED.value, note)
    return store.get_approval(run_id, approval_id)


def resume_approved(s: Session) -> Run | None:
    """Continue a WAITING run on its grant; None means the loop goes on."""
    core = s.core
    problem = s.load()
    if problem:
        return s.fail_internal(problem, WAITING)
    assert s.run is not None and s.steps is not None and s.approvals is not None
    awaiting = next((st for st in reversed(s.steps)
                     if st.status == StepStatus.AWAITING_APPROVAL), None)
    if awaiting is None:
        raise RunStateError(f"run {s.run_id} is waiting but has no awaiting step")
    grant = next((a for a in reversed(s.approvals) if a.step_id == awaiting.id), None)
    if grant is None:
        raise RunStateError(f"run {s.run_id}: step {awaiting.id} has no approval")
    if grant.status == ApprovalStatus.PENDING and grant.expires_at is not None:
        now = core.now()
        if now > grant.expires_at:
            return expire(core.store, core.observer, grant, now)
    if grant.status != ApprovalStatus.APPROVED:
        raise RunStateError(
            f"the latest approval for step {awaiting.id} is {grant.status}, not approved")
    verify_hash(grant)
    assert grant.request is not None
    registered = core.tools.get(grant.request.spec.name)
    if registered is None:
        raise ConfigError(f'approved tool "{grant.request.spec.name}" is not registered')
    try:
        spec, spec_hash, text, validator = registered.current()
    except ValueError as exc:
        raise ConfigError(f'approved tool "{grant.request.spec.name}": {exc}; the run is '
                          "left waiting") from exc
    request = ToolRequest(grant.request.run_id, awaiting.id, spec, grant.request.args)
    resumed_at = core.now()
    if grant_expired(s, grant, resumed_at):
        return expire(core.store, core.observer, grant, resumed_at)
    refused = check_args(validator, request.args)
    if refused is not None:
        _invalid_on_resume(s, awaiting, grant, refused, resumed_at)
        return None
    view = s.view(s.run, awaiting.index)
    # What the record says the policy was shown, whatever it does to its copies.
    shown = RunView(s.run, view.steps, view.approvals)
    pd, perr = evaluate(s, request, view)
    return apply(s, awaiting, (StepStatus.AWAITING_APPROVAL.value,), request, pd, perr, shown,
                 (spec_hash, text), grant=grant, resumed_at=resumed_at)


def _invalid_on_resume(s: Session, step: Step, grant: Approval, problem: str,
                       resumed_at: datetime) -> None:
    """The approved arguments no longer meet the tool's schema: the step fails as
    an invalid decision (the policy is not asked) and the agent goes on."""
    core = s.core
    obs = observation(ObservationKind.INVALID_DECISION.value, {"error": problem},
                      f"invalid decision on resume: {problem}")
    end = StepEnd(replace(step, status=StepStatus.FAILED.value, observation=obs,
                          started_at=resumed_at),
                  (StepStatus.AWAITING_APPROVAL.value,), detail=obs.summary)
    step_at = core.now()
    wall_at = core.wall()
    with s.tx() as tx:
        resume_run(s, grant, resumed_at, wall_at, tx)
        s.end_in_tx(tx, end, step_at)
    s.lease.start(wall_at)
