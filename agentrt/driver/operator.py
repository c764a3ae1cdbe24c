"""The operator's decisions: approve, reject (optionally bound to the hash shown), cancel.

These need no lease and no agent: they are what the ``agentrt`` operator
command calls against a database a consumer's driver owns. The package-level
functions use the wall clock; :class:`Operator` takes a chosen clock (a
deterministic test, or a consumer whose records are keyed on its own clock).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from agentrt.driver.approvals import check_operator, check_shown, decide, refusing_too_big
from agentrt.driver.checks import check_callable
from agentrt.driver.core import aware_clock, safe_observer, system_now
from agentrt.driver.errors import ConfigError
from agentrt.driver.session import observation
from agentrt.errors import RunStateError, described
from agentrt.events import EventType, Observer
from agentrt.gojson import dumps, sorted_map
from agentrt.records import Approval, ObservationKind, Reason, Run, RunStatus
from agentrt.store import Store
from agentrt.store.writes import check_run, fail_open_steps, read_run, transition

__all__ = [
    "Operator",
    "approve",
    "approve_shown",
    "cancel",
    "cancel_run",
    "reject",
    "reject_shown",
]

_CANCELLABLE = (
    RunStatus.RUNNING.value,
    RunStatus.WAITING_FOR_APPROVAL.value,
    RunStatus.INTERRUPTED.value,
)


def cancel_run(store: Store, observer: Observer | None, clock: Callable[[], datetime],
               run_id: str, by: str, note: str) -> Run:
    """End a run as operator_cancelled at any time, needing no lease.

    Steps in flight fail with an ``interrupted`` observation; pending approvals
    are left as they are. A live loop finds the run cancelled at its next
    write; a tool already running is not interrupted, and its outcome is
    appended afterwards as a late ``step.tool_finished``.
    """
    check_operator(run_id, by, note)
    run = store.get_run(run_id)
    if RunStatus(run.status).terminal:
        raise RunStateError(f"run {run_id} is already {run.status}")
    now = clock()
    obs = observation(ObservationKind.INTERRUPTED.value, {"by": by, "note": note},
                      f"cancelled by operator: {note}")
    with refusing_too_big(f"cancel run {run_id}", by, note), store.tx(observer) as tx:
        check_run(tx, run_id, _CANCELLABLE)
        fail_open_steps(tx, run_id, dumps(obs.to_json()), obs.content_hash, now)
        transition(tx, run_id, _CANCELLABLE, RunStatus.CANCELLED.value,
                   reason=Reason.OPERATOR_CANCELLED.value, detail=note, finished_at=now)
        run = read_run(tx, run_id)
        tx.append(run_id, "", now, EventType.RUN_FINISHED.value, sorted_map({
            "by": by,
            "detail": note,
            "reason": Reason.OPERATOR_CANCELLED.value,
            "status": RunStatus.CANCELLED.value,
            "steps": run.step_count,
        }))
    return run


class Operator:
    """Operator decisions on a store, timed by ``now`` (the wall clock by default)."""

    def __init__(self, store: Store, observer: Observer | None = None,
                 now: Callable[[], datetime] | None = None) -> None:
        if not isinstance(store, Store):
            raise ConfigError(f"store is {described(store)}, not a Store")
        if observer is not None:
            check_callable("observer", observer, "a function observer(event)", sync=True)
        if now is not None:
            check_callable("now", now, "a clock function now() -> datetime", sync=True)
        self.store = store
        self.observer = safe_observer(observer)
        # Read as the driver reads its clock: a naive reading is UTC, a bad one a ConfigError.
        self.now = aware_clock(now, "operator") if now is not None else system_now

    def approve(self, run_id: str, approval_id: str, by: str, note: str = "") -> Approval:
        """Grant a pending approval; the run stays WAITING until a resume executes it."""
        return decide(self.store, self.observer, self.now, run_id, approval_id,
                      approve=True, by=by, note=note)

    def reject(self, run_id: str, approval_id: str, by: str, note: str = "") -> Approval:
        """Refuse a pending approval; the run ends CANCELLED as approval_rejected."""
        return decide(self.store, self.observer, self.now, run_id, approval_id,
                      approve=False, by=by, note=note)

    def approve_shown(self, run_id: str, approval_id: str, shown_hash: str, by: str,
                      note: str = "") -> Approval:
        """Approve only if the approval still has the hash the person was shown."""
        return decide(self.store, self.observer, self.now, run_id, approval_id,
                      approve=True, by=by, note=note, shown_hash=check_shown(shown_hash))

    def reject_shown(self, run_id: str, approval_id: str, shown_hash: str, by: str,
                     note: str = "") -> Approval:
        return decide(self.store, self.observer, self.now, run_id, approval_id,
                      approve=False, by=by, note=note, shown_hash=check_shown(shown_hash))

    def cancel(self, run_id: str, by: str, note: str = "") -> Run:
        return cancel_run(self.store, self.observer, self.now, run_id, by, note)


def approve(store: Store, run_id: str, approval_id: str, by: str, note: str = "", *,
            observer: Observer | None = None) -> Approval:
    return Operator(store, observer).approve(run_id, approval_id, by, note)


def reject(store: Store, run_id: str, approval_id: str, by: str, note: str = "", *,
           observer: Observer | None = None) -> Approval:
    return Operator(store, observer).reject(run_id, approval_id, by, note)


def approve_shown(store: Store, run_id: str, approval_id: str, shown_hash: str, by: str,
                  note: str = "", *, observer: Observer | None = None) -> Approval:
    return Operator(store, observer).approve_shown(run_id, approval_id, shown_hash, by, note)


def reject_shown(store: Store, run_id: str, approval_id: str, shown_hash: str, by: str,
                 note: str = "", *, observer: Observer | None = None) -> Approval:
    return Operator(store, observer).reject_shown(run_id, approval_id, shown_hash, by, note)


def cancel(store: Store, run_id: str, by: str, note: str = "", *,
           observer: Observer | None = None) -> Run:
    return Operator(store, observer).cancel(run_id, by, note)
