"""Every state transition commits with the events that explain it, in one transaction.

Right after each commit of the store's connection (SQLite's WAL hook runs
then, before the driver writes anything else), a second connection reads the
committed tables and events and holds them to each other. Were a transition
and its events split over two commits (a run's status before its
``run.finished``, a step's end before its event, a model call's row before
its result), the commit between them would show one without the other.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import apsw
import pytest
from _driver_kit import call, fixture_tools, limits, make

from agentrt.driver import (
    FuncTool,
    Message,
    ModelConfig,
    ModelRequest,
    ModelResponse,
    PolicyFunc,
    ServedError,
    ToolResult,
    cancel,
)
from agentrt.records import Decision, PolicyDecision, Usage
from agentrt.store import open_store
from agentrt.testing import ScriptedModel, rate_limited

_ENDED = ("COMPLETED", "FAILED", "CANCELLED")
_PAUSE_OR_RESUME = ("approval.requested", "run.resumed", "run.finished")


def _disagreements(conn: apsw.Connection) -> list[str]:
    """Where the committed tables and events say different things."""
    out = []
    events: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for run_id, step_id, type_, payload in conn.execute(
            "SELECT run_id, step_id, type, payload_json FROM events ORDER BY seq"):
        events.setdefault(run_id, []).append((step_id, type_, json.loads(payload)))
    for run_id, status in conn.execute("SELECT id, status FROM runs"):
        log = events.get(run_id, [])
        finished = any(t == "run.finished" for _, t, _ in log)
        if (status in _ENDED) != finished:
            out.append(f"run {run_id} is {status}, run.finished logged: {finished}")
        last = [t for _, t, _ in log if t in _PAUSE_OR_RESUME][-1:]
        if (status == "WAITING_FOR_APPROVAL") != (last == ["approval.requested"]):
            out.append(f"run {run_id} is {status}, last pause or resume logged: {last}")
    for step_id, run_id, status in conn.execute("SELECT id, run_id, status FROM steps"):
        own = [t for s, t, p in events.get(run_id, []) if s == step_id and not p.get("late")]
        if not own or own[0] != "step.started":
            out.append(f"step {step_id} is stored without its step.started: {own}")
        if status == "executing" and own[-1:] != ["step.tool_started"]:
            out.append(f"step {step_id} is executing, its last event {own[-1:]}")
        if own[-1:] == ["step.failed"] and status != "failed":
            out.append(f"step {step_id} is {status} after step.failed")
    for call_id, run_id, status in conn.execute("SELECT id, run_id, status FROM model_calls"):
        logged = [t for _, t, p in events.get(run_id, []) if p.get("call_id") == call_id]
        open_call = logged == ["model.dispatched"]
        if (status == "dispatched") != open_call:
            out.append(f"model call {call_id} is {status}, logged {logged}")
    for approval_id, status in conn.execute("SELECT id, status FROM approvals"):
        decided = [p.get("status") for log in events.values() for _, t, p in log
                   if t == "approval.decided" and p.get("approval_id") == approval_id]
        if (status != "pending") != bool(decided) and status != "expired":
            out.append(f"approval {approval_id} is {status}, decisions logged {decided}")
    return out


class _Checker:
    """Checks the committed state after every commit of a store's connection."""

    def __init__(self, path: str) -> None:
        self.conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
        self.commits = 0
        self.problems: list[str] = []

    def watch(self, store: Any) -> None:
        store.db().set_wal_hook(self._committed)

    def _committed(self, conn: Any, name: str, pages: int) -> int:
        self.commits += 1
        self.problems += [f"after commit {self.commits}: {p}" for p in _disagreements(self.conn)]
        return apsw.SQLITE_OK


REQUEST = ModelRequest(messages=[Message("user", "hi")], max_output_tokens=20)


def _asking_the_model(step: Any) -> Decision:
    step.model.generate(REQUEST)
    return call("read", b'{"n":1}')


def _run_scenario(name: str, path: str, checker: _Checker) -> None:
    store = open_store(path)
    checker.watch(store)
    kw: dict[str, Any] = {"store": store}
    if name == "tools, an invalid request, a denial, then complete":
        d, *_ = make(script=[call("read", b'{"n":1}'), call("read", b'{"n":"x"}'),
                             call("wipe", b'{}'), call("write", b'{"n":2}'),
                             Decision.complete(result=b'{"ok":true}')], **kw)
        d.start("g", limits(), run_id="r")
    elif name == "a fail decision":
        d, *_ = make(script=[Decision.fail("gave up")], **kw)
        d.start("g", limits(), run_id="r")
    elif name == "a pause, approved, resumed, completed":
        d, *_ = make(script=[call("publish"), Decision.complete()], **kw)
        d.start("g", limits(), run_id="r")
        d.approve("r", store.list_approvals("r")[0].id, "op")
        d.resume("r")
    elif name == "a pause rejected":
        d, *_ = make(script=[call("publish")], **kw)
        d.start("g", limits(), run_id="r")
        d.reject("r", store.list_approvals("r")[0].id, "op", "no")
    elif name == "a policy asking again at the resume":
        asked = iter([1, 2])
        policy = PolicyFunc(lambda r, v: PolicyDecision.need_approval(
            "manual", "ask", {"round": next(asked)}))
        d, *_ = make(script=[call("read", b'{"n":1}')], policy=policy, **kw)
        d.start("g", limits(), run_id="r")
        d.approve("r", store.list_approvals("r")[0].id, "op")
        d.resume("r")
    elif name == "model calls retried, served errors, then the step limit":
        model = ScriptedModel([rate_limited(), ModelResponse(text="a", usage=Usage(5, 1)),
                               ServedError("filtered", Usage(3, 0))])
        d, *_ = make(script=[_asking_the_model, _asking_the_model],
                     model=ModelConfig(model, max_retries=1, backoff=timedelta(milliseconds=1)),
                     **kw)
        d.start("g", limits(max_steps=1), run_id="r")
    elif name == "an operator cancel while a tool runs":
        def tool(c: Any) -> ToolResult:
            cancel(store, c.run_id, "alice", "stop")
            return ToolResult(b'{"x":1}', "done late")
        d, *_ = make(script=[call("t"), Decision.complete()],
                     tools=[*fixture_tools(), FuncTool("t", tool, timeout=5)], **kw)
        d.start("g", limits(), run_id="r")
    else:
        raise AssertionError(name)
    store.close()


@pytest.mark.parametrize("scenario", [
    "tools, an invalid request, a denial, then complete",
    "a fail decision",
    "a pause, approved, resumed, completed",
    "a pause rejected",
    "a policy asking again at the resume",
    "model calls retried, served errors, then the step limit",
    "an operator cancel while a tool runs",
])
def test_every_commit_leaves_the_tables_and_the_events_saying_the_same(tmp_path, scenario):
    path = str(tmp_path / "runs.db")
    open_store(path).close()
    checker = _Checker(path)
    try:
        _run_scenario(scenario, path, checker)
        assert checker.commits >= 3, checker.commits
        assert checker.problems == []
        assert _disagreements(checker.conn) == []
    finally:
        checker.conn.close()
