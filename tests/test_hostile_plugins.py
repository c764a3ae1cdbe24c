"""Misbehaving consumer code: each mistake becomes a recorded outcome, never a hang.

Tools that ignore their token, raise what is not an Exception, or are async;
agents that are async or return absurd decisions; policies that return junk or
cancel the run; model adapters that return nothing; reconcilers that return
junk; observers that block. In every case the run records a clear outcome, the
chain verifies, and no step is left deciding or executing when the driver
returns.
"""

from __future__ import annotations

import gc
import json
import re
import threading
import time
import warnings
from datetime import timedelta

import pytest
from _driver_kit import call, limits, make, types

from agentrt.driver import (
    AgentFunc,
    CancelledError,
    CancelToken,
    DefaultPolicy,
    Driver,
    FuncTool,
    Message,
    ModelConfig,
    ModelRequest,
    ModelResponse,
    PolicyFunc,
    Reconciliation,
    ToolError,
    ToolResult,
    TransientError,
    cancel,
)
from agentrt.records import Decision, PolicyDecision, ToolSpec, Usage
from agentrt.store import open_store
from agentrt.testing import ModelToolAgent, ScriptedAgent, ScriptedModel, static_tool

OPEN = ("deciding", "executing")


def settled(store, run_id: str) -> None:
    """The record holds: the chain verifies and no step is left mid-flight."""
    assert store.verify_events().broken is None
    assert [s.status for s in store.list_steps(run_id) if s.status in OPEN] == []


# -- tools -----------------------------------------------------------------------


def test_tools_that_ignore_their_token_time_out_and_the_next_tool_runs_on_a_fresh_worker():
    release = threading.Event()

    def hang(c):
        release.wait(20)  # ignores c.cancel
        return ToolResult(b'{"late":true}', "late")

    calls: list = []
    d, store, _, _ = make(
        script=[call("hang"), call("hang", b'{"again":1}'), call("read"), Decision.complete()],
        tools=[FuncTool("hang", hang, timeout=0.15), static_tool("read", calls=calls)])
    started = time.monotonic()
    run = d.start("g", limits(), run_id="r")
    assert time.monotonic() - started < 3
    assert run.status == "COMPLETED" and len(calls) == 1
    steps = store.list_steps("r")
    assert [s.status for s in steps] == ["failed", "failed", "done", "done"]
    for s in steps[:2]:
        assert json.loads(s.observation.content) == {
            "error": "no outcome within the timeout of 150ms", "failure": "timeout",
            "tool": "hang"}
    before = types(store, "r")
    release.set()
    time.sleep(0.1)  # the abandoned calls return now: their outcomes are discarded
    assert types(store, "r") == before
    settled(store, "r")


@pytest.mark.parametrize(("exc", "error"), [
    (KeyboardInterrupt(), "panic: KeyboardInterrupt: KeyboardInterrupt"),
    (SystemExit(3), "panic: SystemExit: 3"),
    (GeneratorExit(), "panic: GeneratorExit: GeneratorExit"),
])
def test_a_tool_raising_a_base_exception_is_observed_as_a_panic_and_the_run_goes_on(exc, error):
    def bad(c):
        raise exc

    d, store, _, _ = make(script=[call("bad"), Decision.complete()],
                          tools=[FuncTool("bad", bad, timeout=5)])
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    obs = store.list_steps("r")[0].observation
    assert (obs.kind, obs.summary) == ("tool_error", "bad panicked")
    assert json.loads(obs.content) == {"error": error, "tool": "bad"}
    settled(store, "r")


def test_a_tool_error_with_a_megabyte_message_is_recorded_whole():
    text = "x" * 1_000_000

    def loud(c):
        raise ToolError(text)

    d, store, _, _ = make(script=[call("loud"), Decision.complete()],
                          tools=[FuncTool("loud", loud, timeout=5)])
    assert d.start("g", limits(), run_id="r").status == "COMPLETED"
    obs = store.list_steps("r")[0].observation
    assert json.loads(obs.content)["error"] == text
    assert obs.summary == f"loud error: {text}"
    settled(store, "r")


