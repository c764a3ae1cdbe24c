"""What ``Driver.resume`` gives its caller when something changes between the
operator's decision and the resume's first write."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from _driver_kit import call, limits, make, stopped_while_deciding

from agentrt.driver import DefaultPolicy, FuncTool, PolicyFunc, Reconciliation, ToolResult, cancel
from agentrt.errors import AgentrtError
from agentrt.records import Decision, Reason, RunStatus


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
