"""Crash recovery: takeover, interrupted steps, reconciliation, and real dying processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from _driver_kit import SCHEMA_N, call, limits, types
from stress import rounds

from agentrt.driver import (
    DefaultPolicy,
    Driver,
    FuncTool,
    Reconciliation,
    ToolResult,
    approve,
    reject,
)
from agentrt.errors import LeaseLostError, RunLeasedError, RunStateError
from agentrt.records import Decision, PolicyDecision, ToolSpec
from agentrt.store import open_store
from agentrt.testing import FakeClock, ScriptedAgent, static_tool

ROOT = Path(__file__).resolve().parent.parent


class Crashed:
    """A run whose driver hangs inside a tool until its lease has expired: to the
    store it is exactly a process that died mid-tool."""

    def __init__(self, tool: str = "write", side_effect: str = "local_mutation",
                 args: bytes = b'{"n":1}', deciding: bool = False) -> None:
        self.store = open_store(":memory:")
        self.wall = FakeClock()
        self.release = threading.Event()
        entered = threading.Event()

        def hang(c):
            entered.set()
            self.release.wait(20)
            return ToolResult(b"{}", "too late")

        def hang_deciding(step):
            entered.set()
            self.release.wait(20)
            return Decision.complete()

        fn = FuncTool(tool, hang, side_effect=side_effect, input_schema=SCHEMA_N, timeout=60)
        script = [hang_deciding] if deciding else [call(tool, args)]
        self.crasher = Driver(self.store, ScriptedAgent(script), DefaultPolicy(), [fn],
                              wall=self.wall, lease_owner="crasher", lease_ttl=60)
        self.outcome: dict = {}

        def run() -> None:
            try:
                self.outcome["run"] = self.crasher.start("survive a crash", limits(),
                                                         run_id="r")
            except Exception as exc:  # noqa: BLE001
                self.outcome["error"] = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        entered.wait(10)
        self.wall.advance(timedelta(seconds=61))

    def resumer(self, script, tools=None, **kw) -> Driver:
        if tools is None:
            tools = [static_tool("write", "local_mutation", input_schema=SCHEMA_N,
                                 calls=kw.pop("calls", None))]
        return Driver(self.store, ScriptedAgent(script), kw.pop("policy", DefaultPolicy()),
                      tools, wall=self.wall, lease_owner="resumer", lease_ttl=60, **kw)

    def finish(self) -> None:
        self.release.set()
        self.thread.join(10)


@pytest.fixture
def crashed():
    made: list[Crashed] = []

    def make(**kw) -> Crashed:
        c = Crashed(**kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.finish()


def test_an_interrupted_side_effect_waits_for_an_operator(crashed):
    c = crashed()
    calls: list = []
    b = c.resumer([None, Decision.complete(b'{"written":true}')], calls=calls)
    run = b.resume("r")
    assert run.status == "WAITING_FOR_APPROVAL" and calls == []
    (a,) = c.store.list_approvals("r")
    step = c.store.list_steps("r")[0]
    assert (a.kind, a.step_id, step.status) == ("interrupted_side_effect", step.id,
                                                "awaiting_approval")
    assert step.observation is None and step.policy_id == ""
    presentation = json.loads(a.presentation)
    assert "outcome was recorded, so whether it took effect is unknown" in presentation["notice"]
    assert (presentation["tool"], presentation["side_effect"]) == ("write", "local_mutation")
    assert c.store.approval_reason("r", a.id) == "interrupted while executing; outcome unknown"
    policy = json.loads([e for e in c.store.list_events("r") if e.type == "step.policy"][-1]
                        .payload)
    assert "view" not in policy and "policy_id" not in policy and "spec_hash" in policy
    approve(c.store, "r", a.id, "operator", "run it again")
    run = b.resume("r")
    assert run.status == "COMPLETED" and len(calls) == 1
    steps = c.store.list_steps("r")
    assert [s.status for s in steps] == ["done", "done"]
    c.finish()
    assert isinstance(c.outcome.get("error"), LeaseLostError)
    assert types(c.store, "r") == [
        "run.created", "run.started", "step.started", "step.decided", "step.policy",
        "step.tool_started", "lease.taken_over", "step.interrupted", "step.policy",
        "approval.requested", "approval.decided", "run.resumed", "step.policy",
        "step.tool_started", "step.tool_finished", "step.started", "step.decided",
        "run.finished"]


def test_rejecting_an_interrupted_side_effect_cancels_the_run(crashed):
    c = crashed()
    calls: list = []
    b = c.resumer([None], calls=calls)
    b.resume("r")
    reject(c.store, "r", c.store.list_approvals("r")[0].id, "operator", "no")
    assert c.store.get_run("r").status == "CANCELLED" and calls == []


def test_an_interrupted_read_only_or_deciding_step_just_continues(crashed):
    c = crashed(tool="read", side_effect="read_only")
    b = c.resumer([None, Decision.complete()],
                  tools=[static_tool("read", input_schema=SCHEMA_N)])
    assert b.resume("r").status == "COMPLETED"
    seq = types(c.store, "r")
    assert seq[6:9] == ["lease.taken_over", "step.interrupted", "run.resumed"]
    assert c.store.list_steps("r")[0].status == "interrupted"

    d = crashed(deciding=True)
    b2 = d.resumer([None, Decision.complete()])
    assert b2.resume("r").status == "COMPLETED"
    step = d.store.list_steps("r")[0]
    assert step.status == "interrupted"
    assert json.loads(step.observation.content) == {"previous_status": "deciding"}
    assert step.observation.summary == "step interrupted while deciding"


def test_an_unregistered_interrupted_tool_cannot_wait_and_fails_the_run(crashed):
    c = crashed()
    b = c.resumer([None], tools=[])
    run = b.resume("r")
    assert (run.status, run.reason) == ("FAILED", "reconcile_conflict")
    assert run.reason_detail == (
        "step 0 was interrupted while executing a tool call whose outcome is unknown, and it "
        'cannot wait for an operator: tool "write" is not registered')


class _SpecFails:
    """The interrupted tool, registered again, whose ``spec()`` fails by the takeover."""

    def __init__(self) -> None:
        self.calls = 0

    def spec(self):
        self.calls += 1
        if self.calls > 2:  # registration reads it twice
            raise RuntimeError("spec source unavailable")
        return ToolSpec("write", "", SCHEMA_N, "read_only", timedelta(seconds=5))

    def call(self, c):
        return ToolResult(b"{}", "written")


def test_an_interrupted_tool_whose_spec_cannot_be_read_cannot_wait_and_fails_the_run(crashed):
    c = crashed()
    run = c.resumer([None], tools=[_SpecFails()]).resume("r")
    assert (run.status, run.reason) == ("FAILED", "reconcile_conflict")
    assert run.reason_detail == (
        "step 0 was interrupted while executing a tool call whose outcome is unknown, and it "
        'cannot wait for an operator: tool "write": spec() raised RuntimeError: '
        "spec source unavailable")
    assert c.store.verify_events().broken is None


def test_the_interrupted_side_effect_survives_a_crash_after_the_takeover(crashed):
    c = crashed()
    b = c.resumer([None, Decision.complete()])
    with c.store.tx() as tx:  # what a resumer that died right after its takeover left
        tx.execute("UPDATE steps SET status = 'interrupted', "
                   "observation_json = '{\"kind\":\"interrupted\",\"content\":"
                   "{\"previous_status\":\"executing\"},\"summary\":\"x\"}'")
        tx.execute("UPDATE runs SET lease_owner = 'dead/1', "
                   "lease_expires_at = '2020-01-01T00:00:00Z'")
    run = b.resume("r")
    assert run.status == "WAITING_FOR_APPROVAL"
    assert c.store.list_approvals("r")[0].kind == "interrupted_side_effect"


def test_an_interrupted_step_is_reconciled_and_continued(crashed):
    c = crashed()
    views: list = []

    def reconcile(view):
        views.append(view)
        return Reconciliation("continue")

    calls: list = []
    b = c.resumer([None, Decision.complete()], reconcile=reconcile, calls=calls)
    assert b.resume("r").status == "COMPLETED"
    assert calls == [] and len(views) == 1
    assert [s.status for s in views[0].steps] == ["interrupted"]


@pytest.mark.parametrize(("rec", "status", "reason", "detail"), [
    (Reconciliation("completed", "it went through", b'{"ok":1}'), "COMPLETED", "goal_completed",
     "completed by reconciliation: it went through"),
    (Reconciliation("completed", "x", b"{nope"), "FAILED", "internal_error",
     "reconcile: result is not usable JSON: not valid JSON"),
    (Reconciliation("conflict", "the bank disagrees"), "FAILED", "reconcile_conflict",
     "the bank disagrees"),
    (Reconciliation("shrug"), "FAILED", "internal_error", 'reconcile: unknown outcome "shrug"'),
    (Reconciliation("waiting", "ask"), "FAILED", "reconcile_conflict",
     "reconciliation asked to wait but gave no approval to wait for: ask"),
    (Reconciliation("waiting", pause=PolicyDecision.allow()), "FAILED", "internal_error",
     'reconcile: pause outcome "allow" is not require_approval'),
    (Reconciliation("waiting", pause=PolicyDecision("require_approval", "r", "k", b"{bad")),
     "FAILED", "internal_error", "reconcile: capability is not usable JSON: not valid JSON"),
])
def test_reconcile_outcomes(crashed, rec, status, reason, detail):
    c = crashed()
    b = c.resumer([None, Decision.complete()], reconcile=lambda view: rec)
    run = b.resume("r")
    assert (run.status, run.reason, run.reason_detail) == (status, reason, detail)
    if status == "COMPLETED":
        assert run.result == b'{"ok":1}'


def test_a_reconcile_error_fails_the_run(crashed):
    c = crashed()

    def broken(view):
        raise RuntimeError("ledger offline")

    run = c.resumer([None], reconcile=broken).resume("r")
    assert (run.reason, run.reason_detail) == ("internal_error", "reconcile: ledger offline")


def test_reconcile_waiting_pauses_the_interrupted_request(crashed):
    c = crashed()
    calls: list = []
    pause = PolicyDecision.need_approval("ledger_check", "check the ledger", {"ref": 7})
    b = c.resumer([None, Decision.complete()], calls=calls,
                  reconcile=lambda view: Reconciliation("waiting", pause=pause))
    assert b.resume("r").status == "WAITING_FOR_APPROVAL"
    (a,) = c.store.list_approvals("r")
    assert a.kind == "ledger_check" and a.request.args == b'{"n":1}'
    approve(c.store, "r", a.id, "operator", "")
    # The grant re-runs the call once; the policy (write is allowed) is asked again.
    assert b.resume("r").status == "COMPLETED" and len(calls) == 1


def test_reconcile_pauses_only_a_valid_executing_step(crashed):
    pause = PolicyDecision.need_approval("k", "r")
    c = crashed(deciding=True)
    run = c.resumer([None], reconcile=lambda v: Reconciliation("waiting", pause=pause)).resume("r")
    assert (run.reason, run.reason_detail) == (
        "reconcile_conflict",
        "reconciliation asked to wait but no interrupted tool call can be paused "
        "(no step was executing)")
    d = crashed()
    strict = FuncTool("write", lambda call_: None, side_effect="local_mutation",
                      input_schema=b'{"type":"object","required":["m"]}', timeout=5)
    run = d.resumer([None], tools=[strict],
                    reconcile=lambda v: Reconciliation("waiting", pause=pause)).resume("r")
    assert run.reason == "reconcile_conflict" and "arguments do not match schema" in (
        run.reason_detail)
    step = d.store.list_steps("r")[0]
    assert (step.status, step.observation.kind) == ("failed", "invalid_decision")


def test_a_reconciled_repause_leaves_no_old_grant_usable():
    store = open_store(":memory:")
    wall = FakeClock()
    release, entered = threading.Event(), threading.Event()
    attempts: list = []

    def publish(c):
        attempts.append(c)
        entered.set()
        release.wait(20)
        return ToolResult(b"{}", "published")

    tool = FuncTool("publish", publish, side_effect="remote_mutation", timeout=60)
    a = Driver(store, ScriptedAgent([call("publish")]), DefaultPolicy(), [tool], wall=wall,
               lease_ttl=60)
    a.start("g", limits(), run_id="r")
    approve(store, "r", store.list_approvals("r")[0].id, "operator", "")
    t = threading.Thread(target=lambda: pytest.raises(LeaseLostError, a.resume, "r"),
                         daemon=True)
    t.start()
    entered.wait(10)
    wall.advance(timedelta(seconds=61))
    pause = PolicyDecision.need_approval("ledger_check", "check")
    b = Driver(store, ScriptedAgent([]), DefaultPolicy(), [static_tool("publish",
               "remote_mutation")], wall=wall, lease_ttl=60,
               reconcile=lambda v: Reconciliation("waiting", pause=pause))
    assert b.resume("r").status == "WAITING_FOR_APPROVAL"
    statuses = [x.status for x in store.list_approvals("r")]
    assert statuses == ["approved", "pending"]
    with pytest.raises(RunStateError, match="is pending, not approved"):
        b.resume("r")
    release.set()
    t.join(10)
    assert len(attempts) == 1


def test_resume_of_a_finished_run_is_refused():
    store = open_store(":memory:")
    d = Driver(store, ScriptedAgent([Decision.complete()]), DefaultPolicy(), [])
    d.start("g", limits(), run_id="r")
    with pytest.raises(RunStateError, match="run r is COMPLETED"):
        d.resume("r")


def test_undecodable_rows_fail_the_run_as_internal_without_rewriting_them(crashed):
    c = crashed()
    with c.store.tx() as tx:
        tx.execute("UPDATE steps SET decision_json = '{broken'")
    run = c.resumer([None]).resume("r")
    assert (run.status, run.reason) == ("FAILED", "internal_error")
    assert run.reason_detail.startswith("internal: step ")
    raw = c.store.db().execute("SELECT decision_json, status FROM steps").fetchone()
    assert raw == ("{broken", "failed")


# -- real processes ----------------------------------------------------------------

CHILD_PRELUDE = f"""
import os, sys
from agentrt.driver import DefaultPolicy, Driver, FuncTool, ToolResult
from agentrt.records import Decision, default_limits
from agentrt.store import open_store
from agentrt.testing import ScriptedAgent
SCHEMA = {SCHEMA_N!r}
"""

CRASH_CHILD = CHILD_PRELUDE + """
db, run_id = sys.argv[1], sys.argv[2]
def write(call):
    os._exit(0)  # the process dies mid-tool: no outcome, no release
