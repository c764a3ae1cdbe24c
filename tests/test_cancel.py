"""Operator cancel: at any time, needing no lease; a tool still running is recorded late."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import pytest
from _driver_kit import call, limits, make, types
from eventdb import REPO_ROOT, child_process

from agentrt.driver import FuncTool, Operator, ToolResult, approve, cancel
from agentrt.errors import RunStateError
from agentrt.records import Decision
from agentrt.store import open_existing
from agentrt.testing import FakeClock


def test_cancel_of_an_approved_but_unresumed_run():
    d, store, _, _ = make(script=[call("publish"), Decision.complete()])
    run = d.start("g", limits(), run_id="r")
    a = store.list_approvals("r")[0]
    approve(store, "r", a.id, "operator")
    run = cancel(store, "r", "operator", "changed my mind")
    assert (run.status, run.reason, run.reason_detail) == ("CANCELLED", "operator_cancelled",
                                                           "changed my mind")
    step = store.list_steps("r")[0]
    assert step.status == "failed" and step.observation.kind == "interrupted"
    assert json.loads(step.observation.content) == {"by": "operator", "note": "changed my mind"}
    assert step.observation.summary == "cancelled by operator: changed my mind"
    assert store.get_approval("r", a.id).status == "approved"  # left as it was
    finished = json.loads(store.list_events("r")[-1].payload)
    assert finished == {"by": "operator", "detail": "changed my mind",
                        "reason": "operator_cancelled", "status": "CANCELLED", "steps": 1}
    with pytest.raises(RunStateError):
        d.resume("r")


def test_a_live_loop_stops_at_its_next_write():
    holder: dict = {}

    def decide(step):
        cancel(holder["store"], "r", "operator", "stop now")
        return call("read", b'{"n":1}')

    d, store, _, _ = make(script=[decide, Decision.complete()])
    holder["store"] = store
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("CANCELLED", "operator_cancelled")
    step = store.list_steps("r")[0]
    assert (step.status, step.observation.kind) == ("failed", "interrupted")
    assert step.decision is None  # the decision write was refused
    assert types(store, "r")[-1] == "run.finished"


def test_a_tool_outcome_is_appended_late_after_the_cancel():
    holder: dict = {}

    def transfer(c):
        cancel(holder["store"], "r", "operator", "halt")
        return ToolResult(b'{"moved":100}', "moved 100")

    d, store, _, _ = make(script=[call("transfer"), Decision.complete()],
                          tools=[FuncTool("transfer", transfer, side_effect="local_mutation",
                                          timeout=5)])
    holder["store"] = store
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("CANCELLED", "operator_cancelled")
    events = store.list_events("r")
    assert [e.type for e in events[-2:]] == ["run.finished", "step.tool_finished"]
    late = json.loads(events[-1].payload)
    assert late["late"] is True and late["summary"] == "moved 100" and late["tool"] == "transfer"
    assert late["observation"]["content"] == {"moved": 100}
    assert list(late) == ["content_hash", "duration_ms", "late", "observation", "summary", "tool"]
    step = store.list_steps("r")[0]
    assert step.observation.kind == "interrupted"  # the step keeps what the cancel wrote
    assert store.verify_events().broken is None


def test_the_cancelled_fixture_scenario_with_a_blocked_tool():
    """export.md's `cancelled` fixture: cancel while a tool blocks, then release it."""
    release, entered = threading.Event(), threading.Event()

    def block(c):
        entered.set()
        release.wait(20)
        return ToolResult(b'{"late":true}', "finished after cancel")

    d, store, _, _ = make(script=[call("block"), Decision.complete(b"{}")],
                          tools=[FuncTool("block", block, side_effect="local_mutation",
                                          timeout=30)])
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(run=d.start("cancel me", limits(),
                                                               run_id="cancelled-run")))
    t.start()
    entered.wait(10)
    assert types(store, "cancelled-run")[-1] == "step.tool_started"
    cancel(store, "cancelled-run", "operator", "changed my mind")
    release.set()
    t.join(10)
    assert out["run"].status == "CANCELLED"
    assert types(store, "cancelled-run")[-2:] == ["run.finished", "step.tool_finished"]


def test_cancel_uses_the_callers_clock_and_refuses_a_finished_run():
    c = FakeClock()
    d, store, _, _ = make(script=[call("publish")])
    d.start("g", limits(), run_id="r")
    run = Operator(store, now=c).cancel("r", "ops", "")
    assert run.finished_at == c.peek()
    with pytest.raises(RunStateError, match="run r is already CANCELLED"):
        d.cancel("r", "ops", "")


# The recipe docs/architecture.md gives for Ctrl-C: a signal sets an event from a
# thread (stop_on_signals), and a thread of the program cancels the token.
CTRL_C_PROGRAM = """
import sys, threading
sys.path.insert(0, sys.argv[2])
from _driver_kit import call, limits, make
from agentrt.driver import CancelledError, CancelToken, FuncTool, ToolResult
from agentrt.records import Decision
from agentrt.store import open_store
from agentrt_export import stop_on_signals

token = CancelToken()
stop = threading.Event()
stop_on_signals(stop)
threading.Thread(target=lambda: (stop.wait(), token.cancel("ctrl-c")), daemon=True).start()

def write(c):
    print("running", flush=True)
    c.cancel.wait(30)  # a tool that honours its token
    return ToolResult(b'{"stopped":true}', "stopped")

d, store, _, _ = make(store=open_store(sys.argv[1]), script=[call("write"), Decision.complete()],
                      tools=[FuncTool("write", write, side_effect="local_mutation", timeout=60)])
try:
    d.start("g", limits(), run_id="r", cancel=token)
except CancelledError as exc:
    print(f"cancelled: {exc}", flush=True)
"""


def test_ctrl_c_through_stop_on_signals_cancels_a_running_driver(tmp_path):
    path = str(tmp_path / "runs.db")
    with child_process([sys.executable, "-c", CTRL_C_PROGRAM, path,
                        os.path.join(REPO_ROOT, "tests")]) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"running\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert (proc.returncode, err) == (0, b""), err
    assert out.startswith(b"cancelled: ")
    with open_existing(path) as store:
        (step,) = store.list_steps("r")
        assert step.observation.content == b'{"stopped":true}'  # the effect is recorded
        assert store.get_run("r").status == "RUNNING"  # for a resume, as a stopped caller