def test_an_async_tool_and_an_async_agent_are_recorded_errors_not_hangs():
    async def tool_fn(c):
        return ToolResult(b"{}", "never")

    async def agent_fn(step):
        return Decision.complete()

    d, store, _, _ = make(script=[call("a"), agent_fn], tools=[FuncTool("a", tool_fn, timeout=5)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = d.start("g", limits(), run_id="r")
        gc.collect()
    # Their coroutines are closed, not left to warn "never awaited" later, elsewhere.
    assert [str(w.message) for w in caught] == []
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "agent_error", "the agent returned coroutine, not a Decision")
    first = store.list_steps("r")[0].observation
    assert first.summary == "a error: the tool returned coroutine, not a ToolResult"
    settled(store, "r")


def test_large_compact_tool_content_is_recorded_whole_with_its_hash():
    content = b'{"blob":"' + b"a" * (8 << 20) + b'"}'
    tool = FuncTool("big", lambda c: ToolResult(content, "big"), timeout=30)
    d, store, _, _ = make(script=[call("big"), Decision.complete()], tools=[tool])
    assert d.start("g", limits(), run_id="r").status == "COMPLETED"
    step = store.list_steps("r")[0]
    assert step.observation.content == content
    finished = json.loads(store.list_events("r")[6].payload)
    assert finished["content_hash"] == step.observation.content_hash
    settled(store, "r")


# -- agents ----------------------------------------------------------------------


@pytest.mark.parametrize(("decision", "says"), [
    (Decision.tool_call("t" * 1_000_000, b"{}"), 'invalid decision: unknown tool "ttt'),
    (Decision.tool_call("read", b'{"a":' * 10_000 + b"1" + b"}" * 10_000),
     "invalid decision: arguments are not usable JSON: nested deeper than 256 levels"),
    (Decision.tool_call("read", "[" * 100_000 + "]" * 100_000),
     "invalid decision: arguments are not usable JSON: nested deeper than 256 levels"),
    (Decision.tool_call("read", b'{"n":NaN}'),
     "invalid decision: arguments are not usable JSON: not valid JSON"),
])
def test_absurd_decisions_become_invalid_decisions_and_the_run_goes_on(decision, says):
    d, store, _, _ = make(script=[decision, Decision.complete()])
    assert d.start("g", limits(), run_id="r").status == "COMPLETED"
    step = store.list_steps("r")[0]
    assert (step.status, step.observation.kind) == ("failed", "invalid_decision")
    assert step.observation.summary.startswith(says)
    settled(store, "r")


# -- policies --------------------------------------------------------------------


@pytest.mark.parametrize(("returned", "name"), [(None, "NoneType"), ("allow", "str"),
                                                 ({"outcome": "allow"}, "dict")])
def test_a_policy_returning_something_else_is_a_policy_error_and_no_tool_runs(returned, name):
    calls: list = []
    d, store, _, _ = make(script=[call("read", b'{"n":1}')],
                          tools=[static_tool("read", calls=calls)],
                          policy=PolicyFunc(lambda r, v: returned))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "internal_error", f"policy: the policy returned {name}, not a PolicyDecision")
    assert calls == [] and "step.policy" not in types(store, "r")
    settled(store, "r")


def test_an_operator_cancel_made_while_the_policy_rules_runs_no_tool():
    holder: dict = {}
    calls: list = []

    def rule(request, view):
        cancel(holder["store"], "r", "operator", "stop")
        return PolicyDecision.allow()

    d, store, _, _ = make(script=[call("read")], tools=[static_tool("read", calls=calls)],
                          policy=PolicyFunc(rule))
    holder["store"] = store
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("CANCELLED", "operator_cancelled")
    assert calls == []
    assert "step.tool_started" not in types(store, "r")
    assert types(store, "r")[-1] == "run.finished"
    settled(store, "r")


