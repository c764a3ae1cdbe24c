"""What an agent, a tool, a policy, a model or an operator hands the driver that
SQLite cannot hold (past its length limit, lowered here to 100 kB): each run ends
recorded and explained, its chain verifies and its lease is free; an operator's
or a starter's value is refused in one sentence before anything is written."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import apsw
import pytest
from _driver_kit import call, limits, make
from test_recovery import Crashed

from agentrt.driver import (
    AbortRun,
    AgentFunc,
    ConfigError,
    DefaultPolicy,
    Driver,
    FuncTool,
    ModelConfig,
    PolicyFunc,
    Reconciliation,
    ToolResult,
    cancel,
)
from agentrt.driver.model import Message, ModelRequest
from agentrt.records import Decision, PolicyDecision, ToolSpec
from agentrt.store import Store, open_store
from agentrt.testing import ScriptedModel

LIMIT = 100_000
HUGE = "a" * 200_000
HUGE_JSON = b'{"x":"' + HUGE.encode() + b'"}'


def small_store(tmp_path) -> Store:
    """A store whose SQLite holds no string or blob over 100 kB (the real limit is 1 GB)."""
    store = open_store(str(tmp_path / "small.db"))
    store.db().limit(apsw.SQLITE_LIMIT_LENGTH, LIMIT)
    return store


def assert_settled(store: Store, run_id: str = "r") -> None:
    """Nothing left half-way: the chain verifies and no lease is held."""
    assert store.verify_events(0, 0).broken is None
    assert store.lease(run_id) == ("", None)


@pytest.mark.parametrize("decision, kept", [
    (call("read", HUGE_JSON), ("tool_call", "read")),
    (Decision.complete(HUGE_JSON), ("complete", "")),
    (Decision.fail(HUGE), ("fail", "")),
    (call("read", b"{}", reason=HUGE), ("tool_call", "read")),
    (Decision.tool_call(HUGE, b"{}"), ("", "")),
])
def test_a_decision_too_large_to_store_is_an_invalid_decision_and_the_run_goes_on(
        tmp_path, decision, kept):
    """It raised apsw.TooBigError out of start, the step left deciding. Now the step
    keeps the decision's kind, tool and origin (none of them, when even those are
    too large), fails as an invalid decision saying why, and the agent decides again."""
    d, store, agent, _ = make(small_store(tmp_path), script=[decision, Decision.complete()])
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    first = store.list_steps("r")[0]
    assert first.status == "failed" and first.observation is not None
    assert first.observation.kind == "invalid_decision"
    assert "too large to store" in first.observation.summary
    assert first.decision is not None
    assert (first.decision.kind, first.decision.tool) == kept
    assert first.decision.args is None and first.decision.result is None
    events = [e.type for e in store.list_events("r")]
    assert events[2:6] == ["step.started", "step.decided", "step.failed", "step.started"]
    assert_settled(store)


def test_an_agent_error_too_large_to_store_fails_the_run_with_its_start(tmp_path):
    """The run ends agent_error with the error's first 1000 characters and its
    length; apsw.TooBigError escaped start with the step left deciding."""
    def decide(step):
        raise RuntimeError(HUGE)

    d, store, _, _ = make(small_store(tmp_path), script=[decide])
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "agent_error")
    assert run.reason_detail.startswith("aaa")
    assert run.reason_detail.endswith("characters in all: too large to store)")
    assert len(run.reason_detail) < 2_000
    assert store.list_steps("r")[0].status == "failed"
    assert_settled(store)


@pytest.mark.parametrize("ruling", [
    PolicyDecision.allow(HUGE),
    PolicyDecision.deny(HUGE),
    PolicyDecision.abort(HUGE),
    PolicyDecision.need_approval("k", "look", capability={"big": HUGE}),
])
def test_a_policy_ruling_too_large_to_store_is_a_policy_error_and_no_tool_runs(
        tmp_path, ruling):
    """Treated as a policy that raised (no ``step.policy``, run internal_error): the
    ruling could not be recorded, so nothing may act on it. Each raised
    apsw.TooBigError out of start."""
    ran: list[str] = []
    tool = FuncTool("work", lambda c: ran.append("x") or ToolResult(b"{}", "ok"),
                    side_effect="read_only", timeout=5)
    d, store, _, _ = make(small_store(tmp_path), script=[call("work")], tools=[tool],
                          policy=PolicyFunc(lambda view, request: ruling))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "internal_error")
    assert run.reason_detail.startswith("policy: the ruling (")
    assert "too large to store" in run.reason_detail
    assert ran == []
    step = store.list_steps("r")[0]
    assert step.status == "failed" and step.policy is None
    assert "step.policy" not in [e.type for e in store.list_events("r")]
    assert store.list_approvals("r") == []
    assert_settled(store)


def test_a_policy_error_too_large_to_store_is_recorded_clipped(tmp_path):
    """A policy's exception text is clipped like an agent's."""
    def rule(view, request):
        raise ValueError(HUGE)

    d, store, _, _ = make(small_store(tmp_path), script=[call("read", b'{"n":1}')],
                          policy=PolicyFunc(rule))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "internal_error")
    assert run.reason_detail.startswith("policy: ") and "characters in all" in run.reason_detail
    assert_settled(store)


def test_a_tool_aborting_with_a_detail_too_large_to_store_still_aborts_the_run(tmp_path):
    """The abort became a plain tool error (the abort dropped) and the run went on."""
    def stop(c):
        raise AbortRun(HUGE)

    tool = FuncTool("stop", stop, side_effect="read_only", timeout=5)
    d, store, _, _ = make(small_store(tmp_path),
                          script=[call("stop"), Decision.complete()], tools=[tool])
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "tool_abort")
    assert run.reason_detail.startswith("aaa") and run.reason_detail.endswith("too large to store)")
    step = store.list_steps("r")[0]
    assert step.observation is not None and "too large to store" in step.observation.summary
    assert_settled(store)


def test_a_late_tool_outcome_too_large_to_store_is_appended_as_a_tool_error(tmp_path):
    """An operator cancelled the run while its tool ran, and the tool's outcome was
    too large: apsw.TooBigError escaped start instead of the cancelled run."""
    store = small_store(tmp_path)

    def transfer(c):
        cancel(store, "r", "operator", "halt")
        return ToolResult(HUGE_JSON, "moved")

    tool = FuncTool("transfer", transfer, side_effect="local_mutation", timeout=5)
    d, _, _, _ = make(store, script=[call("transfer"), Decision.complete()], tools=[tool])
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("CANCELLED", "operator_cancelled")
    events = store.list_events("r")
    assert [e.type for e in events[-2:]] == ["run.finished", "step.tool_finished"]
    late = json.loads(events[-1].payload)
    assert late["late"] is True and late["observation"]["kind"] == "tool_error"
    assert "too large to store" in late["observation"]["content"]["error"]
    assert_settled(store)


def _asking(step):
    step.model.generate(ModelRequest(messages=[Message("user", "hi")], max_output_tokens=5))
    return Decision.complete()


def test_a_model_error_too_large_to_store_is_a_recorded_failed_call(tmp_path):
    """The attempt's row stayed ``dispatched`` and its outcome unrecorded."""
    model = ScriptedModel([RuntimeError(HUGE)])
    d, store, _, _ = make(small_store(tmp_path), script=[_asking],
                          model=ModelConfig(model))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    assert "characters in all" in run.reason_detail
    (status, error) = store.read_row("SELECT status, error FROM model_calls", ())
    assert status == "error" and "characters in all" in error
    assert_settled(store)


