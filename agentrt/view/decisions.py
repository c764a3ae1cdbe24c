"""Choosing the approval an operator means, and deciding it in the operator's terms.

The decisions themselves are the driver's operator functions (they need no
lease and no agent); the wrappers here map the errors a race or a second
operator produces onto the view's errors, so a front end can say what
happened in one sentence. The driver is imported when a decision is made:
the read model itself needs nothing of the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING

import apsw

from agentrt.errors import AgentrtError, ApprovalExpiredError, NotPendingError, RunStateError
from agentrt.events import Observer
from agentrt.records import Approval, ApprovalStatus, Reason, Run, RunStatus
from agentrt.store import Store
from agentrt.view.errors import (
    AmbiguousApprovalError,
    ApprovalDecidedError,
    ApprovalNotPendingError,
    DatabaseLockedError,
    ExpiredApprovalError,
    NoPendingApprovalError,
    RunFinishedError,
    RunNotWaitingError,
    echo,
    echo_in,
    require_store,
)

if TYPE_CHECKING:
    from agentrt.driver.operator import Operator

__all__ = [
    "MAX_LISTED_PENDING",
    "approve",
    "approve_shown",
    "cancel",
    "pending_approval",
    "reject",
    "reject_shown",
]

#: How many pending approvals are read to tell the operator which ones to name.
MAX_LISTED_PENDING = 20

Clock = Callable[[], datetime]


def pending_approval(store: Store, run_id: str, approval_id: str = "") -> Approval:
    """The approval an operator means, read whole (a decision binds its hash).

    The run must be waiting for approval. Named, the approval must be pending;
    unnamed, the run must have exactly one pending approval, else the error
    names up to twenty of them so the operator can pick. Ids are quoted cut to
    :data:`~agentrt.view.errors.ECHO_CHARS` characters.
    """
    require_store(store)
    run = store.get_run_capped(run_id)
    if run.status != RunStatus.WAITING_FOR_APPROVAL:
        raise RunNotWaitingError(
            f"run {echo(run_id)} is {echo(run.status)}, not waiting for approval")
    if approval_id:
        approval = store.get_approval(run_id, approval_id)
        if approval.status != ApprovalStatus.PENDING:
            raise ApprovalNotPendingError(
                f"approval {echo(approval_id)} is {echo(approval.status)}")
        return approval
    page, total = store.list_approvals_page(
        run_id, ApprovalStatus.PENDING.value, MAX_LISTED_PENDING, 0)
    if total == 0 or not page:
        raise NoPendingApprovalError(f"run {echo(run_id)}")
    if total == 1:
        return store.get_approval(run_id, page[0].id)
    ids = [a.id for a in page]
    named = ", ".join(echo(i) for i in ids)
    if total > len(ids):
        named += f", and {total - len(ids)} more"
    raise AmbiguousApprovalError(
        f"run {echo(run_id)} has {total} pending approvals, name one of {named}", ids, total)


def _expired(store: Store, run_id: str, exc: ApprovalExpiredError, deciding: str,
             quoted: tuple[str, ...]) -> ExpiredApprovalError:
    """What an expired approval came to: the decision found it past its expiry and
    expired it instead, which cancels the run (the reference's behaviour)."""
    detail = echo_in(exc.detail, quoted)
    try:
        run = store.get_run_capped(run_id)
    except (AgentrtError, apsw.Error):
        return ExpiredApprovalError(detail)
    if run.status == RunStatus.CANCELLED and run.reason == Reason.APPROVAL_EXPIRED:
        detail += (f", so it was not {deciding or 'decided'} and run {echo(run_id)} was "
                   f"cancelled ({Reason.APPROVAL_EXPIRED.value})")
    return ExpiredApprovalError(detail)


@contextmanager
def _mapped(store: Store, run_id: str, ids: tuple[str, ...] = (), *, deciding: str = "",
            cancelling: bool = False) -> Iterator[None]:
    """Core errors in the operator's terms; anything else passes through (an
    unknown run or approval is the operator's typo, not a race). ``ids`` are
    quoted cut to :data:`~agentrt.view.errors.ECHO_CHARS` characters."""
    quoted = (run_id, *ids)
    try:
        yield
    except (apsw.BusyError, apsw.LockedError) as exc:
        raise DatabaseLockedError(
            f"{store.path}: another connection held the write lock for the whole busy "
            "timeout; nothing was decided, try again") from exc
    except RunStateError as exc:
        if cancelling:
            raise RunFinishedError(echo_in(exc.detail, quoted)) from exc
        raise RunNotWaitingError(echo_in(exc.detail, quoted)) from exc
    except ApprovalExpiredError as exc:
        raise _expired(store, run_id, exc, deciding, quoted) from exc
    except NotPendingError as exc:
        raise ApprovalDecidedError(echo_in(exc.detail, quoted)) from exc


def _operator(store: Store, observer: Observer | None, now: Clock | None) -> Operator:
    from agentrt.driver.operator import Operator

    return Operator(store, observer, now)


def approve(store: Store, run_id: str, approval_id: str, by: str, note: str = "", *,
            observer: Observer | None = None, now: Clock | None = None) -> Approval:
    """Grant a pending approval; the run stays waiting until its consumer resumes it."""
    with _mapped(store, run_id, (approval_id,), deciding="approved"):
        return _operator(store, observer, now).approve(run_id, approval_id, by, note)


def reject(store: Store, run_id: str, approval_id: str, by: str, note: str = "", *,
           observer: Observer | None = None, now: Clock | None = None) -> Approval:
    """Refuse a pending approval; the run ends CANCELLED as approval_rejected."""
    with _mapped(store, run_id, (approval_id,), deciding="rejected"):
        return _operator(store, observer, now).reject(run_id, approval_id, by, note)


def approve_shown(store: Store, run_id: str, approval_id: str, shown_hash: str, by: str,
                  note: str = "", *, observer: Observer | None = None,
                  now: Clock | None = None) -> Approval:
    """Approve only if the approval still has the hash the operator was shown.

    A changed approval raises :class:`~agentrt.errors.ApprovalChangedError`. One
    past its expiry is expired instead, which cancels the run (approval_expired),
    and raises :class:`~agentrt.view.errors.ExpiredApprovalError` saying so.
    """
    with _mapped(store, run_id, (approval_id,), deciding="approved"):
        return _operator(store, observer, now).approve_shown(
            run_id, approval_id, shown_hash, by, note)


def reject_shown(store: Store, run_id: str, approval_id: str, shown_hash: str, by: str,
                 note: str = "", *, observer: Observer | None = None,
                 now: Clock | None = None) -> Approval:
    """Reject only if the approval still has the hash the operator was shown."""
    with _mapped(store, run_id, (approval_id,), deciding="rejected"):
        return _operator(store, observer, now).reject_shown(
            run_id, approval_id, shown_hash, by, note)


def cancel(store: Store, run_id: str, by: str, note: str = "", *,
           observer: Observer | None = None, now: Clock | None = None) -> Run:
    """End a run as operator_cancelled; a finished run raises RunFinishedError."""
    with _mapped(store, run_id, cancelling=True):
        return _operator(store, observer, now).cancel(run_id, by, note)