@pytest.mark.parametrize("pd", [
    PolicyDecision("require_approval", "r", "k\udcff", b"{}", b"{}"),
    PolicyDecision("require_approval", "why \ud800", "k", b"{}", b"{}"),
])
def test_a_pause_whose_text_holds_a_lone_surrogate_is_approved_and_runs_once(pd):
    calls: list = []
    d, store, _, _ = make(script=[call("read"), Decision.complete()],
                          tools=[static_tool("read", calls=calls)],
                          policy=PolicyFunc(lambda r, v: pd))
    assert d.start("g", limits(), run_id="r").status == "WAITING_FOR_APPROVAL"
    (a,) = store.list_approvals("r")
    d.approve("r", a.id, "op")  # the stored hash is the hash of the stored request
    assert d.resume("r").status == "COMPLETED" and len(calls) == 1
    settled(store, "r")


# -- model adapters, reconcilers, observers ----------------------------------------


def stopped_with(reconcile):
    """A run left RUNNING with its step deciding (the caller cancelled), whose own
    driver, built with ``reconcile``, resumes it."""
    token = CancelToken()

    def decide(step):
        token.cancel()
        raise RuntimeError("stopped")

    d, store, _, _ = make(script=[decide, Decision.complete()], reconcile=reconcile)
    with pytest.raises(CancelledError):
        d.start("g", limits(), run_id="r", cancel=token)
    return d, store


def test_a_model_that_returns_none_is_a_recorded_failed_call():
    store = open_store(":memory:")
    d = Driver(store, ModelToolAgent(), DefaultPolicy(), [static_tool("read")],
               model=ModelConfig(ScriptedModel([None])))
    run = d.start("g", limits(), run_id="r")
    detail = "the model returned NoneType, not a ModelResponse"
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "model_unavailable", f"model unavailable after 1 attempt(s): {detail}")
    [mc] = store.list_model_calls("r")
    assert (mc.status, mc.error) == ("error", detail)
    settled(store, "r")


@pytest.mark.parametrize(("returned", "name"), [(None, "NoneType"), ("continue", "str")])
def test_a_reconciler_returning_something_else_fails_the_run_as_internal(returned, name):
    d, store = stopped_with(lambda view: returned)
    run = d.resume("r")
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "internal_error", f"reconcile: returned {name}, not a Reconciliation")
    assert store.list_steps("r")[0].status == "interrupted"
    settled(store, "r")


def test_a_reconciler_sees_interrupted_steps_and_completes_with_a_surrogate_in_its_detail():
    seen: list = []

    def rec(view):
        seen.append([s.status for s in view.steps])
        return Reconciliation("completed", "done \ud800", b'{"ok":true}')

    d, store = stopped_with(rec)
    run = d.resume("r")
    assert seen == [["interrupted"]]
    assert (run.status, run.reason_detail, run.result) == (
        "COMPLETED", "completed by reconciliation: done \ufffd", b'{"ok":true}')
    settled(store, "r")


def test_an_observer_that_blocks_past_the_lease_ttl_does_not_lose_the_lease():
    def slow(event):
        if event.type == "step.decided":
            time.sleep(0.6)  # more than twice the TTL: only the heartbeat keeps the lease

    store = open_store(":memory:")
    d = Driver(store, ScriptedAgent([call("read"), Decision.complete()]), DefaultPolicy(),
               [static_tool("read")], observer=slow, lease_ttl=0.25)
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    assert "lease.taken_over" not in types(store, "r")
    assert [s.status for s in store.list_steps("r")] == ["done", "done"]
    settled(store, "r")


def test_an_agent_may_call_its_steps_model_from_another_thread_during_the_step():
    def decide(step):
        out: list = []
        t = threading.Thread(target=lambda: out.append(step.model.generate(
            ModelRequest([Message("user", "hi")], max_output_tokens=5))))
        t.start()
        t.join(10)
        return Decision.complete(json.dumps({"text": out[0].text}))

    store = open_store(":memory:")
    d = Driver(store, AgentFunc(decide), DefaultPolicy(), [static_tool("read")],
               model=ModelConfig(ScriptedModel([ModelResponse("hi", usage=Usage(2, 1))])))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.result, run.model_calls) == ("COMPLETED", b'{"text": "hi"}', 1)
    [mc] = store.list_model_calls("r")
    assert (mc.status, mc.step_id) == ("ok", store.list_steps("r")[0].id)
    settled(store, "r")