tool = FuncTool("write", write, side_effect="local_mutation", input_schema=SCHEMA, timeout=5)
d = Driver(open_store(db), ScriptedAgent([Decision.tool_call("write", '{"n":1}')]),
           DefaultPolicy(), [tool], lease_owner="crasher", lease_ttl=1)
d.start("survive a crash", default_limits(), run_id=run_id)
"""

RACE_CHILD = CHILD_PRELUDE + """
import time
from agentrt.errors import RunStateError
db, go, log = sys.argv[1], sys.argv[2], sys.argv[3]
def publish(call):
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(0.2)
    return ToolResult(b"{}", "published")
tool = FuncTool("publish", publish, side_effect="remote_mutation", timeout=5)
d = Driver(open_store(db), ScriptedAgent([None, Decision.complete()]), DefaultPolicy(), [tool])
open(f"{go}.ready.{os.getpid()}", "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
try:
    print(d.resume("r").status)
except RunStateError as exc:
    print(type(exc).__name__)
"""


def child(code: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_process_that_dies_mid_tool_is_taken_over_and_not_rerun_without_approval(tmp_path):
    db = str(tmp_path / "runs.db")
    open_store(db).close()
    proc = child(CRASH_CHILD, db, "interrupted-run")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    store = open_store(db)
    assert store.list_steps("interrupted-run")[0].status == "executing"
    calls: list = []
    tools = [static_tool("write", "local_mutation", input_schema=SCHEMA_N, calls=calls)]
    resumer = Driver(store, ScriptedAgent([None, Decision.complete(b'{"written":true}')]),
                     DefaultPolicy(), tools, lease_owner="resumer")
    deadline = time.monotonic() + 20
    while True:
        try:
            run = resumer.resume("interrupted-run")
            break
        except RunLeasedError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert run.status == "WAITING_FOR_APPROVAL" and calls == []
    taken = json.loads(next(e for e in store.list_events("interrupted-run")
                            if e.type == "lease.taken_over").payload)
    assert taken["previous_owner"].startswith("crasher/")
    assert taken["owner"] == resumer.owner and resumer.owner.startswith("resumer/")
    a = store.list_approvals("interrupted-run")[0]
    assert a.kind == "interrupted_side_effect"
    with pytest.raises(RunStateError):
        resumer.resume("interrupted-run")  # not without an approval
    assert calls == []
    approve(store, "interrupted-run", a.id, "operator", "run it again")
    assert resumer.resume("interrupted-run").status == "COMPLETED"
    assert len(calls) == 1
    assert types(store, "interrupted-run") == [
        "run.created", "run.started", "step.started", "step.decided", "step.policy",
        "step.tool_started", "lease.taken_over", "step.interrupted", "step.policy",
        "approval.requested", "approval.decided", "run.resumed", "step.policy",
        "step.tool_started", "step.tool_finished", "step.started", "step.decided",
        "run.finished"]
    assert store.verify_events().broken is None


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(rounds(1, 20)))
def test_two_processes_racing_to_resume_one_approved_run_execute_it_once(tmp_path, attempt):
    db = str(tmp_path / "runs.db")
    store = open_store(db)
    same_spec_as_the_children = FuncTool("publish", lambda c: None,
                                         side_effect="remote_mutation", timeout=5)
    d = Driver(store, ScriptedAgent([call("publish")]), DefaultPolicy(),
               [same_spec_as_the_children])
    d.start("g", limits(), run_id="r")
    approve(store, "r", store.list_approvals("r")[0].id, "operator", "")
    go, log = tmp_path / "go", tmp_path / "executions"
    procs = [child(RACE_CHILD, db, str(go), str(log)) for _ in range(2)]
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("go.ready.*"))) < 2:  # both built and polling
        assert time.monotonic() < deadline
        time.sleep(0.01)
    go.touch()
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    outcomes = sorted(out.strip() for out, _ in results)
    assert log.exists(), results
    assert len(log.read_text().splitlines()) == 1
    assert outcomes[0] == "COMPLETED" and outcomes[1] in ("RunLeasedError", "RunStateError")
    assert store.get_run("r").status == "COMPLETED"


def test_the_reconcilers_view_is_not_rewritten_by_the_pause(crashed):
    c = crashed()
    kept: list = []
    pause = PolicyDecision.need_approval("ledger_check", "check")

    def reconcile(view):
        kept.append(view)
        return Reconciliation("waiting", pause=pause)

    c.resumer([None], reconcile=reconcile).resume("r")
    assert c.store.list_steps("r")[0].status == "awaiting_approval"
    assert kept[0].steps[0].status == "interrupted"


def test_a_resume_refused_at_its_takeover_releases_nothing(monkeypatch):
    """Another resumer took the run over between this one's lease read and its
    takeover transaction: refused, this one took no lease, so it releases none
    (a write that would wait out the busy timeout behind any other writer)."""
    from datetime import UTC, datetime

    from agentrt.driver import DefaultPolicy
    from agentrt.driver import lease as lease_module

    c = Crashed()
    other = c.resumer([None])
    raced: list = []

    def now():
        if not raced:  # this resumer has read the expired lease; the other goes first
            raced.append(other.resume("r").status)
        return datetime.now(UTC)

    released: list = []
    real = lease_module.release_lease

    def release(conn, run_id, owner):
        released.append(owner)
        return real(conn, run_id, owner)

    monkeypatch.setattr(lease_module, "release_lease", release)
    slow = Driver(c.store, ScriptedAgent([None]), DefaultPolicy(), [], wall=c.wall,
                  lease_owner="slow", lease_ttl=60, now=now)
    with pytest.raises(RunStateError):
        slow.resume("r")
    c.finish()
    assert raced and "slow" not in [owner.split("/")[0] for owner in released]


_MODEL_CALL_IN_FLIGHT = r"""
import sys, time
from agentrt import Limits, Usage, open_store
from agentrt.driver import DefaultPolicy, Driver, ModelConfig, ModelResponse
from agentrt.testing import ModelToolAgent

class Hanging:
    def name(self):
        return "m"
    def generate(self, request, cancel):
        open(sys.argv[2], "w").close()
        time.sleep(60)

Driver(open_store(sys.argv[1]), ModelToolAgent(), DefaultPolicy(), model=ModelConfig(Hanging()),
       lease_ttl=0.5).start("g", Limits(10, 3, 3, max_model_calls=1), run_id="m1")
"""


def test_a_model_call_in_flight_at_a_crash_stays_dispatched_and_uncounted_as_in_the_reference(
        tmp_path):
    """Spec 8's takeover touches steps, not model calls: the attempt the dead
    process sent stays ``dispatched``, is not added to the run's totals, and
    so does not count against ``max_model_calls`` (docs/compatibility.md)."""
    import signal

    from eventdb import child_env

    from agentrt.driver import ModelConfig, ModelResponse
    from agentrt.records import Usage
    from agentrt.testing import ModelToolAgent

    db, marker = str(tmp_path / "m.db"), str(tmp_path / "sent")
    child = subprocess.Popen([sys.executable, "-c", _MODEL_CALL_IN_FLIGHT, db, marker],
                             env=child_env())
    deadline = time.monotonic() + 30
    while not os.path.exists(marker):
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    time.sleep(0.7)  # the dead driver's 0.5 s lease expires

    class Replies:
        def name(self) -> str:
            return "m"

        def generate(self, request, cancel):
            return ModelResponse(text="hi", usage=Usage(1, 1))

    store = open_store(db)
    run = Driver(store, ModelToolAgent(), DefaultPolicy(), model=ModelConfig(Replies())).resume(
        "m1")
    calls = store.list_model_calls("m1")
    assert [c.status for c in calls] == ["dispatched", "ok"]
    assert run.model_calls == 1  # the second attempt only