def test_an_id_too_large_to_store_fails_the_run_as_internal_and_says_so(tmp_path):
    """Whatever else is too large ends the run as internal_error, not a raw exception."""
    store = small_store(tmp_path)
    d = Driver(store, AgentFunc(lambda step: Decision.complete()), DefaultPolicy(),
               new_id=lambda: HUGE)
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "internal_error")
    assert "too large to store" in run.reason_detail
    assert_settled(store)


@pytest.mark.parametrize("goal, run_id, says", [
    (HUGE, "r", "the goal (200000 bytes) is too large to store"),
    ("g", HUGE, "the run id (200000 bytes) is too large to store"),
])
def test_a_start_with_a_value_too_large_to_store_is_refused_and_writes_nothing(
        tmp_path, goal, run_id, says):
    """One sentence naming the value and its size, and no run row or event."""
    d, store, _, _ = make(small_store(tmp_path), script=[Decision.complete()])
    said = f"start run: {says} (string or blob too big); nothing was written"
    with pytest.raises(ConfigError, match=re.escape(said)):
        d.start(goal, limits(), run_id=run_id)
    assert store.read_row("SELECT count(*) FROM runs", ()) == (0,)
    assert store.read_row("SELECT count(*) FROM events", ()) == (0,)


def test_an_operator_note_too_large_to_store_is_refused_and_changes_nothing(tmp_path):
    """Cancel and approve raised apsw.TooBigError; the run stays waiting for a
    decision with a note that fits."""
    rule = PolicyFunc(lambda view, request: PolicyDecision.need_approval("k", "look"))
    d, store, _, _ = make(small_store(tmp_path), script=[call("publish"), Decision.complete()],
                          policy=rule)
    run = d.start("g", limits(), run_id="r")
    assert run.status == "WAITING_FOR_APPROVAL"
    (approval,) = store.list_approvals("r")
    before = len(store.list_events("r"))
    with pytest.raises(ConfigError, match="cancel run r: note is 200000 characters, too large"):
        d.cancel("r", "ops", HUGE)
    with pytest.raises(ConfigError, match="approve approval .*: note is 200000 characters"):
        d.approve("r", approval.id, "ops", HUGE)
    assert store.get_run("r").status == "WAITING_FOR_APPROVAL"
    assert store.list_approvals("r")[0].status == "pending"
    assert len(store.list_events("r")) == before
    d.approve("r", approval.id, "ops", "fine")
    assert d.resume("r").status == "COMPLETED"
    assert_settled(store)