class Slow:
    """A model that answers after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def name(self):
        return "slow"

    def generate(self, request, cancel):
        time.sleep(self.delay)
        return ModelResponse("x", usage=Usage(1, 1))


REQUEST = ModelRequest([Message("user", "hi")], max_output_tokens=5)


def test_a_model_caller_used_after_its_steps_decision_is_refused_and_nothing_is_charged():
    late: list = []

    def step0(step):
        def later():
            time.sleep(0.1)  # the step has decided by now
            try:
                step.model.generate(REQUEST)
            except Exception as exc:  # noqa: BLE001
                late.append(exc)

        threading.Thread(target=later).start()
        return call("read")

    def step1(step):
        time.sleep(0.3)
        return Decision.complete()

    store = open_store(":memory:")
    run = Driver(store, ScriptedAgent([step0, step1]), DefaultPolicy(), [static_tool("read")],
                 model=ModelConfig(Slow(0))).start("g", limits(), run_id="r")
    assert (run.status, run.model_calls) == ("COMPLETED", 0)
    assert [type(e).__name__ for e in late] == ["SessionClosedError"]
    step = store.list_steps("r")[0]
    assert str(late[0]) == (f"agentrt: session is closed: the model caller of step {step.id} "
                            "was used after the step's decision was made; call the model "
                            "from within decide()")
    assert store.list_model_calls("r") == []
    settled(store, "r")


def test_a_call_left_running_past_its_step_counts_against_the_next_steps_limit():
    stray: list = []

    def step0(step):
        t = threading.Thread(target=step.model.generate, args=(REQUEST,))
        t.start()
        stray.append(t)
        time.sleep(0.05)  # dispatched: in flight while the next step asks
        return call("read")

    def step1(step):
        step.model.generate(REQUEST)
        return Decision.complete()

    store = open_store(":memory:")
    run = Driver(store, ScriptedAgent([step0, step1]), DefaultPolicy(), [static_tool("read")],
                 model=ModelConfig(Slow(0.3))).start("g", limits(max_model_calls=1),
                                                      run_id="r")
    stray[0].join(5)
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "limit_model_calls", "limit_model_calls: 1 model calls made, limit 1")
    assert len(store.list_model_calls("r")) == 1
    assert store.verify_events().broken is None


# -- consumer code whose errors do not print, and specs and names that fail ------


class Unprintable(Exception):
    def __str__(self):
        raise ValueError("no text")


class NotText(Exception):
    def __str__(self):
        return 5  # type: ignore[return-value]


@pytest.mark.parametrize("exc", [Unprintable(), NotText()], ids=["raises", "not-a-str"])
def test_an_error_that_cannot_be_printed_is_recorded_under_its_type_name(exc):
    name = type(exc).__name__

    def tool(c):
        raise exc

    d, store, _, _ = make(script=[call("t"), exc], tools=[FuncTool("t", tool, timeout=5)])
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason, run.reason_detail) == ("FAILED", "agent_error", name)
    obs = store.list_steps("r")[0].observation
    assert json.loads(obs.content) == {"error": f"panic: {name}: {name}", "tool": "t"}
    settled(store, "r")

    def policy(request, view):
        raise exc

    d, store, _, _ = make(script=[call("read")], tools=[static_tool("read")],
                          policy=PolicyFunc(policy))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "internal_error", f"policy: {name}")
    settled(store, "r")


def test_a_model_error_that_cannot_be_printed_is_a_recorded_failed_call():
    store = open_store(":memory:")
    d = Driver(store, ModelToolAgent(), DefaultPolicy(), [static_tool("read")],
               model=ModelConfig(ScriptedModel([Unprintable()])))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    [c] = store.list_model_calls("r")
    assert (c.status, c.error) == ("error", "Unprintable")
    settled(store, "r")


def test_a_reconciler_whose_error_cannot_be_printed_fails_the_run_as_internal():
    def reconcile(view):
        raise Unprintable()

    d, store = stopped_with(reconcile)
    run = d.resume("r")
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "internal_error", "reconcile: Unprintable")
    settled(store, "r")


class Named:
    """A model whose ``name()`` raises ``name`` when it is an exception, or returns it."""

    def __init__(self, name):
        self._name = name

    def name(self):
        if isinstance(self._name, Exception):
            raise self._name
        return self._name

    def generate(self, request, cancel):
        return ModelResponse("done")


@pytest.mark.parametrize(("name", "says"), [
    (RuntimeError("name service down"),
     "the model's name() raised RuntimeError: name service down"),
    (["a"], "the model's name() returned a list, not a str"),
    (None, "the model's name() returned None, not a str"),
    (5, "the model's name() returned an int (5), not a str"),
])
def test_a_model_whose_name_cannot_be_read_ends_the_run_model_unavailable(name, says):
    store = open_store(":memory:")
    d = Driver(store, ModelToolAgent(), DefaultPolicy(), [static_tool("read")],
               model=ModelConfig(Named(name)))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    assert run.reason_detail == f"model unavailable after 0 attempt(s): {says}"
    assert store.list_model_calls("r") == []
    settled(store, "r")


class FailingSpec:
    """A read-only tool whose ``spec()`` raises from its ``after``-th call on."""

    def __init__(self, after: int) -> None:
        self.calls, self.after = 0, after

    def spec(self):
        self.calls += 1
        if self.calls > self.after:
            raise RuntimeError("spec source unavailable")
        return ToolSpec("read", "", b'{"type":"object"}', "read_only", timedelta(seconds=5))

    def call(self, c):
        return ToolResult(b"{}", "read")


def test_a_tool_whose_spec_starts_failing_is_left_out_and_calling_it_is_an_invalid_decision():
    d, store, _, _ = make(script=[call("read"), Decision.complete()], tools=[FailingSpec(3)])
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    first = store.list_steps("r")[0]
    assert first.observation.kind == "invalid_decision"
    assert "spec() raised RuntimeError: spec source unavailable" in first.observation.summary
    settled(store, "r")


def test_a_retry_after_in_seconds_is_honoured_and_one_of_another_type_is_refused_where_made():
    assert TransientError("429", retry_after=2).retry_after == timedelta(seconds=2)
    assert TransientError("429", retry_after=0.5).retry_after == timedelta(milliseconds=500)
    with pytest.raises(TypeError, match=r"retry_after is a str \('soon'\), not a timedelta or "
                                        "a number of seconds"):
        TransientError("429", retry_after="soon")  # type: ignore[arg-type]
    store = open_store(":memory:")
    model = ScriptedModel([TransientError("429", retry_after=0.01), ModelResponse("done")])
    run = Driver(store, ModelToolAgent(), DefaultPolicy(), [static_tool("read")],
                 model=ModelConfig(model, max_retries=1)).start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    assert [c.status for c in store.list_model_calls("r")] == ["error", "ok"]
    settled(store, "r")


@pytest.mark.parametrize(("rec", "says"), [
    (Reconciliation(None), "the reconciliation's outcome is None, not a str"),
    (Reconciliation("conflict", None), "the reconciliation's detail is None, not a str"),
    (Reconciliation("conflict", 1.5), "the reconciliation's detail is a float (1.5), not a str"),
    (Reconciliation("completed", "ok", '{"a":1}'),
     "the reconciliation's result is a str ('{\"a\":1}'), not JSON as bytes"),
    (Reconciliation("waiting", pause={"outcome": "require_approval"}),
     "the reconciliation's pause is a dict, not a PolicyDecision"),
    (Reconciliation("waiting", pause=PolicyDecision("require_approval", None)),
     "the reconciliation's pause has a NoneType reason, not a str"),
    (Reconciliation("waiting", pause=PolicyDecision("require_approval", "r", capability="c")),
     "the reconciliation's pause has a str capability, not JSON as bytes "
     "(PolicyDecision.need_approval encodes a value)"),
])
def test_a_reconciliation_with_a_field_of_the_wrong_type_fails_the_run_as_internal(rec, says):
    d, store = stopped_with(lambda view: rec)
    run = d.resume("r")
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "internal_error", f"reconcile: {says}")
    settled(store, "r")


# -- the driver's own clock and ids -----------------------------------------------


def failing_at(reading: int, bad, good):
    """A function that answers like ``good`` except at its ``reading``-th call."""
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        if calls["n"] == reading:
            return bad()
        return good()
    return fn


def _raise():
    raise RuntimeError("broken")


@pytest.mark.parametrize(("bad", "says"), [
    (_raise, "the driver's clock now() raised RuntimeError: broken"),
    (lambda: "2026-10-01T09:00:00Z", "the driver's clock now() returned a str"),
    (lambda: None, "the driver's clock now() returned None"),
])
def test_a_clock_failing_mid_run_stops_the_call_clearly_and_a_resume_finishes_the_run(bad, says):
    from agentrt.driver import ConfigError
    from agentrt.testing import FakeClock

    clock = FakeClock(step=timedelta(seconds=1))
    d, store, _, _ = make(script=[call("read", b'{"n":1}'), Decision.complete()],
                          now=failing_at(4, bad, clock))  # within the first step
    with pytest.raises(ConfigError, match=re.escape(says)):
        d.start("g", limits(), run_id="r")
    before = store.list_events("r")
    assert store.get_run("r").status == "RUNNING" and store.lease("r") == ("", None)
    assert not any(isinstance(e.at, str) for e in before)
    d2, _, _, _ = make(store=store, script=[call("read", b'{"n":1}'), Decision.complete()],
                       now=clock)
    assert d2.resume("r").status == "COMPLETED"
    settled(store, "r")


@pytest.mark.parametrize(("bad", "says"), [
    (_raise, "new_id() raised RuntimeError: broken"),
    (lambda: "", "the id new_id() returned is '', a blank str"),
    (lambda: 7, "the id new_id() returned is an int (7), not a str"),
])
def test_an_id_function_failing_mid_run_writes_nothing_with_the_bad_id(bad, says):
    from agentrt.driver import ConfigError
    from agentrt.driver.core import new_id

    d, store, _, _ = make(script=[call("read", b'{"n":1}'), Decision.complete()],
                          new_id=failing_at(2, bad, new_id))  # the second step's id
    with pytest.raises(ConfigError, match=re.escape(says)):
        d.start("g", limits(), run_id="r")
    assert all(e.step_id for e in store.list_events("r") if e.type.startswith("step."))
    assert store.get_run("r").status == "RUNNING"
    d2, _, _, _ = make(store=store, script=[call("read", b'{"n":1}'), Decision.complete()])
    assert d2.resume("r").status == "COMPLETED"
    settled(store, "r")


def test_an_id_function_that_repeats_an_id_is_said_as_such_and_the_run_is_resumable():
    from agentrt.driver import ConfigError

    d, store, _, _ = make(script=[call("read", b'{"n":1}'), Decision.complete()],
                          new_id=lambda: "always-the-same")
    with pytest.raises(ConfigError, match=re.escape(
            "new_id() returned an id already in steps (UNIQUE constraint failed: steps.id)")):
        d.start("g", limits(), run_id="r")
    assert store.get_run("r").status == "RUNNING" and store.lease("r") == ("", None)
    d2, _, _, _ = make(store=store, script=[call("read", b'{"n":1}'), Decision.complete()])
    assert d2.resume("r").status == "COMPLETED"
    settled(store, "r")


class _ClockBreakingWhen:
    """The driver's clock, failing at its first reading after ``arm()``."""

    def __init__(self) -> None:
        from agentrt.testing import FakeClock
        self.clock, self.armed = FakeClock(step=timedelta(seconds=1)), False

    def arm(self) -> None:
        self.armed = True

    def __call__(self):
        if self.armed:
            self.armed = False
            raise OSError("clock broke")
        return self.clock()


