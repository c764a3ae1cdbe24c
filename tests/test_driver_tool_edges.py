"""Tool edges a review found: a caller that stops while a tool ignores its token,
a spec that changes after registration, and what registration let through."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from _driver_kit import call, limits, make, types

from agentrt.driver import CancelledError, CancelToken, FuncTool, ToolResult
from agentrt.driver import worker as worker_module
from agentrt.driver.errors import ConfigError, ToolError
from agentrt.driver.tools import check_args, compile_schema
from agentrt.driver.worker import Worker
from agentrt.records import Decision, PolicyDecision, ToolSpec

# -- a caller that stops while a tool ignores its token ------------------------


class Deaf:
    """A tool blocked in something that never looks at its token (a socket read,
    say), until the test lets it go."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.tokens: list[CancelToken] = []

    def __call__(self, c):
        self.tokens.append(c.cancel)
        self.entered.set()
        self.release.wait(5)
        return ToolResult(b"{}", "fetched")


@pytest.fixture
def deaf():
    tool = Deaf()
    yield tool
    tool.release.set()


def _abandoned(store, reason: str) -> dict:
    step = store.list_steps("r")[0]
    assert step.status == "failed"
    assert step.observation.kind == "interrupted"  # cancelled, never a timeout
    error = f"abandoned when its caller stopped ({reason})"
    assert step.observation.summary == f"fetch was cancelled and its outcome is unknown: {error}"
    content = json.loads(step.observation.content)
    assert content == {"error": error, "failure": "cancelled", "tool": "fetch"}
    return content


def test_the_callers_deadline_stops_the_wait_on_a_tool_that_ignores_its_token(deaf):
    d, store, _, _ = make(script=[call("fetch"), Decision.complete()],
                          tools=[FuncTool("fetch", deaf, timeout=60)])
    began = time.monotonic()
    with pytest.raises(CancelledError, match="deadline exceeded"):
        d.start("g", limits(), run_id="r", cancel=CancelToken(timeout=0.2))
    assert time.monotonic() - began < 1.5  # the tool holds on for 5 s
    _abandoned(store, "deadline exceeded")
    assert deaf.tokens[0].cancelled  # and it was asked to stop
    assert store.get_run("r").status == "RUNNING" and store.lease("r") == ("", None)
    assert d.resume("r").status == "COMPLETED"  # left for a resume, which runs no tool
    assert len(deaf.tokens) == 1


def test_a_cancel_from_another_thread_stops_the_wait_on_a_tool_that_ignores_its_token(deaf):
    d, store, _, _ = make(script=[call("fetch"), Decision.complete()],
                          tools=[FuncTool("fetch", deaf, timeout=60)])
    token = CancelToken()
    canceller = threading.Thread(target=lambda: deaf.entered.wait(5) and token.cancel("ops"))
    canceller.start()
    began = time.monotonic()
    with pytest.raises(CancelledError, match="ops"):
        d.start("g", limits(), run_id="r", cancel=token)
    canceller.join()
    assert time.monotonic() - began < 1.5
    _abandoned(store, "ops")
    assert deaf.tokens[0].cancelled


def test_an_abandoned_call_after_an_operators_cancel_is_appended_late_as_cancelled(deaf):
    d, store, _, _ = make(script=[call("fetch"), Decision.complete()],
                          tools=[FuncTool("fetch", deaf, side_effect="local_mutation",
                                          timeout=60)])
    token = CancelToken()

    def operator_then_caller():
        deaf.entered.wait(5)
        d.cancel("r", "ops", "halt")
        token.cancel()

    stopper = threading.Thread(target=operator_then_caller)
    stopper.start()
    run = d.start("g", limits(), run_id="r", cancel=token)
    stopper.join()
    assert (run.status, run.reason) == ("CANCELLED", "operator_cancelled")
    events = store.list_events("r")
    assert [e.type for e in events[-2:]] == ["run.finished", "step.tool_finished"]
    late = json.loads(events[-1].payload)
    assert late["late"] is True and late["tool"] == "fetch"
    assert late["observation"]["kind"] == "interrupted"
    error = late["observation"]["content"]["error"]
    assert error == "abandoned when its caller stopped (cancelled)"
    assert store.list_steps("r")[0].observation.summary == "cancelled by operator: halt"
    assert store.verify_events().broken is None