@pytest.mark.parametrize("rec, ended, says", [
    (Reconciliation("completed", HUGE, b"{}"), ("COMPLETED", "goal_completed"),
     "completed by reconciliation: aaa"),
    (Reconciliation("conflict", HUGE), ("FAILED", "reconcile_conflict"), "aaa"),
    (None, ("FAILED", "internal_error"), "reconcile: aaa"),
    (Reconciliation("completed", "done", HUGE_JSON), ("FAILED", "internal_error"),
     "reconcile: the result (200008 bytes) is too large to store (string or blob too big)"),
    (Reconciliation("waiting", "ask", pause=PolicyDecision.need_approval(
        "k", "r", capability={"x": HUGE})), ("FAILED", "internal_error"),
     "reconcile: the pause capability (200008 bytes) is too large to store"),
])
def test_a_reconciliation_too_large_to_store_ends_the_run_explained(rec, ended, says):
    """A reconciler's detail or error is clipped; a result or pause too large fails
    the run saying which. Each raised apsw.TooBigError out of resume."""
    crashed = Crashed()
    try:
        crashed.store.db().limit(apsw.SQLITE_LIMIT_LENGTH, LIMIT)

        def reconcile(view):
            if rec is None:
                raise RuntimeError(HUGE)
            return rec

        run = crashed.resumer([None], reconcile=reconcile).resume("r")
        assert (run.status, run.reason) == ended
        assert run.reason_detail.startswith(says)
        assert len(run.reason_detail) < 2_000
        assert_settled(crashed.store)
    finally:
        crashed.finish()


def test_a_model_name_too_large_to_store_ends_the_run_model_unavailable(tmp_path):
    """Its dispatch raised apsw.TooBigError through the agent: an agent_error that
    said only "string or blob too big"."""
    model = ScriptedModel([], name=HUGE)
    d, store, _, _ = make(small_store(tmp_path), script=[_asking], model=ModelConfig(model))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    assert "the model's name (200000 characters) is too large to store" in run.reason_detail
    assert model.requests == []
    assert store.read_row("SELECT count(*) FROM model_calls", ()) == (0,)
    assert_settled(store)