class _ArmingModel(ScriptedModel):
    """A scripted model that arms the clock once it has answered."""

    def __init__(self, replies, arm) -> None:
        super().__init__(replies)
        self._arm = arm

    def generate(self, request, cancel=None):
        try:
            return super().generate(request, cancel)
        finally:
            self._arm()


@pytest.mark.parametrize("when", ["before the dispatch", "after the model answered"])
def test_a_clock_failing_in_a_model_call_stops_it_as_a_crash_not_an_agent_error(when):
    """Before: the run FAILED as agent_error (no resume), and a clock failing
    after the answer left the row dispatched and its tokens uncharged."""
    from agentrt.driver import ConfigError

    broken = _ClockBreakingWhen()
    request = ModelRequest(messages=[Message("user", "hi")], max_output_tokens=50)

    def asking(step):
        if when == "before the dispatch":
            broken.arm()
        step.model.generate(request)
        return Decision.complete()

    model = _ArmingModel([ModelResponse(text="x", usage=Usage(1000, 1000))],
                         broken.arm if when != "before the dispatch" else lambda: None)
    d, store, _, _ = make(script=[asking], model=ModelConfig(model), now=broken)
    with pytest.raises(ConfigError, match=re.escape(
            "the driver's clock now() raised OSError: clock broke")):
        d.start("g", limits(), run_id="r")
    run = store.get_run("r")
    assert run.status == "RUNNING" and store.lease("r") == ("", None)
    calls = [(c.status, c.usage) for c in store.list_model_calls("r")]
    if when == "before the dispatch":
        assert calls == [] and model.requests == []
    else:  # recorded and charged at its dispatch time, never left dispatched
        (c,) = store.list_model_calls("r")
        assert calls == [("ok", Usage(1000, 1000))] and c.completed_at == c.dispatched_at
        assert (run.model_calls, run.usage) == (1, Usage(1000, 1000))
    d2, _, _, _ = make(store=store, script=[Decision.complete()] * 2, now=broken.clock)
    assert d2.resume("r").status == "COMPLETED"
    settled(store, "r")


