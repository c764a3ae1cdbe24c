"""The driver where it meets its environment: a caller's deadline, a Ctrl-C, SQLite's limits."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from datetime import timedelta

import apsw
import pytest
from _driver_kit import call, limits
from eventdb import child_process

from agentrt.driver import (
    AgentFunc,
    CancelledError,
    CancelToken,
    DefaultPolicy,
    Driver,
    FuncTool,
    ToolResult,
)
from agentrt.records import Decision
from agentrt.store import open_store


def _threads_named(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


def test_a_callers_token_with_a_deadline_stops_the_run_when_it_passes(tmp_path):
    """A CancelToken(timeout=...) handed to start is the caller's deadline: once it
    passes the call stops as a cancel stops it (it went on to the step limit, each
    tool's token already timed out), and the run is left for a resume."""
    store = open_store(str(tmp_path / "d.db"))
    ran: list[str] = []

    def work(c):
        ran.append(c.step_id)
        c.cancel.wait(0.05)
        return ToolResult(b"{}", "worked")

    def decide(step):
        if step.run.goal == "finish":
            return Decision.complete()
        return call("work", b'{"i":%d}' % len(step.steps))

    d = Driver(store, AgentFunc(decide), DefaultPolicy(),
               [FuncTool("work", work, side_effect="read_only", timeout=10)])
    began = time.monotonic()
    with pytest.raises(CancelledError, match="deadline exceeded"):
        d.start("go on", limits(max_steps=400, loop_threshold=1000), run_id="r",
                cancel=CancelToken(timeout=0.3))
    assert time.monotonic() - began < 5
    assert len(ran) < 100
    run = store.get_run("r")
    assert run.status == "RUNNING" and run.step_count < 100
    assert store.lease("r") == ("", None)
    assert _threads_named("agentrt-deadline") == []

    # A deadline that does not pass stops nothing, and leaves no timer behind.
    d2 = Driver(store, AgentFunc(lambda step: Decision.complete()), DefaultPolicy())
    assert d2.resume("r", cancel=CancelToken(timeout=60)).status == "COMPLETED"
    assert _threads_named("agentrt-deadline") == []


_CTRL_C_CHILD = textwrap.dedent("""
    import sys, threading, time
    from datetime import timedelta
    from agentrt.driver import (AgentFunc, DefaultPolicy, Driver, FuncTool, ModelConfig,
                                ModelRequest, ModelResponse, Message, ToolResult)
    from agentrt.records import Decision, Limits, Usage
    from agentrt.store import open_store

    where = sys.argv[2]
    said = []

    def wait_for_stop(token):
        print("waiting", flush=True)
        stopped = token.wait(20)
        said.append(f"stopped={stopped} reason={token.reason}")
        return stopped

    def tool(c):
        wait_for_stop(c.cancel)
        return ToolResult(b"{}", "done")

    class Model:
        def name(self):
            return "m"

        def generate(self, request, token):
            wait_for_stop(token)
            return ModelResponse(text="t", usage=Usage(1, 1))

    def decide(step):
        if where == "model":
            step.model.generate(ModelRequest(messages=[Message("user", "hi")],
                                             max_output_tokens=5))
        return Decision.tool_call("act", b"{}")

    d = Driver(open_store(sys.argv[1]), AgentFunc(decide), DefaultPolicy(),
               [FuncTool("act", tool, side_effect="local_mutation", timeout=60)],
               model=ModelConfig(Model(), call_timeout=timedelta(seconds=60)))
    try:
        d.start("g", Limits(max_steps=5, max_consecutive_tool_failures=3, loop_threshold=3),
                run_id="r")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    # The program goes on (a REPL, a notebook): the abandoned call is on its own.
    deadline = time.monotonic() + 5
    while not said and time.monotonic() < deadline:
        time.sleep(0.01)
    print(said[0] if said else "still running", flush=True)
""")


@pytest.mark.parametrize("where", ["tool", "model"])
def test_a_ctrl_c_while_a_call_runs_asks_the_abandoned_call_to_stop(tmp_path, where):
    """Ctrl-C in a driver process ends its wait for a tool or a model attempt, not
    the call: the call, abandoned, is asked to stop through its token (as at its
    timeout) instead of running on unasked, its outcome never recorded."""
    script = tmp_path / "child.py"
    script.write_text(_CTRL_C_CHILD)
    db = str(tmp_path / "c.db")
    with child_process([sys.executable, str(script), db, where]) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"waiting\n", proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert out.decode().splitlines() == ["interrupted", "stopped=True reason=interrupted"]
    store = open_store(db)
    run = store.get_run("r")
    assert run.status == "RUNNING" and store.lease("r") == ("", None)
    status = "executing" if where == "tool" else "deciding"
    assert [s.status for s in store.list_steps("r")] == [status]


def test_a_tool_outcome_too_large_to_store_is_a_recorded_tool_error_and_the_run_goes_on(
        tmp_path):
    """A tool outcome past SQLite's length limit is recorded as a tool error that says
    so, and the run goes on; it raised apsw.TooBigError out of start, the step left
    executing as if the process had died, though the tool had finished."""
    store = open_store(str(tmp_path / "big.db"))
    store.db().limit(apsw.SQLITE_LIMIT_LENGTH, 100_000)
    calls: list[str] = []

    def big(c):
        calls.append(c.step_id)
        return ToolResult(b'{"x":"' + b"a" * 200_000 + b'"}', "big")

    def decide(step):
        return call("big") if not step.steps else Decision.complete()

    d = Driver(store, AgentFunc(decide), DefaultPolicy(),
               [FuncTool("big", big, side_effect="local_mutation", timeout=10)])
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED" and len(calls) == 1
    first = store.list_steps("r")[0]
    assert first.status == "failed" and first.observation is not None
    assert first.observation.kind == "tool_error"
    assert "too large to store" in first.observation.summary
    assert [e.type for e in store.list_events("r")][4:8] == [
        "step.policy", "step.tool_started", "step.tool_finished", "step.failed"]
    assert store.verify_events(0, 0).broken is None
    assert os.path.getsize(str(tmp_path / "big.db")) < 1_000_000


def test_a_tool_does_not_start_on_a_lease_that_ran_out_while_waiting_for_the_write_lock(
        tmp_path):
    """The tool-start check read the wall clock before BEGIN IMMEDIATE, which may
    wait the 5 s busy timeout for another writer: a short lease could run out in
    that wait, and the tool start on it. Here the wait "takes" an hour."""
    from agentrt.driver import PolicyFunc
    from agentrt.driver.lease import wall_now
    from agentrt.errors import LeaseLostError
    from agentrt.records import PolicyDecision

    store = open_store(str(tmp_path / "lock.db"))
    ran: list[str] = []
    waited = threading.Event()

    def wall():
        late = waited.is_set() and store.db().in_transaction
        return wall_now() + (timedelta(hours=1) if late else timedelta(0))

    def rule(view, request):
        waited.set()  # the next transaction is the tool start's: its lock wait is long
        return PolicyDecision.allow("fine")

    d = Driver(store, AgentFunc(lambda step: call("work")), PolicyFunc(rule),
               [FuncTool("work", lambda c: ran.append("work") or ToolResult(b"{}", "ok"),
                         side_effect="read_only", timeout=5)], wall=wall)
    with pytest.raises(LeaseLostError):
        d.start("g", limits(), run_id="r")
    assert ran == []
    assert [s.status for s in store.list_steps("r")] == ["deciding"]
