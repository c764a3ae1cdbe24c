"""Bad input is recorded verbatim and becomes an observation; the run goes on.

Also: the session's cache always equals a reload, and an agent, a policy and the
driver cannot corrupt each other's view.
"""

from __future__ import annotations

import base64
import json

import pytest
from _driver_kit import call, fixture_tools, limits, make, types

from agentrt.driver import FuncTool, PolicyFunc, ToolResult
from agentrt.records import Decision, PolicyDecision

DEEP = b"[" * 300 + b"]" * 300
HUGE = b'{"n": 1' + b"0" * 10_001 + b"}"


@pytest.mark.parametrize(("args", "problem"), [
    (b"{nope", "not valid JSON"),
    (b'{"n":1,"n":2}', 'duplicate key "n"'),
    (b'{"n":"\\ud800"}', "unpaired surrogate \\ud800"),
    (DEEP, "nested deeper than 256 levels"),
    (HUGE, "is longer than 10000 characters"),
    (b'{"n": 1e99999}', "has an exponent beyond"),
])
def test_unusable_arguments_are_recorded_out_of_band_and_invalid(args, problem):
    calls: list = []
    d, store, _, _ = make(script=[call("read", args), Decision.complete()],
                          tools=fixture_tools(calls))
    run = d.start("g", limits())
    assert run.status == "COMPLETED" and calls == []
    step = store.list_steps(run.id)[0]
    assert step.decision.args is None
    assert step.decision.invalid_args == args.decode()
    assert step.observation.kind == "invalid_decision"
    assert problem in step.observation.summary
    assert step.observation.summary.startswith("invalid decision: arguments are not usable JSON")
    decided = json.loads(store.list_events(run.id)[3].payload)
    assert decided["invalid_args"] == args.decode() and "args" not in decided


def test_arguments_that_are_not_utf8_are_kept_as_base64():
    raw = b'{"n": "\xff"}'
    d, store, _, _ = make(script=[call("read", raw), Decision.complete()])
    run = d.start("g", limits())
    decision = store.list_steps(run.id)[0].decision
    assert decision.invalid_base64 is True
    assert base64.b64decode(decision.invalid_args) == raw
    assert "not valid UTF-8" in store.list_steps(run.id)[0].observation.summary


def test_an_agents_own_invalid_fields_are_discarded():
    forged = Decision("tool_call", tool="read", args=b'{"n":1}', invalid_args="forged",
                      invalid_base64=True)
    d, store, _, _ = make(script=[forged, Decision.complete()])
    run = d.start("g", limits())
    decision = store.list_steps(run.id)[0].decision
    assert (decision.invalid_args, decision.invalid_base64) == ("", False)


def test_unusable_result_makes_the_complete_decision_invalid():
    d, store, _, _ = make(script=[Decision.complete(b"{nope"), Decision.complete(b"{}")])
    run = d.start("g", limits())
    first = store.list_steps(run.id)[0]
    assert first.decision.invalid_result == "{nope"
    assert first.observation.summary == (
        "invalid decision: result is not usable JSON: not valid JSON")
    assert run.status == "COMPLETED" and run.result == b"{}"


@pytest.mark.parametrize(("content", "key"), [
    (b"not json", "content"),
    (b"\xff\xfe", "content_base64"),
    (DEEP, "content"),
    (b'{"a":1,"a":2}', "content"),
])
def test_unusable_tool_content_is_a_tool_error(content, key):
    tool = FuncTool("emit", lambda c: ToolResult(content, "emitted"), timeout=5)
    d, store, _, _ = make(script=[call("emit"), Decision.complete()], tools=[tool])
    run = d.start("g", limits())
    obs = store.list_steps(run.id)[0].observation
    body = json.loads(obs.content)
    assert obs.kind == "tool_error" and body["failure"] == "invalid_content"
    assert key in body and body["error"].startswith("content is not usable JSON: ")
    assert obs.summary.startswith("emit returned content is not usable JSON")
    assert run.status == "COMPLETED"


def test_empty_tool_content_is_an_empty_object():
    tool = FuncTool("quiet", lambda c: None, timeout=5)
    d, store, _, _ = make(script=[call("quiet"), Decision.complete()], tools=[tool])
    run = d.start("g", limits())
    assert store.list_steps(run.id)[0].observation.content == b"{}"