def test_a_wall_clock_failing_in_a_model_call_stops_it_as_a_crash_not_an_agent_error():
    """The lease's clock (``wall``) is the driver's too: before, its failure in a
    model call failed the run as agent_error; outside one it stopped the call."""
    from datetime import UTC, datetime

    from agentrt.driver import ConfigError

    broken = _ClockBreakingWhen()
    broken.clock = lambda: datetime.now(UTC)
    request = ModelRequest(messages=[Message("user", "hi")], max_output_tokens=50)

    def asking(step):
        broken.arm()
        step.model.generate(request)
        return Decision.complete()

    model = ScriptedModel([ModelResponse(text="x", usage=Usage(1, 1))])
    d, store, _, _ = make(script=[asking], model=ModelConfig(model), wall=broken)
    with pytest.raises(ConfigError, match=re.escape(
            "the driver's clock wall() raised OSError: clock broke")):
        d.start("g", limits(), run_id="r")
    assert store.get_run("r").status == "RUNNING" and model.requests == []
    d2, _, _, _ = make(store=store, script=[Decision.complete()] * 2)
    assert d2.resume("r").status == "COMPLETED"
    settled(store, "r")


def test_a_wall_clock_failing_in_the_lease_heartbeat_stops_the_call_with_its_sentence():
    """The heartbeat thread died with a traceback on stderr, and the call later
    ended as a lost lease, not as the clock's failure (review of bb85f79)."""
    from datetime import UTC, datetime

    from agentrt.driver import ConfigError

    def wall():
        if threading.current_thread().name.startswith("agentrt-lease"):
            raise OSError("clock broke")
        return datetime.now(UTC)

    def slow(c):
        time.sleep(0.6)  # past a heartbeat (every TTL/3)
        return ToolResult(b'{"ok":true}', "ok")

    d, store, _, _ = make(script=[call("slow"), Decision.complete()],
                          tools=[FuncTool("slow", slow, timeout=5)], wall=wall,
                          lease_ttl=timedelta(seconds=0.3))
    with pytest.raises(ConfigError, match=re.escape(
            "the driver's clock wall() raised OSError: clock broke")):
        d.start("g", limits(), run_id="r")
    assert store.get_run("r").status == "RUNNING"


