"""Runs and steps as an operator needs to see them, from full reads or page reads.

Full reads (:func:`runs`, :func:`summary`, :func:`steps`, :func:`detail`) are
for code that owns the database. Page reads (:func:`runs_page`,
:func:`detail_page`, :func:`steps_page`) are for a front end facing a database
it may not trust: they read at most the rows asked for, every text column
capped, and say how many there are. The model totals come from the run row,
so a summary costs no extra query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agentrt.records import Approval, ApprovalStatus, Run, RunStatus, Step, Usage
from agentrt.store import Store
from agentrt.timefmt import ZERO_TIME, format_time_nano
from agentrt.view.errors import require_store

__all__ = [
    "RunDetail",
    "RunDetailPage",
    "RunSummary",
    "StepSummary",
    "detail",
    "detail_page",
    "pending_approval_id",
    "runs",
    "runs_page",
    "steps",
    "steps_page",
    "summary",
    "summary_capped",
]

#: Pending ids a page read fetches per run: two are enough to tell one from several.
_PENDING_PROBE = 2


def pending_approval_id(status: str, pending_ids: Sequence[str]) -> str:
    """The approval an operator means by "the run's approval": set only when the
    run is waiting and has exactly one pending approval, else ''."""
    if status == RunStatus.WAITING_FOR_APPROVAL and len(pending_ids) == 1:
        return pending_ids[0]
    return ""


def _stamp(t: datetime | None) -> str:
    return format_time_nano(t if t is not None else ZERO_TIME)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A run as a list or a header shows it."""

    id: str
    goal: str
    status: str
    reason: str = ""
    reason_detail: str = ""
    steps: int = 0
    created_at: datetime | None = None
    finished_at: datetime | None = None
    pending_approval_id: str = ""
    model_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    estimated_cost_micros: int = 0

    @classmethod
    def of(cls, run: Run, pending_ids: Sequence[str] = ()) -> RunSummary:
        return cls(
            id=run.id,
            goal=run.goal,
            status=run.status,
            reason=run.reason,
            reason_detail=run.reason_detail,
            steps=run.step_count,
            created_at=run.created_at,
            finished_at=run.finished_at,
            pending_approval_id=pending_approval_id(run.status, pending_ids),
            model_calls=run.model_calls,
            usage=run.usage,
            estimated_cost_micros=run.estimated_cost_micros,
        )

    def to_json(self) -> dict[str, Any]:
        """The reference's keys and order; empty optional fields left out."""
        out: dict[str, Any] = {"id": self.id, "goal": self.goal, "status": self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.reason_detail:
            out["reason_detail"] = self.reason_detail
        out["steps"] = self.steps
        out["created_at"] = _stamp(self.created_at)
        if self.finished_at is not None and self.finished_at != ZERO_TIME:
            out["finished_at"] = _stamp(self.finished_at)
        if self.pending_approval_id:
            out["pending_approval_id"] = self.pending_approval_id
        if self.model_calls:
            out["model_calls"] = self.model_calls
        if self.usage != Usage():
            out["usage"] = self.usage.to_json()
        if self.estimated_cost_micros:
            out["estimated_cost_micros"] = self.estimated_cost_micros
        return out


@dataclass(frozen=True, slots=True)
class StepSummary:
    """A step in one line: what was asked, what the policy said, what came of it.

    ``decode_error`` says which stored columns could not be read whole; it is
    an addition to the reference's keys, written only when set.
    """

    index: int
    id: str
    status: str
    tool: str = ""
    decision: str = ""
    policy: str = ""
    observation: str = ""
    summary: str = ""
    decode_error: str = ""

    @classmethod
    def of(cls, step: Step) -> StepSummary:
        d, p, o = step.decision, step.policy, step.observation
        return cls(
            index=step.index,
            id=step.id,
            status=step.status,
            tool=d.tool if d is not None else "",
            decision=d.kind if d is not None else "",
            policy=p.outcome if p is not None else "",
            observation=o.kind if o is not None else "",
            summary=o.summary if o is not None else "",
            decode_error=step.decode_error,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "id": self.id}
        if self.tool:
            out["tool"] = self.tool
        if self.decision:
            out["decision"] = self.decision
        out["status"] = self.status
        if self.policy:
            out["policy"] = self.policy
        if self.observation:
            out["observation"] = self.observation
        if self.summary:
            out["summary"] = self.summary
        if self.decode_error:
            out["decode_error"] = self.decode_error
        return out


@dataclass(frozen=True, slots=True)
class RunDetail:
    """A run whole: its summary, every step, every approval, and the pending ones."""

    run: RunSummary
    steps: list[StepSummary]
    approvals: list[Approval]
    pending: list[Approval]
    #: The single pending approval, when there is exactly one.
    waiting: Approval | None


@dataclass(frozen=True, slots=True)
class RunDetailPage:
    """One page of a run: its capped summary, a page of steps, of pending approvals
    and of all approvals, each with its total."""

    run: RunSummary
    steps: list[StepSummary]
    steps_total: int
    pending: list[Approval]
    pending_total: int
    approvals: list[Approval]
    approvals_total: int
    #: The single pending approval when ``pending_total`` is 1, whatever the
    #: offset, of a run waiting for approval (a cancelled run may leave one pending).
    waiting: Approval | None


# -- full reads ----------------------------------------------------------------


def runs(store: Store) -> list[RunSummary]:
    """Every run, newest first, with its pending approval (two queries)."""
    require_store(store)
    pending = store.pending_approval_ids()
    return [RunSummary.of(r, pending.get(r.id, ())) for r in store.list_runs()]


def _pending_of(approvals: Sequence[Approval]) -> list[Approval]:
    return [a for a in approvals if a.status == ApprovalStatus.PENDING]


def summary(store: Store, run_id: str) -> RunSummary:
    require_store(store)
    run = store.get_run(run_id)
    pending = _pending_of(store.list_approvals(run_id))
    return RunSummary.of(run, [a.id for a in pending])


def steps(store: Store, run_id: str) -> list[StepSummary]:
    require_store(store)
    return [StepSummary.of(s) for s in store.list_steps(run_id)]


def detail(store: Store, run_id: str) -> RunDetail:
    require_store(store)
    run = store.get_run(run_id)
    approvals = store.list_approvals(run_id)
    pending = _pending_of(approvals)
    ids = [a.id for a in pending]
    waiting = pending[0] if pending_approval_id(run.status, ids) else None
    return RunDetail(RunSummary.of(run, ids), steps(store, run_id), approvals, pending,
                     waiting)


# -- page reads ----------------------------------------------------------------


def runs_page(store: Store, limit: int, offset: int) -> tuple[list[RunSummary], int]:
    """At most ``limit`` runs after ``offset``, newest first, and how many there are."""
    require_store(store)
    page, total = store.list_runs_page(limit, offset)
    waiting = [r.id for r in page if r.status == RunStatus.WAITING_FOR_APPROVAL]
    pending = store.pending_approval_ids_of(waiting, _PENDING_PROBE) if waiting else {}
    return [RunSummary.of(r, pending.get(r.id, ())) for r in page], total


def summary_capped(store: Store, run_id: str) -> RunSummary:
    """One run through page reads: its text capped, at most two pending ids read."""
    require_store(store)
    run = store.get_run_capped(run_id)
    pending: dict[str, list[str]] = {}
    if run.status == RunStatus.WAITING_FOR_APPROVAL:
        pending = store.pending_approval_ids_of([run_id], _PENDING_PROBE)
    return RunSummary.of(run, pending.get(run_id, ()))


def steps_page(store: Store, run_id: str, limit: int, offset: int) -> tuple[
        list[StepSummary], int]:
    require_store(store)
    page, total = store.list_steps_page(run_id, limit, offset)
    return [StepSummary.of(s) for s in page], total


def detail_page(store: Store, run_id: str, limit: int, offset: int) -> RunDetailPage:
    """A run read through page reads only: neither many rows nor a huge one can
    exhaust the reader. Raises NotFoundError for an unknown run."""
    require_store(store)
    run = store.get_run_capped(run_id)
    step_page, steps_total = steps_page(store, run_id, limit, offset)
    pending, pending_total = store.list_approvals_page(
        run_id, ApprovalStatus.PENDING.value, limit, offset)
    approvals, approvals_total = store.list_approvals_page(run_id, "", limit, offset)
    waiting: Approval | None = None
    if pending_total == 1 and run.status == RunStatus.WAITING_FOR_APPROVAL:
        if pending:
            waiting = pending[0]
        else:  # the offset skipped it; an operator still needs to see it
            first, _ = store.list_approvals_page(run_id, ApprovalStatus.PENDING.value, 1, 0)
            waiting = first[0] if first else None
    return RunDetailPage(
        run=RunSummary.of(run, [waiting.id] if waiting is not None else ()),
        steps=step_page,
        steps_total=steps_total,
        pending=pending,
        pending_total=pending_total,
        approvals=approvals,
        approvals_total=approvals_total,
        waiting=waiting,
    )