def test_the_callers_deadline_passing_in_a_tool_that_honours_its_token_stops_the_run_as_cancelled():
    """The tool's token carries the caller's deadline (the sooner of it and the
    tool's timeout): when that one passes, the tool stopping is the caller's
    cancel, not the tool's own timeout, and the run never goes on past it."""

    def honours(c):
        c.cancel.wait()
        raise ToolError("stopped: " + c.cancel.reason)

    for _ in range(6):
        d, store, _, _ = make(script=[call("fetch"), Decision.complete()],
                              tools=[FuncTool("fetch", honours, timeout=60)])
        with pytest.raises(CancelledError, match="deadline exceeded"):
            d.start("g", limits(), run_id="r", cancel=CancelToken(timeout=0.3))
        step = store.list_steps("r")[0]
        assert step.observation.kind == "interrupted"
        content = json.loads(step.observation.content)
        assert content == {"error": "stopped: deadline exceeded", "failure": "cancelled",
                           "tool": "fetch"}
        assert store.get_run("r").status == "RUNNING"


class CountingToken(CancelToken):
    """A token that counts how often a wait looks at it."""

    __slots__ = ("looks",)

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    @property
    def done(self) -> bool:
        self.looks += 1
        return super().done


def test_a_call_that_returns_at_once_is_waited_for_without_looking_at_the_callers_token():
    worker, token = Worker(), CountingToken()
    try:
        out = worker.call(lambda: 42, 5.0, stop=token)
    finally:
        worker.close()
    assert out is not None and out.value == 42
    assert token.looks == 0  # one acquire, as without a caller's token: no extra wake-up


# -- a spec that changes after registration ------------------------------------


class Changing:
    """A tool whose spec() turns into ``turned`` once ``changed`` is set (a reloaded
    configuration, say)."""

    def __init__(self, spec: ToolSpec, turned: ToolSpec) -> None:
        self.spec_, self.turned = spec, turned
        self.changed = False
        self.calls = 0

    def spec(self) -> ToolSpec:
        return self.turned if self.changed else self.spec_

    def call(self, c):
        self.calls += 1
        return ToolResult(b"{}", "ran")


def _spec(name: str = "write", side_effect: str = "local_mutation",
          timeout: timedelta = timedelta(seconds=5)) -> ToolSpec:
    return ToolSpec(name, "", b'{"type":"object"}', side_effect, timeout, False)


def _change_at_the_first_step(tool: Changing):
    """An observer that changes the tool once the run's first step has started (after
    the start recorded its spec, before the step reads it)."""
    def observe(event):
        if event.type == "step.started":
            tool.changed = True
    return observe


@pytest.mark.parametrize(("turned", "said"), [
    (_spec(name="write_v2"), 'spec() now names the tool "write_v2"; it was registered as "write"'),
    (_spec(timeout=timedelta(seconds=-1)), "its spec: timeout is required"),
    (_spec(timeout=timedelta(0)), "its spec: timeout is required"),
    (_spec(side_effect="bogus"), 'its spec: invalid side effect "bogus"'),
])
def test_a_spec_that_turns_unregistrable_is_an_invalid_decision_and_the_tool_does_not_run(
        turned, said):
    tool = Changing(_spec(), turned)
    d, store, _, _ = make(script=[call("write"), Decision.complete()], tools=[tool],
                          observer=_change_at_the_first_step(tool))
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    assert tool.calls == 0
    step = store.list_steps("r")[0]
    assert step.observation.kind == "invalid_decision"
    assert step.observation.summary == f'invalid decision: tool "write": {said}'
    assert "step.policy" not in types(store, "r")
    assert "step.tool_started" not in types(store, "r")


