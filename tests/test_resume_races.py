"""What ``Driver.resume`` gives its caller when something changes between the
operator's decision and the resume's first write."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta
from typing import Any

import pytest
from _driver_kit import call, fixture_tools, limits, make, stopped_while_deciding

from agentrt.driver import (
    DefaultPolicy,
    FuncTool,
    PolicyFunc,
    Reconciliation,
    ToolResult,
    approve,
    cancel,
)
from agentrt.errors import AgentrtError, RunStateError
from agentrt.records import Decision, PolicyDecision, Reason, RunStatus
from agentrt.store import open_store


def _approved(policy: Any = None, tools: list | None = None) -> tuple[Any, Any]:
    d, store, _, _ = make(script=[call("publish"), Decision.complete()],
                          policy=policy or DefaultPolicy(), tools=tools)
    run = d.start("g", limits(), run_id="r")
    assert run.status == RunStatus.WAITING_FOR_APPROVAL
    d.approve("r", store.list_approvals("r")[0].id, "op")
    return d, store


def test_a_cancel_while_the_resume_asks_the_policy_again_returns_the_cancelled_run() -> None:
    rulings: list[int] = []
    stores: list[Any] = []

    def rule(request: Any, view: Any) -> Any:
        rulings.append(1)
        if len(rulings) == 2:  # the ruling at resume: an operator cancels meanwhile
            cancel(stores[0], "r", "op", "stop")
        return DefaultPolicy().evaluate(request, view)

    d, store = _approved(PolicyFunc(rule))
    stores.append(store)
    run = d.resume("r")
    assert (run.status, run.reason) == (RunStatus.CANCELLED, Reason.OPERATOR_CANCELLED)
    assert store.get_run("r") == run
    assert "step.tool_started" not in [e.type for e in store.list_events("r")]


def test_a_cancel_while_recovery_reconciles_returns_the_cancelled_run() -> None:
    _, store = stopped_while_deciding()

    def reconcile(view: Any) -> Reconciliation:
        cancel(store, "r", "op", "stop")
        return Reconciliation("continue")

    d, _, _, _ = make(store=store, script=[Decision.complete()], reconcile=reconcile)
    run = d.resume("r")
    assert (run.status, run.reason) == (RunStatus.CANCELLED, Reason.OPERATOR_CANCELLED)


def test_a_resume_whose_approved_tool_spec_now_raises_is_refused_and_waits() -> None:
    broken: list[bool] = []

    class Flaky(FuncTool):
        def spec(self) -> Any:
            if broken:
                raise RuntimeError("registry offline")
            return super().spec()

    tool = Flaky("publish", lambda c: ToolResult(b"{}", "ok"), description="p",
                 input_schema=b'{"type":"object"}', side_effect="remote_mutation",
                 timeout=timedelta(seconds=5))
    d, store = _approved(tools=[tool])
    broken.append(True)
    with pytest.raises(AgentrtError, match='approved tool "publish".*registry offline.*waiting'):
        d.resume("r")
    assert store.get_run("r").status == RunStatus.WAITING_FOR_APPROVAL


def test_a_grant_found_past_its_ttl_after_another_resume_used_it_cancels_nothing(
        tmp_path: Any) -> None:
    """The slow resumer read the grant; the other resumer executed it and the run
    paused again on a later step's approval; the slow one's clock then reads past
    the grant TTL. It must not cancel the run waiting on the newer approval, nor
    mark the spent grant expired."""
    from agentrt.driver import approve
    from agentrt.errors import RunStateError
    from agentrt.store import open_store

    db = str(tmp_path / "runs.db")
    store = open_store(db)
    script = [call("publish", b'{"n":1}'), call("publish", b'{"n":2}'), Decision.complete()]
    d, _, _, _ = make(store=store, script=script)
    d.start("g", limits(grant_ttl=timedelta(minutes=5)), run_id="r")
    approve(store, "r", store.list_approvals("r")[0].id, "operator", "")
    decided_at = store.list_approvals("r")[0].decided_at
    soon, late = decided_at + timedelta(minutes=1), decided_at + timedelta(hours=1)
    prompt, _, _, _ = make(store=open_store(db), script=script, now=lambda: soon)
    raced: list[str] = []

    def slow_now() -> Any:
        if not raced:  # the slow resumer has read the grant: the other goes first
            raced.append(prompt.resume("r").status)
        return late

    slow, _, _, _ = make(store=open_store(db), script=[], now=slow_now)
    with pytest.raises(RunStateError, match="was already acted on"):
        slow.resume("r")
    assert raced == [RunStatus.WAITING_FOR_APPROVAL]
    assert store.get_run("r").status == RunStatus.WAITING_FOR_APPROVAL
    assert [a.status for a in store.list_approvals("r")] == ["approved", "pending"]


def test_a_blank_capability_granted_is_the_same_grant_on_resume() -> None:
    """The pause stores and hashes a blank capability or presentation as ``{}``; the
    resume must hash the policy's same answer the same way, or the approved tool
    never runs and every resume asks again."""
    from agentrt.driver import approve
    from agentrt.records import PolicyDecision

    pd = PolicyDecision("require_approval", "ask", "manual", b" ", b"\n")
    d, store, _, _ = make(script=[call("publish", b"{}"), Decision.complete()],
                          policy=PolicyFunc(lambda r, v: pd))
    d.start("g", limits(), run_id="r")
    approve(store, "r", store.list_approvals("r")[0].id, "op", "")
    run = d.resume("r")
    assert (run.status, run.reason) == (RunStatus.COMPLETED, "goal_completed")
    assert [a.status for a in store.list_approvals("r")] == ["approved"]


def test_a_grant_whose_ttl_passes_while_the_policy_is_asked_again_does_not_run() -> None:
    """Spec 13: executing a grant judges its TTL again at the tool's start, with
    that start's own clock reading (no extra one): a policy service that takes
    past the TTL at resume leaves the tool unrun and the run approval_expired."""
    from agentrt.records import ApprovalStatus
    from agentrt.testing import FakeClock

    clock = FakeClock()

    def slow_at_resume(request: Any, view: Any) -> Any:
        if view.run.status == RunStatus.WAITING_FOR_APPROVAL:
            clock.advance(timedelta(minutes=10))
        return DefaultPolicy().evaluate(request, view)

    calls: list = []
    d, store, _, _ = make(script=[call("publish", b"{}"), Decision.complete()],
                          policy=PolicyFunc(slow_at_resume), now=clock,
                          tools=fixture_tools(calls))
    d.start("g", limits(grant_ttl=timedelta(minutes=5)), run_id="r")
    d.approve("r", store.list_approvals("r")[0].id, "op")
    run = d.resume("r")
    assert (run.status, run.reason) == (RunStatus.CANCELLED, "approval_expired")
    assert [a.status for a in store.list_approvals("r")] == [ApprovalStatus.EXPIRED]
    assert calls == [] and "step.tool_started" not in [e.type for e in store.list_events("r")]


def _ask(k: int) -> PolicyDecision:
    return PolicyDecision.need_approval("manual", "ask", {"round": k})


def _waiting_on_a_grant(path: str) -> Any:
    store = open_store(path)
    d, _, _, _ = make(store=store, script=[call("read", b'{"n":1}')],
                      policy=PolicyFunc(lambda r, v: _ask(0)))
    d.start("g", limits(), run_id="r")
    approve(store, "r", store.list_approvals("r")[0].id, "op", "")
    return store


def test_two_resumes_that_pause_one_grant_again_leave_one_pending_approval(tmp_path) -> None:
    """Before: both paused the step again, leaving two pending approvals, the
    older of which could never grant (and ``approve RUN`` refused to pick)."""
    path = str(tmp_path / "runs.db")
    store = _waiting_on_a_grant(path)
    both_read, rounds, out = threading.Barrier(2), itertools.count(1), []

    def rule(request: Any, view: Any) -> PolicyDecision:
        k = next(rounds)
        both_read.wait(5)  # each resumer has read the grant before either pauses
        return _ask(k)

    def resumer() -> None:
        d, _, _, _ = make(store=open_store(path), script=[], policy=PolicyFunc(rule))
        try:
            out.append(d.resume("r").status)
        except RunStateError as exc:
            out.append(str(exc))

    threads = [threading.Thread(target=resumer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a.status for a in store.list_approvals("r")] == ["approved", "pending"]
    assert sorted(out, key=len)[0] == RunStatus.WAITING_FOR_APPROVAL
    assert "is no longer the latest approved approval of step" in sorted(out, key=len)[1]


@pytest.mark.parametrize("stale_ruling", ["abort", "raises", "unknown outcome"])
def test_a_stale_resume_cannot_end_a_run_another_resume_paused_again(tmp_path,
                                                                     stale_ruling) -> None:
    """A resume still asking its policy when another resume paused the step on a
    new approval must not end the run on the spent grant (before: FAILED
    policy_abort or internal_error, the new approval left pending)."""
    path = str(tmp_path / "runs.db")
    store = _waiting_on_a_grant(path)
    in_policy, paused_again, out = threading.Event(), threading.Event(), {}

    def slow(request: Any, view: Any) -> PolicyDecision:
        in_policy.set()
        paused_again.wait(10)
        if stale_ruling == "raises":
            raise RuntimeError("policy broke")
        return PolicyDecision("abort" if stale_ruling == "abort" else "shrug", "stop", "")

    def stale() -> None:
        d, _, _, _ = make(store=open_store(path), script=[], policy=PolicyFunc(slow))
        try:
            out["stale"] = d.resume("r")
        except RunStateError as exc:
            out["stale"] = exc

    t = threading.Thread(target=stale)
    t.start()
    assert in_policy.wait(10)
    fast, _, _, _ = make(store=open_store(path), script=[],
                         policy=PolicyFunc(lambda r, v: _ask(1)))
    assert fast.resume("r").status == RunStatus.WAITING_FOR_APPROVAL
    paused_again.set()
    t.join()
    assert isinstance(out["stale"], RunStateError)
    assert store.get_run("r").status == RunStatus.WAITING_FOR_APPROVAL
    assert [a.status for a in store.list_approvals("r")] == ["approved", "pending"]
    assert store.list_steps("r")[0].status == "awaiting_approval"