def test_a_lease_owner_too_large_to_store_is_named_when_the_start_is_refused(tmp_path):
    """The refusal names the largest value the run would record, not the goal."""
    store = small_store(tmp_path)
    d = Driver(store, AgentFunc(lambda step: Decision.complete()), DefaultPolicy(),
               lease_owner=HUGE)
    with pytest.raises(ConfigError, match=r"start run: the lease owner \(200013 bytes\) is too"):
        d.start("g", limits(), run_id="r")
    assert store.read_row("SELECT count(*) FROM runs", ()) == (0,)


class GrowingSpec:
    """A tool whose spec grows past what SQLite holds once the run has started."""

    grown = False

    def spec(self) -> ToolSpec:
        description = HUGE if self.grown else "reads"
        return ToolSpec("read", description, b'{"type":"object"}', "read_only",
                        timedelta(seconds=5))

    def call(self, c):
        return ToolResult(b"{}", "read")


def test_a_tool_spec_grown_too_large_to_store_is_named_in_the_invalid_decision(tmp_path):
    """The spec, not the decision, is what did not fit: the observation says so and
    the step records no spec hash whose spec is missing."""
    tool = GrowingSpec()

    def observe(event):
        if event.type == "run.started":
            tool.grown = True

    d, store, _, _ = make(small_store(tmp_path), script=[call("read"), Decision.complete()],
                          tools=[tool], observer=observe)
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    first = store.list_steps("r")[0]
    assert first.observation is not None and first.observation.kind == "invalid_decision"
    assert 'the spec of tool "read" (' in first.observation.summary
    assert first.spec_hash == ""
    assert_settled(store)


def test_an_operator_decision_names_the_field_too_large_in_bytes_not_characters(tmp_path):
    # SQLite's limit is in bytes: a `by` of 40,000 "€" (120 kB) does not fit
    # where a note of 50,000 ASCII characters (50 kB) does.
    by, note = "\u20ac" * 40_000, "a" * 50_000
    assert len(note.encode()) < LIMIT < len(by.encode())
    rule = PolicyFunc(lambda view, request: PolicyDecision.need_approval("k", "look"))
    d, store, _, _ = make(small_store(tmp_path), script=[call("publish")], policy=rule)
    assert d.start("g", limits(), run_id="r").status == "WAITING_FOR_APPROVAL"
    (a,) = store.list_approvals("r")
    for decide in (lambda: d.approve("r", a.id, by, note), lambda: d.cancel("r", by, note)):
        with pytest.raises(ConfigError, match=r": by is 40000 characters, too large"):
            decide()
    assert store.get_run("r").status == "WAITING_FOR_APPROVAL"


def test_a_tool_that_ran_whose_outcome_and_its_replacement_are_too_large_fails_the_run(
        tmp_path):
    # The outcome is too large, and so is the tool error standing for it (the
    # tool's name is half the limit): the run ends internal_error, its step
    # failed, instead of raising with the run RUNNING and the step executing.
    name, ran = "t" * 51_000, []
    tool = FuncTool(name, lambda c: ran.append(1) or ToolResult(HUGE_JSON, "ok"),
                    side_effect="read_only", timeout=5)
    d, store, _, _ = make(small_store(tmp_path), script=[call(name)], tools=[tool])
    run = d.start("g", limits(), run_id="r")
    assert ran == [1]
    assert (run.status, run.reason) == ("FAILED", "internal_error")
    assert "too large to store" in run.reason_detail
    assert [s.status for s in store.list_steps("r")] == ["failed"]
    assert store.lease("r") == ("", None) and store.verify_events().broken is None


def test_a_policy_error_at_an_approved_resume_keeps_the_ruling_the_step_was_paused_on():
    calls = []

    def rule(view, request):
        calls.append(1)
        if len(calls) == 1:
            return PolicyDecision.need_approval("k", "look")
        raise RuntimeError("policy store down")

    d, store, _, _ = make(None, script=[call("publish")], policy=PolicyFunc(rule))
    assert d.start("g", limits(), run_id="r").status == "WAITING_FOR_APPROVAL"
    (a,) = store.list_approvals("r")
    paused = store.list_steps("r")[0].policy
    d.approve("r", a.id, "ops", "ok")
    run = d.resume("r")
    assert (run.status, run.reason) == ("FAILED", "internal_error")
    assert store.list_steps("r")[0].policy == paused is not None