def test_a_resume_whose_approved_tool_now_names_itself_differently_is_refused_and_waits():
    tool = Changing(_spec("publish", "remote_mutation"), _spec("publish_v2", "remote_mutation"))
    d, store, _, _ = make(script=[call("publish"), Decision.complete()], tools=[tool])
    assert d.start("g", limits(), run_id="r").status == "WAITING_FOR_APPROVAL"
    d.approve("r", store.list_approvals("r")[0].id, "ops")
    tool.changed = True
    with pytest.raises(ConfigError, match=r'approved tool "publish": spec\(\) now names the '
                                          r'tool "publish_v2".*the run is left waiting'):
        d.resume("r")
    assert store.get_run("r").status == "WAITING_FOR_APPROVAL"
    assert tool.calls == 0


def test_a_start_whose_tool_spec_now_fails_its_checks_is_refused_naming_the_tool():
    tool = Changing(_spec(), _spec(name="write_v2"))
    d, store, _, _ = make(script=[Decision.complete()], tools=[tool])
    tool.changed = True
    with pytest.raises(ConfigError, match=r'start run: tool "write": spec\(\) now names the '
                                          r'tool "write_v2".*nothing was written'):
        d.start("g", limits(), run_id="r")
    assert store.list_runs() == []


class Shifty:
    """A tool whose spec() names it differently at each reading."""

    def __init__(self) -> None:
        self.reads = 0

    def spec(self) -> ToolSpec:
        self.reads += 1
        return _spec(name=f"write{self.reads}")

    def call(self, c):
        return b"{}"


def test_a_tool_whose_spec_changes_while_it_is_registered_is_refused():
    with pytest.raises(ConfigError, match='tool "write1": spec\\(\\) now names the tool "write2"'):
        make(tools=[Shifty()])


def test_a_tool_whose_spec_raises_at_registration_is_refused_in_one_sentence():
    class Broken:
        def spec(self):
            raise RuntimeError("config file missing")

        def call(self, c):
            return b"{}"

    with pytest.raises(ConfigError, match=r"tools\[0\]\.spec\(\) raised RuntimeError: "
                                          "config file missing"):
        make(tools=[Broken()])


# -- a reference under a property or definition named like a keyword -----------


@pytest.mark.parametrize("schema", [
    b'{"type":"object","properties":{"default":{"$ref":"https://example.com/s.json"}}}',
    b'{"type":"object","properties":{"enum":{"$ref":"#/$defs/missing"}}}',
    b'{"$defs":{"examples":{"$ref":"file:///etc/passwd"}},"$ref":"#/$defs/examples"}',
    b'{"definitions":{"const":{"$ref":"https://example.com/s.json"}}}',
    b'{"patternProperties":{"default":{"$ref":"https://example.com/s.json"}}}',
    b'{"dependentSchemas":{"enum":{"$ref":"https://example.com/s.json"}}}',
])
def test_a_reference_under_a_schema_named_like_a_keyword_is_refused_at_registration(schema):
    with pytest.raises(ConfigError, match="refers to"):
        make(tools=[FuncTool("x", lambda c: b"{}", input_schema=schema)])


def test_a_property_named_like_a_keyword_is_checked_as_a_schema():
    """Its reference is looked up like any other: a defined one is used."""
    validator = compile_schema(
        b'{"$defs":{"n":{"type":"integer"}},"properties":{"default":{"$ref":"#/$defs/n"}}}')
    assert check_args(validator, b'{"default":1}') is None
    assert '"x" does not satisfy "type": "integer"' in check_args(validator, b'{"default":"x"}')
    with pytest.raises(ValueError, match="#/\\$defs/m, which it does not define"):
        compile_schema(b'{"$defs":{"n":{}},"properties":{"default":{"$ref":"#/$defs/m"}}}')