@pytest.mark.parametrize("which", ["capability", "presentation"])
@pytest.mark.parametrize("outcome", ["allow", "require_approval"])
def test_unusable_policy_json_fails_the_run_without_executing(which, outcome):
    calls: list = []
    parts = {"capability": b"{}", "presentation": b"{}"}
    parts[which] = DEEP

    def rule(req, view):
        return PolicyDecision(outcome, "because", "k", parts["capability"],
                              parts["presentation"])

    d, store, _, _ = make(script=[call("read", b'{"n":1}')], tools=fixture_tools(calls),
                          policy=PolicyFunc(rule))
    run = d.start("g", limits())
    assert (run.status, run.reason) == ("FAILED", "internal_error")
    assert run.reason_detail == f"policy: {which} is not usable JSON: nested deeper than 256 levels"
    assert calls == [] and store.list_approvals(run.id) == []
    step = store.list_steps(run.id)[0]
    assert step.status == "failed"
    assert step.policy == PolicyDecision(outcome, "because", "k")
    assert types(store, run.id)[-3:] == ["step.policy", "step.failed", "run.finished"]


def test_unknown_policy_outcome_fails_the_run():
    d, store, _, _ = make(script=[call("read", b'{"n":1}')],
                          policy=PolicyFunc(lambda r, v: PolicyDecision("maybe")))
    run = d.start("g", limits())
    assert (run.reason, run.reason_detail) == ("internal_error", 'unknown policy outcome "maybe"')
    failed = json.loads(store.list_events(run.id)[-2].payload)
    assert failed == {"detail": "unknown policy outcome"}


def test_a_policy_exception_fails_the_run_with_no_policy_event():
    def broken(req, view):
        raise ValueError("rules file missing")

    d, store, _, _ = make(script=[call("read", b'{"n":1}')], policy=PolicyFunc(broken))
    run = d.start("g", limits())
    assert (run.reason, run.reason_detail) == ("internal_error", "policy: rules file missing")
    assert "step.policy" not in types(store, run.id)
    assert json.loads(store.list_events(run.id)[-2].payload) == {
        "detail": "policy error: rules file missing"}


def test_an_agent_returning_something_else_is_an_agent_error():
    d, _, _, _ = make(script=[lambda step: "tool_call please"])
    run = d.start("g", limits())
    assert run.reason == "agent_error" and "not a Decision" in run.reason_detail


def test_the_cache_equals_the_store_after_every_write():
    checked: list[str] = []
    holder: dict = {}

    def compare(event):
        s = holder["driver"]._live.get(holder["run"])
        if s is None or s.steps is None:
            return
        assert s.steps == s.core.store.list_steps(holder["run"])
        if s.approvals is not None:
            assert s.approvals == s.core.store.list_approvals(holder["run"])
        checked.append(event.type)

    script = [call("read", b'{ "n" : 1 }'), call("read", b'{"n":"x"}'), call("wipe"),
              call("publish", b'{"x": "<&>"}'), Decision.complete(b'{"ok": true}')]
    d, store, _, obs = make(script=script)
    holder.update(driver=d, run="r")
    d._core.observer = lambda e: compare(e)
    run = d.start("g", limits(), run_id="r")
    assert run.status == "WAITING_FOR_APPROVAL"
    from agentrt.driver import approve

    approve(store, "r", store.list_approvals("r")[0].id, "op", "fine")
    assert d.resume("r").status == "COMPLETED"
    assert "step.tool_finished" in checked and "approval.requested" in checked


def test_consumers_cannot_corrupt_each_other():
    seen_by_policy: list = []

    def vandal(step):
        step.run.goal = "vandalised"
        step.run.limits.max_steps = 1
        for s in step.steps:
            s.decision.tool = "vandalised"
            s.status = "vandalised"
        step.tools[0].name = "vandalised"
        return call("read", f'{{"n":{step.index}}}') if step.index < 2 else Decision.complete()

    def policy(req, view):
        seen_by_policy.append((view.run.goal, [s.decision.tool for s in view.steps]))
        for s in view.steps:
            s.decision.tool = "policy-vandal"
        view.run.goal = "policy-vandal"
        return PolicyDecision.allow()

    d, store, _, _ = make(script=[vandal] * 3, policy=PolicyFunc(policy))
    run = d.start("g", limits())
    assert run.status == "COMPLETED" and run.goal == "g"
    assert seen_by_policy == [("g", []), ("g", ["read"])]
    assert [s.decision.tool for s in store.list_steps(run.id)[:2]] == ["read", "read"]
    assert [s.status for s in store.list_steps(run.id)] == ["done", "done", "done"]