def test_an_id_function_that_repeats_a_model_call_id_is_said_as_such_and_not_an_agent_error():
    from agentrt.driver import ConfigError

    ids = iter(["s0", "call", "call", "s1", "call2"])
    request = ModelRequest(messages=[Message("user", "hi")], max_output_tokens=50)

    def twice(step):
        step.model.generate(request)
        step.model.generate(request)
        return Decision.complete()

    model = ScriptedModel([ModelResponse(text="x", usage=Usage(1, 1))] * 2)
    d, store, _, _ = make(script=[twice], model=ModelConfig(model), new_id=lambda: next(ids))
    with pytest.raises(ConfigError, match=re.escape(
            "new_id() returned an id already in model_calls (UNIQUE constraint failed: "
            "model_calls.id)")):
        d.start("g", limits(), run_id="r")
    assert store.get_run("r").status == "RUNNING" and store.lease("r") == ("", None)
    d2, _, _, _ = make(store=store, script=[Decision.complete()] * 2)
    assert d2.resume("r").status == "COMPLETED"
    settled(store, "r")


async def _later(*args):
    return None


def _no_warnings(fn):
    """``fn()``'s result, with no warning raised by it or by a collection after it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
        gc.collect()
    assert [str(w.message) for w in caught] == []
    return result


def test_an_async_policy_model_or_reconciler_is_a_recorded_failure_with_its_coroutine_closed():
    d, store, _, _ = make(script=[call("read", b'{"n":1}')], policy=PolicyFunc(_later))
    run = _no_warnings(lambda: d.start("g", limits(), run_id="r"))
    assert run.reason_detail == "policy: the policy returned coroutine, not a PolicyDecision"

    class AsyncModel:
        def name(self):
            return "async-model"

        async def generate(self, request, cancel):
            return None

    d = Driver(open_store(":memory:"), ModelToolAgent(), DefaultPolicy(), [static_tool("read")],
               model=ModelConfig(AsyncModel()))
    run = _no_warnings(lambda: d.start("g", limits(), run_id="r"))
    assert run.reason_detail.endswith("the model returned coroutine, not a ModelResponse")

    d, store = stopped_with(_later)
    run = _no_warnings(lambda: d.resume("r"))
    assert run.reason_detail == "reconcile: returned coroutine, not a Reconciliation"


class _AsyncObserver:
    async def __call__(self, event):
        pass


@pytest.mark.parametrize("name", ["observer", "now", "new_id", "wall", "monotonic"])
@pytest.mark.parametrize("fn", [_later, _AsyncObserver()], ids=["function", "callable"])
def test_an_async_bookkeeping_function_is_refused_when_the_driver_is_built(name, fn):
    from agentrt.driver import ConfigError

    with pytest.raises(ConfigError, match=rf"^agentrt: {name} is an async function, not .*: "
                                          "agentrt calls it synchronously"):
        Driver(open_store(":memory:"), ScriptedAgent([]), DefaultPolicy(), **{name: fn})


def test_an_async_observer_or_clock_is_refused_by_the_operator():
    from agentrt.driver import ConfigError, Operator

    for kw in ({"observer": _later}, {"now": _later}):
        with pytest.raises(ConfigError, match="is an async function"):
            Operator(open_store(":memory:"), **kw)
