"""Approvals: the pause, the hash, deciding, expiry, and resuming on a grant."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from _driver_kit import call, fixture_tools, ids, limits, make, types

from agentrt.driver import (
    DefaultPolicy,
    Driver,
    Operator,
    PolicyFunc,
    approve,
    approve_shown,
    cancel,
    reject,
    reject_shown,
)
from agentrt.errors import (
    ApprovalChangedError,
    ApprovalExpiredError,
    ApprovalHashError,
    NotFoundError,
    NotPendingError,
    RunStateError,
)
from agentrt.records import (
    Approval,
    Decision,
    PolicyDecision,
    ToolSpec,
    approval_hash,
)
from agentrt.store import open_store
from agentrt.testing import FakeClock, ScriptedAgent, static_tool


def paused(script=None, **kw):
    """A run paused on `publish {"to":"world"}` as its step 1 (after a read)."""
    script = script or [call("read", b'{"n":1}'), call("publish", b'{"to": "world"}'),
                        Decision.complete(b'{"shipped":true}')]
    lim = kw.pop("lim", limits())
    d, store, agent, obs = make(script=script, **kw)
    run = d.start("publish with approval", lim, run_id="r")
    assert run.status == "WAITING_FOR_APPROVAL"
    return d, store, agent, store.list_approvals("r")[-1]


def test_the_approval_is_recorded_with_the_hash_of_the_exact_request():
    _, store, _, a = paused()
    step = store.list_steps("r")[1]
    assert (a.run_id, a.step_id, a.kind, a.status) == ("r", step.id, "remote_mutation", "pending")
    assert a.request.args == b'{"to":"world"}' and a.request.spec.name == "publish"
    assert json.loads(a.capability) == {"args": {"to": "world"}, "tool": "publish"}
    assert a.hash == approval_hash(a.kind, a.capability, a.presentation, a.request)
    assert a.expires_at is None and a.decided_at is None
    requested = json.loads(store.list_events("r")[-1].payload)
    assert list(requested) == ["approval_id", "capability", "hash", "kind", "presentation",
                               "reason"]
    assert requested["hash"] == a.hash
    assert store.approval_reason("r", a.id) == (
        "side effect remote_mutation is require_approval by policy")


def test_approve_then_resume_executes_the_recorded_request():
    calls: list = []
    d, store, _, a = paused(tools=fixture_tools(calls))
    decided = approve(store, "r", a.id, "operator", "looks right")
    assert (decided.status, decided.decided_by, decided.note) == ("approved", "operator",
                                                                  "looks right")
    assert store.get_run("r").status == "WAITING_FOR_APPROVAL"
    run = d.resume("r")
    assert run.status == "COMPLETED" and run.result == b'{"shipped":true}'
    assert [c.args for c in calls] == [b'{"n":1}', b'{"to":"world"}']
    assert types(store, "r")[-8:] == ["approval.decided", "run.resumed", "step.policy",
                                      "step.tool_started", "step.tool_finished",
                                      "step.started", "step.decided", "run.finished"]
    events = store.list_events("r")
    started = json.loads(events[-5].payload)
    assert started == {"approval_id": a.id, "args": {"to": "world"}, "tool": "publish"}
    assert json.loads(events[-7].payload) == {"approval_id": a.id}
    assert events[-7].step_id == a.step_id
    assert json.loads(events[-8].payload) == {"approval_id": a.id, "by": "operator",
                                              "note": "looks right", "status": "approved"}


def test_reject_cancels_the_run():
    calls: list = []
    _, store, _, a = paused(tools=fixture_tools(calls))
    reject(store, "r", a.id, "operator", "not now")
    run = store.get_run("r")
    assert (run.status, run.reason, run.reason_detail) == ("CANCELLED", "approval_rejected",
                                                           "not now")
    step = store.list_steps("r")[1]
    assert step.status == "failed" and step.observation.kind == "policy_denied"
    assert json.loads(step.observation.content) == {"approval_id": a.id, "note": "not now"}
    assert step.observation.summary == "approval rejected: not now"
    assert step.policy.outcome == "require_approval"
    assert types(store, "r")[-2:] == ["approval.decided", "run.finished"]
    assert len(calls) == 1


def test_a_tampered_approval_is_refused():
    d, store, _, a = paused()
    with store.tx() as tx:
        tx.execute("UPDATE approvals SET request_json = replace(request_json, 'world', 'moon')")
    with pytest.raises(ApprovalHashError):
        approve(store, "r", a.id, "operator", "")
    with store.tx() as tx:
        tx.execute("UPDATE approvals SET request_json = replace(request_json, 'moon', 'world'), "
                   "status = 'approved'")
    assert d.resume("r").status == "COMPLETED"


def test_a_tampered_grant_is_refused_on_resume():
    d, store, _, a = paused()
    approve(store, "r", a.id, "operator", "")
    with store.tx() as tx:
        tx.execute("UPDATE approvals SET capability_json = '{\"args\":{}}'")
    with pytest.raises(ApprovalHashError):
        d.resume("r")
    assert store.get_run("r").status == "WAITING_FOR_APPROVAL"


def test_a_hash_that_cannot_be_computed_is_refused():
    _, store, _, a = paused()
    with store.tx() as tx:
        tx.execute("UPDATE approvals SET capability_json = '{nope'")
    with pytest.raises(ApprovalHashError):
        approve(store, "r", a.id, "operator", "")
    with pytest.raises(ValueError):
        approval_hash("k", b"{nope", None, a.request)


def test_resume_repauses_when_the_policy_wants_a_different_approval():
    asked = iter(["first", "second", "second"])

    def rule(req, view):
        return PolicyDecision.need_approval("manual", "ask", {"round": next(asked)})

    d, store, _, a = paused(script=[call("read", b'{"n":1}'), Decision.complete()],
                            policy=PolicyFunc(rule))
    approve(store, "r", a.id, "operator", "")
    run = d.resume("r")
    assert run.status == "WAITING_FOR_APPROVAL"
    approvals = store.list_approvals("r")
    assert [x.status for x in approvals] == ["approved", "pending"]
    assert approvals[1].step_id == approvals[0].step_id
    approve(store, "r", approvals[1].id, "operator", "")
    assert d.resume("r").status == "COMPLETED"
    assert len(store.list_approvals("r")) == 2


def test_only_the_latest_approval_of_a_step_grants():
    asked = iter(["first", "second"])

    def rule(req, view):
        return PolicyDecision.need_approval("manual", "ask", {"round": next(asked)})

    d, store, _, a = paused(script=[call("read", b'{"n":1}'), Decision.complete()],
                            policy=PolicyFunc(rule))
    approve(store, "r", a.id, "operator", "")
    d.resume("r")
    before = store.list_events("r")
    for _ in range(3):
        with pytest.raises(RunStateError, match="is pending, not approved"):
            d.resume("r")
    assert store.list_events("r") == before


def test_a_repaused_step_does_not_pile_up_approvals():
    counter = iter(range(100))

    def rule(req, view):
        return PolicyDecision.need_approval("manual", "ask", {"round": next(counter)})

    d, store, _, a = paused(script=[call("read", b'{"n":1}')], policy=PolicyFunc(rule))
    for _ in range(3):
        approve(store, "r", store.list_approvals("r")[-1].id, "operator", "")
        d.resume("r")
    statuses = [x.status for x in store.list_approvals("r")]
    assert statuses == ["approved"] * 3 + ["pending"]


def test_the_granted_approval_is_the_latest_inserted_whatever_its_time():
    c = FakeClock()
    asked = iter(["first", "second", "second"])

    def rule(req, view):
        c.advance(timedelta(hours=-5))  # the second approval is created "earlier"
        return PolicyDecision.need_approval("manual", "ask", {"round": next(asked)})

    d, store, _, a = paused(script=[call("read", b'{"n":1}'), Decision.complete()],
                            policy=PolicyFunc(rule), now=c)
    approve(store, "r", a.id, "operator", "")
    d.resume("r")
    first, second = store.list_approvals("r")
    assert second.created_at < first.created_at
    approve(store, "r", second.id, "operator", "")
    assert d.resume("r").status == "COMPLETED"


class SwitchableTool:
    """A tool whose spec can change between pause and resume."""

    def __init__(self, name: str, schema: bytes, side_effect: str = "remote_mutation") -> None:
        self.current = ToolSpec(name, "", schema, side_effect, timedelta(seconds=5))
        self.calls: list = []

    def spec(self) -> ToolSpec:
        s = self.current
        return ToolSpec(s.name, s.description, s.input_schema, s.side_effect, s.timeout)

    def call(self, c):
        self.calls.append(c)
        return b"{}"


def test_approved_arguments_must_meet_the_current_schema():
    tool = SwitchableTool("publish", b'{"type":"object"}')
    evaluations: list = []

    def rule(req, view):
        evaluations.append(req)
        return DefaultPolicy().evaluate(req, view)

    d, store, _, a = paused(script=[call("publish", b'{"to":"world"}'), Decision.complete()],
                            tools=[tool], policy=PolicyFunc(rule))
    approve(store, "r", a.id, "operator", "")
    tool.current.input_schema = b'{"type":"object","required":["subject"]}'
    evaluations.clear()
    run = d.resume("r")
    assert run.status == "COMPLETED" and evaluations == [] and tool.calls == []
    step = store.list_steps("r")[0]
    assert step.status == "failed" and step.observation.kind == "invalid_decision"
    assert step.observation.summary.startswith("invalid decision on resume: arguments do not "
                                               "match schema")
    assert types(store, "r")[-6:-3] == ["approval.decided", "run.resumed", "step.failed"]


def test_a_changed_spec_records_the_new_spec_and_repauses():
    tool = SwitchableTool("publish", b'{"type":"object"}')
    d, store, _, a = paused(script=[call("publish", b"{}"), Decision.complete()], tools=[tool])
    approve(store, "r", a.id, "operator", "")
    tool.current.description = "now sends to everyone"
    assert d.resume("r").status == "WAITING_FOR_APPROVAL"
    policy = json.loads([e for e in store.list_events("r") if e.type == "step.policy"][-1]
                        .payload)
    new_hash = tool.spec().spec_hash()[0]
    assert policy["spec_hash"] == new_hash
    assert store.tool_spec(new_hash).description == "now sends to everyone"
    assert store.list_steps("r")[0].spec_hash != new_hash


def test_an_unregistered_approved_tool_is_refused():
    d, store, _, a = paused()
    approve(store, "r", a.id, "operator", "")
    d2 = Driver(store, ScriptedAgent([]), DefaultPolicy(), [])
    with pytest.raises(Exception, match='approved tool "publish" is not registered'):
        d2.resume("r")
    assert store.get_run("r").status == "WAITING_FOR_APPROVAL"


def test_approval_ttl_expiry_cancels_the_run_via_approve_and_via_resume():
    c = FakeClock()
    d, store, _, a = paused(now=c, lim=limits(approval_ttl=timedelta(hours=1)))
    assert a.expires_at == a.created_at + timedelta(hours=1)
    c.advance(timedelta(hours=2))
    with pytest.raises(ApprovalExpiredError) as info:
        d.approve("r", a.id, "operator", "too late")
    assert isinstance(info.value, NotPendingError)
    assert str(info.value) == (f"agentrt: approval is not pending: approval {a.id} expired at "
                               f"{a.expires_at.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    run = store.get_run("r")
    assert (run.status, run.reason, run.reason_detail) == ("CANCELLED", "approval_expired",
                                                           f"approval {a.id} expired")
    expired = store.get_approval("r", a.id)
    assert (expired.status, expired.note) == ("expired", "expired")
    assert types(store, "r")[-2:] == ["approval.decided", "run.finished"]
    assert json.loads(store.list_events("r")[-2].payload) == {"approval_id": a.id,
                                                              "status": "expired"}
    # Mirrored reference quirk: expiry cancels the run but leaves the step of the
    # expired approval awaiting approval (a rejection fails it instead).
    steps = {st.id: st for st in store.list_steps("r")}
    assert steps[a.step_id].status == "awaiting_approval"
    assert steps[a.step_id].finished_at is None

    c2 = FakeClock()
    d2, store2, _, a2 = paused(now=c2, lim=limits(approval_ttl=timedelta(hours=1)))
    c2.advance(timedelta(hours=2))
    run2 = d2.resume("r")
    assert (run2.status, run2.reason) == ("CANCELLED", "approval_expired")
    assert store2.get_run("r").status == "CANCELLED"
    assert store2.get_approval("r", a2.id).status == "expired"
    steps2 = {st.id: st for st in store2.list_steps("r")}
    assert steps2[a2.step_id].status == "awaiting_approval"
    assert steps2[a2.step_id].finished_at is None


def test_the_driver_clock_decides_expiry():
    c = FakeClock()
    d, store, _, a = paused(now=c, lim=limits(approval_ttl=timedelta(hours=1)))
    # The wall clock is months past the driver's clock: only the driver's counts.
    d.approve("r", a.id, "operator", "")
    assert store.get_approval("r", a.id).status == "approved"
    assert d.resume("r").status == "COMPLETED"


def test_the_operator_clock_decides_expiry():
    c = FakeClock()
    _, store, _, a = paused(now=c, lim=limits(approval_ttl=timedelta(hours=1)))
    with pytest.raises(ApprovalExpiredError):
        Operator(store, now=FakeClock(start=c.peek() + timedelta(hours=3))).approve(
            "r", a.id, "operator", "")
    c2 = FakeClock()
    _, store2, _, a2 = paused(now=c2, lim=limits(approval_ttl=timedelta(hours=1)))
    assert Operator(store2, now=FakeClock(start=c2.peek())).approve(
        "r", a2.id, "operator", "").status == "approved"


def test_the_package_functions_use_the_wall_clock():
    c = FakeClock()  # 2026: already in the past or the future of the wall clock
    _, store, _, a = paused(now=c, lim=limits(approval_ttl=timedelta(hours=1)))
    from datetime import UTC, datetime

    if datetime.now(UTC) > a.expires_at:
        with pytest.raises(ApprovalExpiredError):
            approve(store, "r", a.id, "operator")
    else:
        assert approve(store, "r", a.id, "operator").status == "approved"


def test_a_shown_decision_is_bound_to_the_hash_shown():
    _, store, _, a = paused()
    with pytest.raises(ApprovalChangedError, match="no hash was shown"):
        approve_shown(store, "r", a.id, "", "operator")
    with pytest.raises(ApprovalChangedError):
        approve_shown(store, "r", a.id, "0" * 64, "operator")
    with pytest.raises(ApprovalChangedError):
        reject_shown(store, "r", a.id, "0" * 64, "operator")
    assert store.get_approval("r", a.id).status == "pending"
    assert approve_shown(store, "r", a.id, a.hash, "operator").status == "approved"


def test_operator_paths_raise_typed_errors():
    d, store, _, a = paused()
    with pytest.raises(NotFoundError):
        approve(store, "r", "nope", "operator")
    with pytest.raises(NotFoundError):
        approve(store, "nope", a.id, "operator")
    approve(store, "r", a.id, "operator")
    with pytest.raises(NotPendingError, match=f"approval {a.id} is already approved"):
        approve(store, "r", a.id, "operator")
    d.resume("r")
    with pytest.raises(RunStateError, match="is COMPLETED, not waiting for approval"):
        reject(store, "r", a.id, "operator")
    with pytest.raises(RunStateError, match="run r is already COMPLETED"):
        cancel(store, "r", "operator")


def test_grant_not_resumed_within_its_ttl_expires():
    c = FakeClock()
    calls: list = []
    d, store, _, a = paused(now=c, tools=fixture_tools(calls),
                            lim=limits(grant_ttl=timedelta(minutes=10)))
    d.approve("r", a.id, "alice", "go")
    c.advance(timedelta(minutes=11))
    run = d.resume("r")
    assert (run.status, run.reason) == ("CANCELLED", "approval_expired")
    grant = store.get_approval("r", a.id)
    assert (grant.status, grant.decided_by, grant.note) == ("expired", "alice", "go")
    assert len(calls) == 1


def test_approval_ttl_alone_never_expires_a_grant():
    c = FakeClock()
    d, store, _, a = paused(now=c, lim=limits(approval_ttl=timedelta(minutes=10)))
    d.approve("r", a.id, "alice", "")
    c.advance(timedelta(days=3))
    assert d.resume("r").status == "COMPLETED"


def test_concurrent_resumes_execute_the_tool_once(tmp_path):
    calls: list = []
    gate = threading.Barrier(2)
    store = open_store(str(tmp_path / "runs.db"))
    script = [call("publish", b"{}"), Decision.complete()]
    d, _, _, _ = make(store=store, script=script, tools=fixture_tools(calls))
    d.start("g", limits(), run_id="r")
    approve(store, "r", store.list_approvals("r")[0].id, "operator", "")
    results: list = []

    def racer():
        other = open_store(str(tmp_path / "runs.db"))
        drv, _, _, _ = make(store=other, script=script, tools=fixture_tools(calls))
        gate.wait()
        try:
            results.append(drv.resume("r").status)
        except RunStateError as exc:
            results.append(type(exc).__name__)

    threads = [threading.Thread(target=racer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert sorted(results) in (["COMPLETED", "RunStateError"], ["COMPLETED", "RunLeasedError"])


def test_a_crash_after_resume_keeps_the_approved_request_atomically():
    d, store, _, a = paused()
    approve(store, "r", a.id, "operator", "")
    d.resume("r")
    seq = types(store, "r")
    i = seq.index("run.resumed")
    assert seq[i:i + 3] == ["run.resumed", "step.policy", "step.tool_started"]
    resumed, policy, started = store.list_events("r")[i:i + 3]
    assert policy.seq == resumed.seq + 1 and started.seq == resumed.seq + 2
    # One transaction: when its step write fails, the run's move to RUNNING is undone too.
    holder: dict = {}

    def meddling(req, view):
        if view.run.status == "WAITING_FOR_APPROVAL":
            with holder["store"].tx() as tx:
                tx.execute("UPDATE steps SET status = 'done' WHERE status = 'awaiting_approval'")
        return DefaultPolicy().evaluate(req, view)

    d2, store2, _, a2 = paused(script=[call("publish", b"{}")], policy=PolicyFunc(meddling))
    holder["store"] = store2
    approve(store2, "r", a2.id, "operator", "")
    with pytest.raises(RunStateError, match="is done, not awaiting_approval"):
        d2.resume("r")
    assert "run.resumed" not in types(store2, "r")
    assert store2.get_run("r").status == "WAITING_FOR_APPROVAL"


def test_unknown_policy_outcome_fails_on_resume_too():
    answers = iter([PolicyDecision.need_approval("manual", "ask"), PolicyDecision("perhaps")])
    d, store, _, a = paused(script=[call("read", b'{"n":1}')],
                            policy=PolicyFunc(lambda r, v: next(answers)))
    approve(store, "r", a.id, "operator", "")
    run = d.resume("r")
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "internal_error", 'unknown policy outcome "perhaps"')


def test_deny_on_resume_is_an_observation_and_excludes_the_wait():
    c = FakeClock()
    answers = iter([PolicyDecision.need_approval("manual", "ask"),
                    PolicyDecision.deny("changed my mind")])
    d, store, _, a = paused(script=[call("read", b'{"n":1}'), Decision.complete()],
                            policy=PolicyFunc(lambda r, v: next(answers)), now=c)
    approve(store, "r", a.id, "operator", "")
    c.advance(timedelta(hours=3))
    run = d.resume("r")
    assert run.status == "COMPLETED"
    step = store.list_steps("r")[0]
    assert step.observation.summary == "denied on resume: changed my mind"
    assert run.active_ms < 1000
    assert types(store, "r")[-6:-3] == ["run.resumed", "step.policy", "step.failed"]


def test_the_policy_is_handed_the_same_bytes_in_the_loop_and_on_resume():
    seen: list = []

    def rule(req, view):
        seen.append((req.args, req.spec.input_schema, view.run.status, len(view.steps)))
        return PolicyDecision.need_approval("manual", "ask", {"a": 1})

    schema = b'{ "type" : "object", "properties": {"b": {}, "a": {"type": "integer"}} }'
    tool = static_tool("go", "remote_mutation", input_schema=schema)
    d, store, _, a = paused(script=[call("go", b'{ "b": [1.50, "<&>"], "a": 2 }'),
                                    Decision.complete()], tools=[tool], policy=PolicyFunc(rule))
    approve(store, "r", a.id, "operator", "")
    d.resume("r")
    assert seen[0][:2] == seen[1][:2]
    assert seen[0][0] == b'{"a":2,"b":[1.50,"<&>"]}'
    assert seen[0][1] == b'{"properties":{"a":{"type":"integer"},"b":{}},"type":"object"}'
    assert [s[2:] for s in seen] == [("RUNNING", 0), ("WAITING_FOR_APPROVAL", 0)]


def test_the_approval_hash_is_unchanged_by_spelling_of_the_arguments():
    hashes = []
    for args in (b'{"b":1,"a":[1.0]}', b'{ "a" : [1.0] , "b" : 1 }'):
        _, store, _, a = paused(script=[call("publish", args)], new_id=ids())
        hashes.append(a.hash)
    assert hashes[0] == hashes[1]


def test_approval_json_omits_zero_times():
    _, store, _, a = paused()
    out = a.to_json()
    assert "expires_at" not in out and "decided_at" not in out
    assert isinstance(a, Approval)


def test_the_policy_view_on_resume_is_what_the_policy_saw():
    d, store, _, a = paused()
    approve(store, "r", a.id, "operator", "")
    d.resume("r")
    policies = [json.loads(e.payload) for e in store.list_events("r") if e.type == "step.policy"]
    loop_view, pause_view, resume_view = (p["view"] for p in policies)
    assert (pause_view["status"], pause_view["step_count"], pause_view["steps"]) == (
        "RUNNING", 2, 1)
    assert (resume_view["status"], resume_view["step_count"], resume_view["steps"],
            resume_view["approvals"]) == ("WAITING_FOR_APPROVAL", 2, 1, 1)
    assert loop_view["steps"] == 0