def _scribble(view) -> None:
    view.run.status, view.run.step_count, view.run.active_ms = "SCRATCH", 999, 10**9
    view.steps, view.approvals = [], [1, 2, 3]


@pytest.mark.parametrize("when", ["in the loop", "on resume"])
def test_a_policy_that_changes_its_view_does_not_change_the_record_of_what_it_was_shown(when):
    """step.policy's view summary was read from the object the policy was given,
    after it returned: what it wrote there went into the hash-chained log."""
    def payloads(scribbles: bool) -> list[dict]:
        def rule(request, view):
            if scribbles:
                _scribble(view)
            if when == "on resume":
                return PolicyDecision.need_approval("remote_mutation", "ask", {"t": 1})
            return PolicyDecision.allow()

        from agentrt.testing import FakeClock
        d, store, _, _ = make(script=[call("read", b'{"n":1}'), Decision.complete()],
                              policy=PolicyFunc(rule), now=FakeClock())
        run = d.start("g", limits(), run_id="r")
        if when == "on resume":
            d.approve("r", store.list_approvals("r")[0].id, "op")
            run = d.resume("r")
        assert run.status == "COMPLETED"
        return [json.loads(e.payload)["view"] for e in store.list_events("r")
                if e.type == "step.policy"]

    honest, scribbled = payloads(False), payloads(True)
    assert scribbled == honest and honest[0]["status"] != "SCRATCH"


def test_an_observer_that_raises_does_not_break_the_run(caplog):
    def broken(event):
        raise RuntimeError("dashboard down")

    from agentrt.driver import DefaultPolicy, Driver
    from agentrt.store import open_store
    from agentrt.testing import ScriptedAgent

    store = open_store(":memory:")
    d = Driver(store, ScriptedAgent([call("read", b'{"n":1}'), Decision.complete()]),
               DefaultPolicy(), fixture_tools(), observer=broken)
    run = d.start("g", limits())
    assert run.status == "COMPLETED"
    assert "observer failed" in caplog.text


def test_a_view_kept_by_a_consumer_does_not_change_afterwards():
    kept: list = []

    def keep(step):
        kept.append(step.steps)
        return call("read", f'{{"n":{step.index}}}') if step.index < 3 else Decision.complete()

    d, store, _, _ = make(script=[keep] * 4)
    d.start("g", limits())
    assert [len(k) for k in kept] == [0, 1, 2, 3]
    assert [s.status for s in kept[3]] == ["done", "done", "done"]
    assert kept[1][0] == store.list_steps(store.list_runs()[0].id)[0]


@pytest.mark.parametrize("field", ["invalid_args", "invalid_result", "invalid_base64"])
@pytest.mark.parametrize("value", [None, 0, []], ids=["None", "0", "empty-list"])
def test_an_agents_own_falsy_invalid_fields_are_discarded_not_a_traceback(field, value):
    """Spec 6.5: the agent's own invalid_* values are discarded. Before: a falsy
    one that was not the default took the fast path and failed to store."""
    d, store, _, _ = make(script=[Decision(kind="complete", **{field: value})])
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    decision = store.list_steps("r")[0].decision
    assert (decision.invalid_args, decision.invalid_result, decision.invalid_base64) == (
        "", "", False)


def test_a_blank_capability_or_presentation_is_left_out_of_step_policy_as_of_the_row():
    """Before: the event said "capability":null (a value the reference never
    writes), the step's row had none and the approval {}."""
    def rule(request, view):
        return PolicyDecision("require_approval", "ask", "remote_mutation", b"  ", b"\n")

    d, store, _, _ = make(script=[call("read", b'{"n":1}')], policy=PolicyFunc(rule))
    d.start("g", limits(), run_id="r")
    payload = json.loads(next(e.payload for e in store.list_events("r")
                              if e.type == "step.policy"))
    assert "capability" not in payload and "presentation" not in payload
    policy = store.list_steps("r")[0].policy
    assert (policy.capability, policy.presentation) == (None, None)
    approval = store.list_approvals("r")[0]
    assert (approval.capability, approval.presentation) == (b"{}", b"{}")
