"""The step loop: event orders, observations, limits, tools, clock readings."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from _driver_kit import (
    SCHEMA_N,
    call,
    clock,
    fixture_tools,
    ids,
    limits,
    make,
    stopped_while_deciding,
    types,
)

from agentrt.driver import (
    AbortRun,
    CancelledError,
    CancelToken,
    ConfigError,
    DefaultPolicy,
    Driver,
    FuncTool,
    PolicyFunc,
    ToolError,
    ToolResult,
    approve,
)
from agentrt.errors import RunStateError
from agentrt.records import Decision, PolicyDecision, ToolSpec
from agentrt.store import open_store
from agentrt.testing import ScriptedAgent, static_tool

TOOL_STEP = ["step.started", "step.decided", "step.policy", "step.tool_started",
             "step.tool_finished"]


def test_completes_and_persists_with_the_exact_event_sequence():
    calls: list = []
    d, store, _, obs = make(script=[call("read", b'{"n":1}'), call("write", b'{"n":2}'),
                                    Decision.complete(b'{"done": true}')],
                            tools=fixture_tools(calls))
    run = d.start("g", limits())
    assert (run.status, run.reason, run.step_count) == ("COMPLETED", "goal_completed", 3)
    assert run.result == b'{"done": true}'
    assert types(store, run.id) == (["run.created", "run.started"] + TOOL_STEP * 2
                                    + ["step.started", "step.decided", "run.finished"])
    steps = store.list_steps(run.id)
    assert [(c.run_id, c.step_id, c.args) for c in calls] == [
        (run.id, steps[0].id, b'{"n":1}'), (run.id, steps[1].id, b'{"n":2}')]
    assert [s.status for s in steps] == ["done", "done", "done"]
    assert obs.events == store.list_events(run.id)
    seqs = [e.seq for e in obs.events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert store.verify_events().broken is None


def test_run_created_names_every_tool_spec_in_name_order():
    d, store, _, _ = make(script=[Decision.complete()])
    run = d.start("g", limits())
    created = json.loads(store.list_events(run.id)[0].payload)
    hashes = [t.spec_hash()[0] for t in sorted((t.spec() for t in fixture_tools()),
                                               key=lambda s: s.name)]
    assert created["tools"] == hashes and created["goal"] == "g"
    assert created["limits"] == {"max_steps": 50, "max_consecutive_tool_failures": 3,
                                 "loop_threshold": 3}
    for h in hashes:
        assert store.tool_spec(h).name


class CountingPolicy:
    def __init__(self) -> None:
        self.calls = 0
        self.inner = DefaultPolicy()

    def evaluate(self, request, view):
        self.calls += 1
        return self.inner.evaluate(request, view)


def test_invalid_arguments_become_an_observation_without_policy_or_tool():
    calls: list = []
    policy = CountingPolicy()
    d, store, _, _ = make(script=[call("read", b'{"n":"x"}'), call("read", b'{"n":1,"m":2}'),
                                  call("nope", b"{}"), Decision.complete()],
                          tools=fixture_tools(calls), policy=policy,
                          )
    run = d.start("g", limits(max_consecutive_tool_failures=5))
    assert run.status == "COMPLETED"
    steps = store.list_steps(run.id)
    for s in steps[:3]:
        assert s.status == "failed" and s.observation.kind == "invalid_decision"
        assert s.policy is None
    assert steps[0].decision.args == b'{"n":"x"}'
    assert "arguments do not match schema" in steps[0].observation.summary
    assert "Additional properties" in steps[1].observation.summary
    assert steps[2].observation.summary == 'invalid decision: unknown tool "nope"'
    assert policy.calls == 0 and calls == []
    assert types(store, run.id)[2:5] == ["step.started", "step.decided", "step.failed"]


@pytest.mark.parametrize(("kind", "text"), [
    ("truncated", "the reply was cut off by the output cap before a tool call"),
    ("no_tool_call", "the reply contained no tool call"),
    ("", "decision has no kind"),
    ("dance", 'unknown decision kind "dance"'),
])
def test_pseudo_and_unknown_decision_kinds_are_invalid(kind, text):
    d, store, _, _ = make(script=[Decision(kind), Decision.complete()])
    run = d.start("g", limits())
    step = store.list_steps(run.id)[0]
    assert step.observation.kind == "invalid_decision"
    assert json.loads(step.observation.content) == {"error": text}
    assert run.status == "COMPLETED"


def test_policy_deny_is_an_observation_and_the_run_goes_on():
    d, store, _, _ = make(script=[call("wipe"), Decision.complete()])
    run = d.start("g", limits())
    assert run.status == "COMPLETED"
    step = store.list_steps(run.id)[0]
    assert (step.status, step.observation.kind) == ("failed", "policy_denied")
    assert step.observation.summary == "denied: side effect destructive is deny by policy"
    assert types(store, run.id)[3:6] == ["step.decided", "step.policy", "step.failed"]


def test_policy_abort_ends_the_run_without_calling_the_tool():
    calls: list = []
    policy = PolicyFunc(lambda req, view: PolicyDecision.abort("not today"))
    d, store, _, _ = make(script=[call("read", b'{"n":1}')], tools=fixture_tools(calls),
                          policy=policy)
    run = d.start("g", limits())
    assert (run.status, run.reason, run.reason_detail, run.step_count) == (
        "FAILED", "policy_abort", "not today", 1)
    assert calls == []
    assert types(store, run.id)[-3:] == ["step.policy", "step.failed", "run.finished"]


def test_require_approval_pauses_the_run():
    d, store, _, _ = make(script=[call("publish", b'{"to": "world"}')])
    run = d.start("g", limits())
    assert (run.status, run.reason) == ("WAITING_FOR_APPROVAL", "")
    assert run.lease_owner == "" and run.finished_at is None
    step = store.list_steps(run.id)[0]
    assert step.status == "awaiting_approval" and step.policy.kind == "remote_mutation"
    last = store.list_events(run.id)[-1]
    assert last.type == "approval.requested"
    assert json.loads(last.payload)["capability"] == {"args": {"to": "world"}, "tool": "publish"}
    assert types(store, run.id)[-3:] == ["step.decided", "step.policy", "approval.requested"]


def test_step_limit_ends_the_run_with_limit_exceeded():
    d, store, _, _ = make(script=[call("read", f'{{"n":{i}}}') for i in range(10)])
    run = d.start("g", limits(max_steps=4))
    assert (run.status, run.reason, run.step_count) == ("FAILED", "limit_steps", 4)
    assert run.reason_detail == "step limit 4 reached"
    events = store.list_events(run.id)
    assert [e.type for e in events[-2:]] == ["limit.exceeded", "run.finished"]
    assert json.loads(events[-2].payload) == {"detail": "step limit 4 reached",
                                              "reason": "limit_steps"}
    assert json.loads(events[-1].payload) == {"detail": "step limit 4 reached",
                                              "reason": "limit_steps", "status": "FAILED",
                                              "steps": 4}


def failing_tool(name: str = "flaky") -> FuncTool:
    def fn(c):
        raise ToolError("boom")
    return FuncTool(name, fn, side_effect="read_only", timeout=5)


def test_consecutive_failures_of_mixed_kinds_end_the_run():
    tools = fixture_tools() + [failing_tool()]
    d, store, _, _ = make(script=[call("read", b'{"n":1}'), call("read", b'{"n":"x"}'),
                                  call("wipe"), call("flaky"), call("read", b'{"n":2}')],
                          tools=tools)
    run = d.start("g", limits())
    assert (run.status, run.reason, run.step_count) == ("FAILED", "repeated_tool_failures", 4)
    assert run.reason_detail == "3 consecutive failed steps"
    kinds = [s.observation.kind for s in store.list_steps(run.id)]
    assert kinds == ["tool_result", "invalid_decision", "policy_denied", "tool_error"]
    assert types(store, run.id)[-2:] == ["limit.exceeded", "run.finished"]


def test_failure_streak_resets_on_success():
    tools = fixture_tools() + [failing_tool()]
    d, _, _, _ = make(script=[call("flaky"), call("flaky"), call("read", b'{"n":1}'),
                              call("flaky"), call("flaky"), Decision.complete()], tools=tools)
    assert d.start("g", limits()).status == "COMPLETED"


def test_identical_call_and_result_stops_as_a_loop():
    d, store, _, _ = make(script=[call("read", b'{"n":1}')] * 5)
    run = d.start("g", limits(loop_threshold=3))
    assert (run.status, run.reason, run.step_count) == ("FAILED", "loop_detected", 3)
    assert run.reason_detail == "read produced the same observation 3 times in a row"
    events = store.list_events(run.id)
    assert [e.type for e in events[-2:]] == ["loop.detected", "run.finished"]
    assert "limit.exceeded" not in types(store, run.id)
    loop = json.loads(events[-2].payload)
    assert list(loop) == ["args_hash", "observation_hash", "repeats", "tool"]
    assert (loop["repeats"], loop["tool"]) == (3, "read")


def test_repeated_call_with_a_changing_result_is_allowed():
    counter = iter(range(100))
    tool = FuncTool("tick", lambda c: ToolResult(f'{{"n":{next(counter)}}}'), timeout=5)
    d, _, _, _ = make(script=[call("tick")] * 5 + [Decision.complete()], tools=[tool])
    assert d.start("g", limits(loop_threshold=3)).status == "COMPLETED"


def test_loop_streak_resets_on_a_different_call():
    script = [call("read", b'{"n":1}')] * 2 + [call("read", b'{"n":2}')] + [
        call("read", b'{"n":1}')] * 2 + [Decision.complete()]
    d, _, _, _ = make(script=script)
    assert d.start("g", limits(loop_threshold=3)).status == "COMPLETED"


def test_tool_timeout_is_an_observation_and_the_tool_is_asked_to_stop():
    seen: list[CancelToken] = []
    release = threading.Event()

    def slow(c):
        seen.append(c.cancel)
        release.wait(5)
        return ToolResult(b"{}")

    tool = FuncTool("slow", slow, timeout=0.1)
    d, store, _, _ = make(script=[call("slow"), Decision.complete()], tools=[tool])
    started = time.monotonic()
    run = d.start("g", limits())
    assert time.monotonic() - started < 2
    release.set()
    step = store.list_steps(run.id)[0]
    assert step.observation.kind == "tool_error"
    assert json.loads(step.observation.content)["failure"] == "timeout"
    assert "timeout" in step.observation.summary
    # Cancelled, not merely past its deadline: the loop asked the tool to stop.
    assert seen[0].cancelled and seen[0].reason == "deadline exceeded"


def test_a_tool_that_raises_unexpectedly_is_observed_as_a_panic():
    def bad(c):
        raise KeyError("x")
    d, store, _, _ = make(script=[call("bad"), Decision.complete()],
                          tools=[FuncTool("bad", bad, timeout=5)])
    run = d.start("g", limits())
    obs = store.list_steps(run.id)[0].observation
    assert obs.kind == "tool_error" and "panicked" in obs.summary
    assert json.loads(obs.content)["error"].startswith("panic: KeyError")
    assert run.status == "COMPLETED"


def test_tool_error_is_a_tool_error_observation():
    d, store, _, _ = make(script=[call("flaky"), Decision.complete()], tools=[failing_tool()])
    run = d.start("g", limits())
    obs = store.list_steps(run.id)[0].observation
    assert json.loads(obs.content) == {"error": "boom", "failure": "error", "tool": "flaky"}
    assert obs.summary == "flaky error: boom"
    events = store.list_events(run.id)
    assert [e.type for e in events[5:8]] == ["step.tool_started", "step.tool_finished",
                                            "step.failed"]
    assert set(json.loads(events[6].payload)) == {"duration_ms", "error", "tool"}


def test_agent_error_fails_the_run_and_its_step():
    d, store, _, _ = make(script=[RuntimeError("the agent broke")])
    run = d.start("g", limits())
    assert (run.status, run.reason, run.reason_detail) == ("FAILED", "agent_error",
                                                           "the agent broke")
    events = store.list_events(run.id)
    assert [e.type for e in events] == ["run.created", "run.started", "step.started",
                                        "step.failed", "run.finished"]
    assert json.loads(events[3].payload) == {"detail": "agent error: the agent broke"}
    assert "limit.exceeded" not in types(store, run.id)


def test_fail_decision_ends_the_run_as_goal_failed():
    d, store, _, _ = make(script=[Decision.fail("cannot do it")])
    run = d.start("g", limits())
    assert (run.status, run.reason, run.reason_detail) == ("FAILED", "goal_failed",
                                                           "cannot do it")
    assert store.list_steps(run.id)[0].status == "done"
    assert types(store, run.id)[-3:] == ["step.started", "step.decided", "run.finished"]


def spec_tool(**kw):
    base = dict(name="t", description="", input_schema=b'{"type":"object"}',
                side_effect="read_only", timeout=timedelta(seconds=1))
    base.update(kw)
    spec = ToolSpec(**base)

    class T:
        def spec(self):
            return spec

        def call(self, c):
            return None

    return T()


@pytest.mark.parametrize(("tool", "message"), [
    (spec_tool(timeout=timedelta(0)), 'agentrt: tool "t": timeout is required'),
    (spec_tool(side_effect="sideways"), 'agentrt: tool "t": invalid side effect "sideways"'),
    (spec_tool(input_schema=b""), 'agentrt: tool "t": input schema is required'),
    (spec_tool(input_schema=b"{nope"), 'agentrt: tool "t": input schema is not valid JSON'),
    (spec_tool(input_schema=b'{"type": 12}'), 'agentrt: tool "t": input schema is invalid'),
    (spec_tool(input_schema=b'{"$ref": "https://example.com/s.json"}'),
     "outside itself"),
    (spec_tool(input_schema=b'{"$ref": "other.json"}'), "outside itself"),
    (spec_tool(input_schema=b"[" * 300 + b"]" * 300), "nested deeper than 256 levels"),
    (spec_tool(name=""), "agentrt: tool with empty name"),
])
def test_bad_tools_are_refused_at_registration(tool, message):
    with pytest.raises(ConfigError) as info:
        Driver(open_store(":memory:"), ScriptedAgent([]), DefaultPolicy(), [tool])
    assert message in str(info.value)


def test_duplicate_tools_and_missing_parts_are_refused():
    store = open_store(":memory:")
    with pytest.raises(ConfigError, match='duplicate tool "t"'):
        Driver(store, ScriptedAgent([]), DefaultPolicy(), [spec_tool(), spec_tool()])
    with pytest.raises(ConfigError, match="agentrt: agent is required"):
        Driver(store, None, DefaultPolicy())
    with pytest.raises(ConfigError, match="agentrt: policy is required"):
        Driver(store, ScriptedAgent([]), None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="agentrt: store is required"):
        Driver(None, ScriptedAgent([]), DefaultPolicy())  # type: ignore[arg-type]


def test_limits_must_be_positive():
    d, _, _, _ = make()
    with pytest.raises(ConfigError, match="agentrt: limits: max_steps must be positive"):
        d.start("g", limits(max_steps=0))
    with pytest.raises(ConfigError, match="loop_threshold must be positive"):
        d.start("g", limits(loop_threshold=0))


def test_start_with_id_refuses_duplicate_and_empty_ids():
    d, store, _, _ = make(script=[Decision.complete()])
    run = d.start("g", limits(), run_id="r1")
    assert run.id == "r1"
    with pytest.raises(ConfigError, match="agentrt: start run: "):
        d.start("again", limits(), run_id="r1")
    with pytest.raises(ConfigError, match="agentrt: run id is required"):
        d.start("g", limits(), run_id="")
    assert len(store.list_runs()) == 1
    assert store.list_events("r1")[-1].type == "run.finished"


def test_terminal_tool_completes_the_run_with_its_content():
    tool = static_tool("finish", content=b'{"shipped": 1}', terminal=True)
    d, store, _, _ = make(script=[call("finish")], tools=[tool])
    run = d.start("g", limits())
    assert (run.status, run.reason, run.reason_detail) == ("COMPLETED", "goal_completed",
                                                           "terminal tool finish")
    assert run.result == b'{"shipped": 1}'
    assert types(store, run.id)[-3:] == ["step.tool_started", "step.tool_finished",
                                         "run.finished"]


def test_terminal_tool_commits_with_the_run():
    calls: list = []
    token = CancelToken()

    def cancel_after_finish(event):
        if event.type == "step.tool_finished":
            token.cancel()

    store = open_store(":memory:")
    tool = static_tool("finish", terminal=True, calls=calls)
    d = Driver(store, ScriptedAgent([call("finish")]), DefaultPolicy(), [tool],
               observer=cancel_after_finish)
    run = d.start("g", limits(), cancel=token)
    stored = store.get_run(run.id)
    assert stored.status == "COMPLETED"
    with pytest.raises(RunStateError):
        d.resume(run.id)
    assert len(calls) == 1


def test_tool_abort_ends_the_run():
    def abort(c):
        raise AbortRun("the account is frozen")
    d, store, _, _ = make(script=[call("pay")], tools=[FuncTool("pay", abort, timeout=5)])
    run = d.start("g", limits())
    assert (run.status, run.reason, run.reason_detail) == ("FAILED", "tool_abort",
                                                           "the account is frozen")
    obs = store.list_steps(run.id)[0].observation
    assert json.loads(obs.content)["failure"] == "abort"
    assert obs.summary == "pay aborted the run: the account is frozen"
    assert types(store, run.id)[-3:] == ["step.tool_finished", "step.failed", "run.finished"]


def readings(script, tools=None, **kw) -> tuple[int, object, object]:
    c = clock()
    d, store, _, _ = make(script=script, tools=tools, now=c, **kw)
    run = d.start("g", limits(loop_threshold=kw.pop("loop", 3)))
    return c.readings, run, store


def test_clock_readings_are_stable():
    assert readings([RuntimeError("x")])[0] == 4
    assert readings([Decision.fail("no")])[0] == 5
    assert readings([call("f")], tools=[static_tool("f", terminal=True)])[0] == 6

    def abort(c):
        raise AbortRun("x")
    assert readings([call("p")], tools=[FuncTool("p", abort, timeout=5)])[0] == 6
    assert readings([call("read", b'{"n":1}'), call("wipe"), call("read", b'{"n":"x"}'),
                     Decision.complete()])[0] == 16
    c = clock()
    d, _, _, _ = make(script=[call("read", b'{"n":1}')] * 3, now=c)
    assert d.start("g", limits(loop_threshold=2)).reason == "loop_detected"
    assert c.readings == 11


def test_clock_readings_across_a_pause_approve_and_resume():
    c = clock()
    d, store, _, _ = make(script=[call("publish"), call("read", b'{"n":1}'),
                                  Decision.complete()], now=c)
    run = d.start("g", limits())
    assert c.readings == 5
    approval = store.list_approvals(run.id)[0]
    approve(store, run.id, approval.id, "operator", "ok")
    assert c.readings == 5
    run = d.resume(run.id)
    assert run.status == "COMPLETED" and c.readings == 16


def test_event_times_follow_the_readings():
    c = clock()
    d, store, _, _ = make(script=[call("read", b'{"n":1}'), Decision.complete()], now=c)
    run = d.start("g", limits())
    t0 = store.list_events(run.id)[0].at
    offsets = [int((e.at - t0).total_seconds()) for e in store.list_events(run.id)]
    # start 0; step 1, decision 2, policy 3 (policy + tool start), end 4; step 5,
    # decision 6, settle step 7 and run 8.
    assert offsets == [0, 0, 1, 2, 3, 3, 4, 5, 6, 8]
    steps = store.list_steps(run.id)
    assert [(s.started_at - t0).total_seconds() for s in steps] == [1, 5]
    assert [(s.finished_at - t0).total_seconds() for s in steps] == [4, 7]


def test_cancelled_caller_after_the_tool_keeps_the_observation():
    calls: list = []
    token = CancelToken()

    def cancel_then_succeed(c):
        calls.append(c)
        token.cancel()
        return ToolResult(b'{"moved":100}', "moved 100")

    d, store, agent, _ = make(script=[call("move"), Decision.complete()],
                              tools=[FuncTool("move", cancel_then_succeed, timeout=5)])
    with pytest.raises(CancelledError):
        d.start("g", limits(), run_id="r", cancel=token)
    step = store.list_steps("r")[0]
    assert step.status == "done" and step.observation.summary == "moved 100"
    assert store.lease("r") == ("", None)
    run = d.resume("r")
    assert run.status == "COMPLETED" and len(calls) == 1


def test_cancelled_caller_while_deciding_leaves_the_step_deciding():
    d, store = stopped_while_deciding()
    assert store.list_steps("r")[0].status == "deciding"
    assert store.get_run("r").status == "RUNNING"
    assert d.resume("r").status == "COMPLETED"
    assert store.list_steps("r")[0].status == "interrupted"


def test_decision_origin_is_recorded_and_changes_nothing_else():
    d, store, _, _ = make(script=[call("read", b'{"n":1}', origin="model"),
                                  Decision.complete(origin="plan")])
    run = d.start("g", limits())
    steps = store.list_steps(run.id)
    assert [s.decision.origin for s in steps] == ["model", "plan"]
    assert run.status == "COMPLETED"


def test_unknown_origin_is_invalid():
    d, store, _, _ = make(script=[call("read", b'{"n":1}', origin="martian"),
                                  Decision.complete()])
    run = d.start("g", limits())
    obs = store.list_steps(run.id)[0].observation
    assert obs.summary == 'invalid decision: unknown decision origin "martian"'


def test_spec_hash_and_policy_id_are_recorded_on_the_step_and_event():
    class Named(DefaultPolicy):
        def policy_id(self) -> str:
            return "rules/v2"

    d, store, _, _ = make(script=[call("read", b'{"n":1}'), Decision.complete()],
                          policy=Named())
    run = d.start("g", limits())
    step = store.list_steps(run.id)[0]
    read = next(t for t in fixture_tools() if t.spec().name == "read")
    assert step.spec_hash == read.spec().spec_hash()[0]
    assert step.policy_id == "rules/v2"
    policy = json.loads(next(e for e in store.list_events(run.id)
                             if e.type == "step.policy").payload)
    assert list(policy) == ["outcome", "reason", "policy_id", "spec_hash", "view"]
    assert policy["view"] == {"status": "RUNNING", "step_count": 1, "model_calls": 0,
                              "input_tokens": 0, "output_tokens": 0,
                              "cached_input_tokens": 0, "estimated_cost_micros": 0,
                              "active_ms": 0, "steps": 0, "approvals": 0}


@pytest.mark.parametrize("bad", ["x" * 257, "a\nb", "tab\there"])
def test_a_malformed_policy_id_is_refused(bad):
    class Named(DefaultPolicy):
        def policy_id(self) -> str:
            return bad

    with pytest.raises(ConfigError, match="policy id"):
        Driver(open_store(":memory:"), ScriptedAgent([]), Named(), [])


def test_ids_come_from_new_id():
    d, store, _, _ = make(script=[call("read", b'{"n":1}'), Decision.complete()], new_id=ids())
    run = d.start("g", limits())
    assert run.id == "id0"
    assert [s.id for s in store.list_steps(run.id)] == ["id1", "id2"]


def test_the_tool_receives_the_agents_own_argument_bytes_and_the_policy_the_policy_form():
    seen: list = []
    calls: list = []
    policy = PolicyFunc(lambda req, view: seen.append(req.args) or PolicyDecision.allow())
    tool = static_tool("read", input_schema=SCHEMA_N, calls=calls)
    d, _, _, _ = make(script=[call("read", b'{ "n" : 1.50e0 }'.replace(b"1.50e0", b"1")),
                              Decision.complete()], tools=[tool], policy=policy)
    d.start("g", limits())
    assert seen == [b'{"n":1}'] and calls[0].args == b'{ "n" : 1 }'


def test_tool_durations_are_measured_on_the_drivers_monotonic_clock():
    readings = iter([10.0, 10.25, 20.0, 20.5])
    d, store, _, _ = make(script=[call("read", b'{"n":1}'), call("write", b'{"n":2}'),
                                  Decision.complete()], monotonic=lambda: next(readings))
    d.start("g", limits(), run_id="r")
    finished = [json.loads(e.payload) for e in store.list_events("r")
                if e.type == "step.tool_finished"]
    assert [p["duration_ms"] for p in finished] == [250, 500]


def test_a_naive_clock_is_read_as_utc():
    from datetime import datetime

    d, store, _, _ = make(script=[call("read", b'{"n":1}'), Decision.complete()],
                          now=lambda: datetime(2026, 10, 1, 9, 0))
    run = d.start("g", limits(max_elapsed_time=timedelta(hours=1)))
    assert run.status == "COMPLETED"
    assert store.list_events(run.id)[0].at.isoformat() == "2026-10-01T09:00:00+00:00"