# -- a policy's name -----------------------------------------------------------


class Allowing:
    def evaluate(self, request, view):
        return PolicyDecision.allow("ok")


def test_a_policy_naming_itself_with_an_attribute_is_refused_in_one_sentence():
    class Named(Allowing):
        policy_id = "team-policy/v3"

    with pytest.raises(ConfigError, match=r"policy\.policy_id is a str \('team-policy/v3'\), "
                                          r"not a method policy_id\(self\) -> str"):
        make(policy=Named())


def test_a_policy_whose_policy_id_raises_is_refused_in_one_sentence():
    class Failing(Allowing):
        def policy_id(self):
            raise KeyError("POLICY_ID")

    with pytest.raises(ConfigError, match=r"policy\.policy_id\(\) raised KeyError"):
        make(policy=Failing())


def test_an_async_policy_id_is_refused_in_one_sentence():
    class Async(Allowing):
        async def policy_id(self):
            return "p"

    with pytest.raises(ConfigError, match=r"policy\.policy_id is an async function"):
        make(policy=Async())


def test_a_tool_that_honours_its_token_is_waited_for_while_it_winds_down():
    """A caller's cancel asks the tool to stop; one that does, and needs a moment
    to roll back, is waited for (up to half a second) and its outcome recorded."""
    rolled_back: list[bool] = []

    def deploy(c):
        c.cancel.wait(30)  # honours its token at once...
        time.sleep(0.2)  # ...and takes a moment to roll its half-done change back
        rolled_back.append(True)
        return ToolResult(b'{"rolled_back":true}', "rolled back")

    token = CancelToken()
    d, store, _, _ = make(script=[call("deploy"), Decision.complete()],
                          tools=[FuncTool("deploy", deploy, side_effect="local_mutation",
                                          timeout=60)])
    threading.Timer(0.1, token.cancel, ("ctrl-c",)).start()
    with pytest.raises(CancelledError):
        d.start("g", limits(), run_id="r", cancel=token)
    assert rolled_back == [True]
    assert store.list_steps("r")[0].observation.kind == "tool_result"


def test_a_worker_whose_thread_could_not_start_starts_one_at_the_next_call(monkeypatch):
    """Before, the worker kept the thread that never ran, and the next tool call
    sat out its whole timeout on it and came back as a timeout."""
    start = worker_module._Thread.start
    failures = [RuntimeError("can't start new thread")]

    def start_once_failing(thread: object) -> None:
        if failures:
            raise failures.pop()
        start(thread)

    monkeypatch.setattr(worker_module._Thread, "start", start_once_failing)
    worker = Worker()
    with pytest.raises(RuntimeError):
        worker.call(lambda: 1, 5.0)
    began = time.monotonic()
    out = worker.call(lambda: 42, 5.0)
    worker.close()
    assert out is not None and out.value == 42 and time.monotonic() - began < 2


def test_a_worker_thread_that_started_before_start_raised_is_ended_all_the_same(monkeypatch):
    """A Ctrl-C landing in ``Thread.start()`` once the thread runs: it is not kept,
    so nothing else would tell it to end; it would wait on its queue for good."""
    start = worker_module._Thread.start

    def start_then_interrupted(thread: threading.Thread) -> None:
        start(thread)
        raise KeyboardInterrupt

    monkeypatch.setattr(worker_module._Thread, "start", start_then_interrupted)
    worker = Worker(name="started-then-interrupted")
    with pytest.raises(KeyboardInterrupt):
        worker.call(lambda: 1, 1.0)
    worker.close()
    threads = [t for t in threading.enumerate() if t.name == "started-then-interrupted"]
    for thread in threads:
        thread.join(5)
    assert threads and not any(t.is_alive() for t in threads)
