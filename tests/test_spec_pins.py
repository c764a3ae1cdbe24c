"""Spec rules that no other test pinned, each stated with the spec's exact values.

The order of the limit checks (core.md §6.4), the retry waits and model-call
branches (§9), migration 5's placeholder lease (§3, §8), the in-transaction
re-check of a shown hash (§7.2), the boundary checks for huge numbers (§4.2),
approval and grant expiry boundaries (§7.2-7.4), the late tool outcome after a
cancel (§6.6, §7.5), INTERRUPTED runs (§1) and the tool spec table (§4.4).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from _driver_kit import call, fixture_tools, limits, make, stopped_while_deciding, types
from store_helpers import build_old_database

from agentrt import canonical_json, content_hash
from agentrt.driver import (
    AbortRun,
    CancelledError,
    CancelToken,
    FuncTool,
    Message,
    ModelConfig,
    ModelRequest,
    ModelResponse,
    Operator,
    PolicyFunc,
    Price,
    Reconciliation,
    ToolError,
    ToolResult,
    cancel,
    cost_micros,
)
from agentrt.errors import (
    ApprovalChangedError,
    ApprovalExpiredError,
    NotPendingError,
    RunLeasedError,
)
from agentrt.gojson import dumps
from agentrt.records import (
    PRE_LEASE_OWNER,
    Decision,
    Limits,
    PolicyDecision,
    Usage,
    approval_hash,
    default_limits,
)
from agentrt.store import open_store
from agentrt.store.writes import MAX_INT64
from agentrt.testing import FakeClock, ScriptedModel, rate_limited
from agentrt.timefmt import format_time, format_time_nano


def ms(n: float) -> timedelta:
    return timedelta(milliseconds=n)


def payload(event) -> dict:
    return json.loads(event.payload)


# ---------------------------------------------------------------------------
# 1. The order of the limit checks (§6.4): steps, consecutive failures, active
#    time, elapsed time, then loop detection.

def flaky(c: FakeClock, seconds: float = 0) -> FuncTool:
    """Fails every call with the same error, taking `seconds` of the clock."""
    def fn(_call):
        c.advance(timedelta(seconds=seconds))
        raise ToolError("boom")
    return FuncTool("flaky", fn, timeout=5)


def same(c: FakeClock, seconds: float = 0) -> FuncTool:
    """Returns the same content every call, taking `seconds` of the clock."""
    def fn(_call):
        c.advance(timedelta(seconds=seconds))
        return ToolResult(b'{"x":1}', "same")
    return FuncTool("same", fn, timeout=5)


LIMIT_PAIRS = [
    # (id, tool, seconds per call, distinct args, limits, reason, detail, steps)
    ("steps-before-failures", flaky, 0, False, {"max_steps": 3},
     "limit_steps", "step limit 3 reached", 3),
    ("failures-before-active-time", flaky, 10, False,
     {"max_active_time": timedelta(seconds=25)},
     "repeated_tool_failures", "3 consecutive failed steps", 3),
    ("active-before-elapsed-time", same, 30, True,
     {"max_active_time": timedelta(seconds=25), "max_elapsed_time": timedelta(seconds=25)},
     "limit_active_time", "active time 30s reached limit 25s", 1),
    ("elapsed-time-before-loop", same, 30, False,
     {"loop_threshold": 1, "max_elapsed_time": timedelta(seconds=25)},
     "limit_elapsed_time", "elapsed time reached limit 25s", 1),
    ("failures-before-loop", flaky, 0, False, {"loop_threshold": 3},
     "repeated_tool_failures", "3 consecutive failed steps", 3),
    ("steps-before-loop", same, 0, False, {"max_steps": 2, "loop_threshold": 2},
     "limit_steps", "step limit 2 reached", 2),
]


@pytest.mark.parametrize(("tool", "seconds", "distinct", "lim", "reason", "detail", "steps"),
                         [p[1:] for p in LIMIT_PAIRS], ids=[p[0] for p in LIMIT_PAIRS])
def test_a_run_tripping_two_limits_ends_with_the_earlier_checks_reason(
        tool, seconds, distinct, lim, reason, detail, steps):
    c = FakeClock()
    t = tool(c, seconds)
    script = [call(t.spec().name, f'{{"n":{i}}}' if distinct else b"{}") for i in range(6)]
    d, store, _, _ = make(script=script, tools=[t], now=c)
    run = d.start("g", limits(**lim), run_id="r")
    assert (run.status, run.reason, run.reason_detail, run.step_count) == (
        "FAILED", reason, detail, steps)
    assert types(store, "r")[-2:] == ["limit.exceeded", "run.finished"]
    assert "loop.detected" not in types(store, "r")
    assert payload(store.list_events("r")[-2]) == {"detail": detail, "reason": reason}
    # The later limit was met too, so the order is what decided.
    ran = store.list_steps("r")
    if tool is flaky:
        assert all(s.observation.kind == "tool_error" for s in ran)
    if seconds:
        assert run.active_ms == steps * seconds * 1000
        assert run.active_ms >= lim.get("max_active_time", timedelta(0)).total_seconds() * 1000


def test_loop_detection_writes_loop_detected_and_no_limit_exceeded():
    c = FakeClock()
    d, store, _, _ = make(script=[call("same")] * 5, tools=[same(c)], now=c)
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason, run.reason_detail, run.step_count) == (
        "FAILED", "loop_detected", "same produced the same observation 3 times in a row", 3)
    kinds = types(store, "r")
    assert kinds[-2:] == ["loop.detected", "run.finished"]
    assert "limit.exceeded" not in kinds
    last = store.list_steps("r")[-1]
    detected = store.list_events("r")[-2]
    assert detected.step_id == ""
    assert payload(detected) == {"args_hash": content_hash(b"{}"),
                                 "observation_hash": last.observation.content_hash,
                                 "repeats": 3, "tool": "same"}


# ---------------------------------------------------------------------------
# 2. Retry waits (§9.3) and the model defaults.

REQ = ModelRequest(messages=[Message("user", "hello")], max_output_tokens=50)


def asking(request: ModelRequest = REQ, times: int = 1):
    def decide(step):
        for _ in range(times):
            step.model.generate(request)
        return Decision.complete()
    return decide


def ok(i: int = 1, o: int = 1) -> ModelResponse:
    return ModelResponse(text="ok", usage=Usage(i, o))


def drive(replies, lim: Limits | None = None, script=None, now=None, **cfg):
    model = ScriptedModel(replies)
    kw = {"now": now} if now is not None else {}
    d, store, _, _ = make(script=script or [asking()], model=ModelConfig(model, **cfg), **kw)
    run = d.start("g", lim or limits(), run_id="r")
    return run, store, model


def test_retry_waits_double_from_the_backoff(waits):
    run, store, model = drive([rate_limited(), rate_limited(), rate_limited(), ok()],
                              max_retries=3, backoff=ms(10))
    assert run.status == "COMPLETED"
    assert waits == [ms(10), ms(20), ms(40)]
    assert [m.attempt for m in store.list_model_calls("r")] == [1, 2, 3, 4]


def test_retry_after_raises_the_wait_but_never_lowers_it(waits):
    run, _, _ = drive([rate_limited(ms(50)), rate_limited(ms(1)), ok()],
                      max_retries=2, backoff=ms(10))
    assert run.status == "COMPLETED"
    assert waits == [ms(50), ms(20)]  # max(10, 50), then max(20, 1)


def test_retry_after_equal_to_the_maximum_is_waited_and_past_it_is_unavailable(waits):
    run, _, _ = drive([rate_limited(timedelta(seconds=2)), ok()], max_retries=1,
                      backoff=ms(1), max_retry_after=timedelta(seconds=2))
    assert run.status == "COMPLETED" and waits == [timedelta(seconds=2)]
    waits.clear()
    run, store, model = drive([rate_limited(timedelta(seconds=2, microseconds=1)), ok()],
                              max_retries=1, backoff=ms(1),
                              max_retry_after=timedelta(seconds=2))
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "model_unavailable", "model unavailable after 1 attempt(s): 429 slow down")
    assert waits == [] and len(model.requests) == 1


@pytest.mark.parametrize("limit", ["max_active_time", "max_elapsed_time"])
def test_a_wait_reaching_a_time_limit_is_unavailable_without_sleeping(waits, limit):
    lim = limits(**{limit: timedelta(seconds=20)})
    # The clock stands still: the wait alone decides. Reaching the limit is enough.
    run, store, model = drive([rate_limited(), ok()], lim, now=FakeClock(), max_retries=1,
                              backoff=timedelta(seconds=20))
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "model_unavailable", "model unavailable after 1 attempt(s): 429 slow down")
    assert waits == [] and len(model.requests) == 1
    assert types(store, "r")[-3:] == ["step.failed", "limit.exceeded", "run.finished"]
    # A microsecond less fits, and is waited.
    run, _, model = drive([rate_limited(), ok()], lim, now=FakeClock(), max_retries=1,
                          backoff=timedelta(seconds=20) - timedelta(microseconds=1))
    assert run.status == "COMPLETED" and len(model.requests) == 2
    assert waits == [timedelta(seconds=20) - timedelta(microseconds=1)]


def test_model_config_and_limit_defaults_are_the_specs():
    config = ModelConfig(ScriptedModel([]))
    assert (config.max_retries, config.backoff, config.call_timeout, config.max_retry_after) == (
        0, timedelta(seconds=1), timedelta(minutes=2), timedelta(minutes=1))
    zero = ModelConfig(ScriptedModel([]), max_retries=-1, backoff=timedelta(0),
                       call_timeout=timedelta(0), max_retry_after=timedelta(0)).resolved()
    assert (zero.max_retries, zero.backoff, zero.call_timeout, zero.max_retry_after) == (
        0, timedelta(seconds=1), timedelta(minutes=2), timedelta(minutes=1))
    assert default_limits() == Limits(max_steps=50, max_consecutive_tool_failures=3,
                                      loop_threshold=3)
    assert default_limits().to_json() == {"max_steps": 50, "max_consecutive_tool_failures": 3,
                                          "loop_threshold": 3}


# ---------------------------------------------------------------------------
# 3. Migration 5's placeholder lease: one lease of grace, then a takeover.

def test_the_placeholder_lease_refuses_a_resume_in_its_grace_then_is_taken_over(tmp_path):
    path = tmp_path / "v4.db"
    conn = build_old_database(path, 4)
    conn.execute(
        "INSERT INTO runs (id, goal, status, limits_json, created_at, started_at, step_count) "
        "VALUES ('r', 'g', 'RUNNING', '{\"max_steps\":50,\"max_consecutive_tool_failures\":3,"
        "\"loop_threshold\":3}', '2026-10-01T09:00:00Z', '2026-10-01T09:00:00Z', 1)")
    conn.execute(
        "INSERT INTO steps (id, run_id, idx, status, decision_json, started_at) VALUES "
        "('s0', 'r', 0, 'executing', '{\"kind\":\"tool_call\",\"tool\":\"read\","
        "\"args\":{\"n\":1}}', '2026-10-01T09:00:01Z')")
    conn.close()
    os.chmod(path, 0o600)
    with open_store(str(path)) as store:
        owner, expires = store.lease("r")
        assert owner == PRE_LEASE_OWNER == "agentrt:pre-lease-version"
        wall = FakeClock(start=datetime.now(UTC))
        calls: list = []
        d, _, _, _ = make(store=store, script=[None, Decision.complete()],
                          tools=fixture_tools(calls), wall=wall, lease_owner="new")
        with pytest.raises(RunLeasedError) as refused:
            d.resume("r")
        assert refused.value.owner == PRE_LEASE_OWNER
        assert str(refused.value) == (
            f"agentrt: run r is leased by {PRE_LEASE_OWNER} until {format_time_nano(expires)}")
        assert store.list_events("r") == [] and store.list_steps("r")[0].status == "executing"
        assert store.lease("r") == (owner, expires)

        wall.advance(timedelta(seconds=31))
        run = d.resume("r")
        assert (run.status, run.reason, run.step_count) == ("COMPLETED", "goal_completed", 2)
        events = store.list_events("r")
        assert [e.type for e in events] == [
            "lease.taken_over", "step.interrupted", "run.resumed", "step.started",
            "step.decided", "run.finished"]
        taken = payload(events[0])
        assert list(taken) == ["owner", "previous_expires_at", "previous_owner"]
        assert re.fullmatch(r"new/[0-9a-f]{12}", taken["owner"])
        assert taken["previous_owner"] == PRE_LEASE_OWNER
        assert taken["previous_expires_at"] == format_time(expires)
        assert events[1].step_id == "s0"
        assert payload(events[1]) == {"previous_status": {"previous_status": "executing"}}
        assert payload(events[2]) == {"after": "interruption"}
        assert payload(events[3]) == {"index": 1}
        step = store.list_steps("r")[0]
        assert (step.status, step.observation.kind, step.observation.summary) == (
            "interrupted", "interrupted", "step interrupted while executing")
        assert calls == []  # never re-executed on its own
        assert store.lease("r") == ("", None)
        assert store.verify_events().broken is None


# ---------------------------------------------------------------------------
# 4. A shown hash is compared again inside the transaction (§7.2).

def test_approve_shown_rechecks_the_hash_inside_the_transaction():
    d, store, _, _ = make(script=[call("publish", b'{"to":"a"}'), Decision.complete()])
    d.start("g", limits(), run_id="r")
    a = store.list_approvals("r")[0]
    changed = replace(a.request, args=b'{"to":"prod"}')
    new_hash = approval_hash(a.kind, a.capability, a.presentation, changed)
    clock = FakeClock()
    rewrites: list[str] = []

    def rewriting_clock():
        # The clock is read after the outside check and before the transaction.
        if not rewrites:
            with store.tx() as tx:
                tx.execute("UPDATE approvals SET request_json = ?, hash = ? WHERE id = ?",
                           (dumps(changed.to_json()).decode(), new_hash, a.id))
            rewrites.append(new_hash)
        return clock()

    before = types(store, "r")
    with pytest.raises(ApprovalChangedError) as refused:
        Operator(store, now=rewriting_clock).approve_shown("r", a.id, a.hash, "op")
    assert rewrites == [new_hash]  # the rewrite happened between the check and the tx
    assert not isinstance(refused.value, NotPendingError)
    assert str(refused.value).startswith("agentrt: approval is not the one that was shown")
    now = store.get_approval("r", a.id)
    assert (now.status, now.hash, now.decided_by, now.decided_at) == (
        "pending", new_hash, "", None)
    assert store.get_run("r").status == "WAITING_FOR_APPROVAL"
    assert types(store, "r") == before


# ---------------------------------------------------------------------------
# 5. Huge numbers are refused where they enter (§4.2).

HUGE = b'{"n": 1' + b"0" * 10_001 + b"}"
HUGE_WHY = "number 1" + "0" * 23 + "... is longer than 10000 characters"
EXP = b'{"n": 1e10001}'
EXP_WHY = "number 1e10001 has an exponent beyond \u00b110000"
NUMBERS = pytest.mark.parametrize(("number", "why"), [(HUGE, HUGE_WHY), (EXP, EXP_WHY)],
                                  ids=["long", "exponent"])


@NUMBERS
def test_huge_numbers_are_refused_where_they_enter_result(number, why):
    d, store, _, _ = make(script=[Decision.complete(number), Decision.complete()])
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.result) == ("COMPLETED", b"")
    first = store.list_steps("r")[0]
    assert (first.status, first.observation.kind) == ("failed", "invalid_decision")
    assert first.observation.summary == f"invalid decision: result is not usable JSON: {why}"
    assert first.decision.invalid_result == number.decode() and first.decision.result is None


@NUMBERS
def test_huge_numbers_are_refused_where_they_enter_tool_content(number, why):
    tool = FuncTool("emit", lambda c: ToolResult(number, "emitted"), timeout=5)
    d, store, _, _ = make(script=[call("emit"), Decision.complete()], tools=[tool])
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    obs = store.list_steps("r")[0].observation
    assert obs.kind == "tool_error"
    assert json.loads(obs.content) == {"content": number.decode(),
                                       "error": f"content is not usable JSON: {why}",
                                       "failure": "invalid_content", "tool": "emit"}
    assert obs.summary == f"emit returned content is not usable JSON: {why}"


@NUMBERS
@pytest.mark.parametrize("which", ["capability", "presentation"])
def test_huge_numbers_are_refused_where_they_enter_policy(number, why, which):
    parts = {"capability": b"{}", "presentation": b"{}", which: number}
    calls: list = []
    policy = PolicyFunc(lambda r, v: PolicyDecision("allow", "ok", "k", parts["capability"],
                                                    parts["presentation"]))
    d, store, _, _ = make(script=[call("read", b'{"n":1}')], tools=fixture_tools(calls),
                          policy=policy)
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "internal_error", f"policy: {which} is not usable JSON: {why}")
    assert calls == [] and store.list_approvals("r") == []
    assert types(store, "r")[-3:] == ["step.policy", "step.failed", "run.finished"]


@NUMBERS
def test_huge_numbers_are_refused_where_they_enter_reconcile_result(number, why):
    token = CancelToken()

    def stopped(step):  # the caller gives up while deciding: the step stays deciding
        token.cancel()
        raise RuntimeError("gone")

    d, store, _, _ = make(script=[stopped])
    with pytest.raises(CancelledError):
        d.start("g", limits(), run_id="r", cancel=token)
    b, _, _, _ = make(store=store, script=[None, Decision.complete()],
                      reconcile=lambda view: Reconciliation("completed", "done", number))
    run = b.resume("r")
    assert (run.status, run.reason, run.reason_detail, run.result) == (
        "FAILED", "internal_error", f"reconcile: result is not usable JSON: {why}", b"")


@pytest.mark.parametrize("number", [b'{"n":1' + b"0" * 9_999 + b"}", b'{"n":1e10000}',
                                    b'{"n":1e-10000}'], ids=["10000-chars", "e10000", "e-10000"])
def test_numbers_at_the_bounds_are_accepted(number):
    tool = FuncTool("emit", lambda c: ToolResult(number, "emitted"), timeout=5)
    d, store, _, _ = make(script=[call("emit"), Decision.complete(number)], tools=[tool])
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.result) == ("COMPLETED", number)
    assert store.list_steps("r")[0].observation.kind == "tool_result"


# ---------------------------------------------------------------------------
# 6. Model-call branches (§9).

def test_an_uncapped_request_is_refused_under_a_cost_limit_only_for_a_priced_model():
    uncapped = ModelRequest(messages=[Message("user", "hi")])
    run, store, model = drive([ok()], limits(max_estimated_cost_micros=100),
                              script=[asking(uncapped)],
                              prices={"scripted-model": Price(1, 1, 1)})
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "limit_cost",
        "limit_cost: the request sets no output cap, so it cannot be projected; "
        "set MaxOutputTokens or Limits.MaxOutputTokensPerCall")
    assert model.requests == [] and store.list_model_calls("r") == []
    assert types(store, "r")[-2:] == ["limit.exceeded", "run.finished"]
    # An unpriced model is free: nothing to project.
    run, store, model = drive([ok()], limits(max_estimated_cost_micros=100),
                              script=[asking(uncapped)])
    assert run.status == "COMPLETED" and len(model.requests) == 1
    assert store.list_model_calls("r")[0].cost_micros == 0


def test_the_per_call_cap_lowers_a_larger_request_cap_and_keeps_a_smaller_one():
    big = ModelRequest(messages=[Message("user", "hi")], max_output_tokens=500)
    small = ModelRequest(messages=[Message("user", "hi")], max_output_tokens=32)

    def both(step):
        step.model.generate(big)
        step.model.generate(small)
        return Decision.complete()

    run, _, model = drive([ok(), ok()], limits(max_output_tokens_per_call=64), script=[both])
    assert run.status == "COMPLETED"
    assert [r.max_output_tokens for r in model.requests] == [64, 32]


def test_an_other_error_is_final_and_not_retried(waits):
    run, store, model = drive([ValueError("weird"), ok()], max_retries=3, backoff=ms(1))
    assert (run.status, run.reason, run.reason_detail) == (
        "FAILED", "model_unavailable", "model unavailable after 1 attempt(s): weird")
    assert [(m.attempt, m.status, m.error) for m in store.list_model_calls("r")] == [
        (1, "error", "weird")]
    assert len(model.requests) == 1 and waits == []


def test_cost_saturates_at_the_int64_maximum():
    assert MAX_INT64 == 2**63 - 1
    top = Price(input=MAX_INT64, output=MAX_INT64, cached_input=MAX_INT64)
    assert cost_micros(top, Usage(1 << 62, 1 << 62)) == MAX_INT64
    assert cost_micros(Price(input=10**12), Usage(MAX_INT64, 0)) == MAX_INT64
    # Each call fits; their sum does not, so the run total saturates.
    each = 3 << 61  # 1 micro per output token: 6.9e18 per call, 1.38e19 together
    run, store, _ = drive([ok(0, each), ok(0, each)], script=[asking(times=2)],
                          prices={"scripted-model": Price(output=1_000_000)})
    assert [m.cost_micros for m in store.list_model_calls("r")] == [each, each]
    assert run.estimated_cost_micros == MAX_INT64 == store.get_run("r").estimated_cost_micros


def test_model_failed_payload_has_exactly_the_specs_keys():
    run, store, _ = drive([rate_limited()], now=FakeClock())
    assert run.reason == "model_unavailable"
    (mc,) = store.list_model_calls("r")
    failed = [e for e in store.list_events("r") if e.type == "model.failed"]
    assert len(failed) == 1 and failed[0].step_id == mc.step_id
    body = payload(failed[0])
    assert list(body) == ["attempt", "call_id", "cost_micros", "error", "latency_ms", "model",
                          "status", "usage"]
    assert body == {"attempt": 1, "call_id": mc.id, "cost_micros": 0, "error": "429 slow down",
                    "latency_ms": 0, "model": "scripted-model", "status": "error",
                    "usage": {"input_tokens": 0, "output_tokens": 0}}


# ---------------------------------------------------------------------------
# 7. Expiry boundaries (§7.2-7.4).

def paused(c: FakeClock, calls: list | None = None, **lim):
    d, store, _, _ = make(script=[call("publish"), Decision.complete()], now=c,
                          tools=fixture_tools(calls))
    d.start("g", limits(**lim), run_id="r")
    return d, store, store.list_approvals("r")[0]


def test_an_approval_is_approvable_exactly_at_its_expiry():
    c = FakeClock()
    d, store, a = paused(c, approval_ttl=timedelta(hours=1))
    assert a.expires_at == datetime(2026, 10, 1, 10, 0, tzinfo=UTC)
    c.set(a.expires_at)
    assert d.approve("r", a.id, "op").status == "approved"
    assert store.get_run("r").status == "WAITING_FOR_APPROVAL"


def test_an_approval_a_microsecond_past_its_expiry_is_expired():
    c = FakeClock()
    d, store, a = paused(c, approval_ttl=timedelta(hours=1))
    late = a.expires_at + timedelta(microseconds=1)
    c.set(late)
    with pytest.raises(ApprovalExpiredError) as expired:
        d.approve("r", a.id, "op")
    assert isinstance(expired.value, NotPendingError)
    assert str(expired.value) == (
        f"agentrt: approval is not pending: approval {a.id} expired at 2026-10-01T10:00:00Z")
    run = store.get_run("r")
    assert (run.status, run.reason, run.reason_detail) == (
        "CANCELLED", "approval_expired", f"approval {a.id} expired")
    gone = store.get_approval("r", a.id)
    assert (gone.status, gone.decided_at, gone.note) == ("expired", late, "expired")
    events = store.list_events("r")
    assert [e.type for e in events[-2:]] == ["approval.decided", "run.finished"]
    assert events[-2].step_id == a.step_id
    assert payload(events[-2]) == {"approval_id": a.id, "status": "expired"}


def test_a_grant_runs_exactly_at_its_ttl():
    c = FakeClock()
    calls: list = []
    d, store, a = paused(c, calls, grant_ttl=timedelta(minutes=10))
    d.approve("r", a.id, "op")
    c.set(store.get_approval("r", a.id).decided_at + timedelta(minutes=10))
    assert d.resume("r").status == "COMPLETED"
    assert len(calls) == 1


def test_a_grant_past_its_ttl_expires_keeping_who_decided():
    c = FakeClock()
    calls: list = []
    d, store, a = paused(c, calls, grant_ttl=timedelta(minutes=10))
    d.approve("r", a.id, "op", "n")
    granted = store.get_approval("r", a.id)
    c.set(granted.decided_at + timedelta(minutes=10, microseconds=1))
    run = d.resume("r")
    assert (run.status, run.reason, run.reason_detail) == (
        "CANCELLED", "approval_expired", f"approval {a.id} expired")
    gone = store.get_approval("r", a.id)
    assert (gone.status, gone.decided_at, gone.decided_by, gone.note) == (
        "expired", granted.decided_at, "op", "n")
    assert calls == []
    events = store.list_events("r")
    assert [e.type for e in events[-2:]] == ["approval.decided", "run.finished"]
    assert payload(events[-2]) == {"approval_id": a.id, "status": "expired"}


# ---------------------------------------------------------------------------
# 8. The late step.tool_finished after a cancel (§6.6, §7.5).

def _erring(call_):
    raise ToolError("kaput")


def _aborting(call_):
    raise AbortRun("nope")


def _finishing(call_):
    return ToolResult(b'{"a":1}', "fin")


LATE = [
    ("tool-error", _erring, False,
     {"kind": "tool_error", "content": {"error": "kaput", "failure": "error", "tool": "t"},
      "summary": "t error: kaput"}),
    ("abort-run", _aborting, False,
     {"kind": "tool_error", "content": {"error": "nope", "failure": "abort", "tool": "t"},
      "summary": "t aborted the run: nope"}),
    ("terminal-tool", _finishing, True,
     {"kind": "tool_result", "content": {"a": 1}, "summary": "fin"}),
]


@pytest.mark.parametrize(("outcome", "terminal", "observed"), [x[1:] for x in LATE],
                         ids=[x[0] for x in LATE])
def test_a_tool_outcome_after_a_cancel_is_appended_late(outcome, terminal, observed):
    holder: dict = {}

    def tool(call_):
        cancel(holder["store"], "r", "op", "halt")
        return outcome(call_)

    t = FuncTool("t", tool, side_effect="local_mutation", timeout=5, terminal=terminal)
    d, store, _, _ = make(script=[call("t"), Decision.complete()], tools=[t])
    holder["store"] = store
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason, run.reason_detail, run.result) == (
        "CANCELLED", "operator_cancelled", "halt", b"")
    events = store.list_events("r")
    assert [e.type for e in events[-3:]] == ["step.tool_started", "run.finished",
                                             "step.tool_finished"]
    late = payload(events[-1])
    step = store.list_steps("r")[0]
    assert events[-1].step_id == step.id
    observation = late["observation"]
    content = json.dumps(observation["content"], separators=(",", ":")).encode()
    assert observation == {**observed, "content_hash": content_hash(content)}
    if observed["kind"] == "tool_result":
        assert list(late) == ["content_hash", "duration_ms", "late", "observation", "summary",
                              "tool"]
        assert (late["summary"], late["content_hash"]) == ("fin", observation["content_hash"])
    else:
        assert list(late) == ["duration_ms", "late", "observation", "tool"]
    assert (late["late"], late["tool"]) == (True, "t")
    # The step keeps what the cancel wrote.
    assert (step.status, step.observation.kind, step.observation.summary) == (
        "failed", "interrupted", "cancelled by operator: halt")
    assert store.verify_events().broken is None


# ---------------------------------------------------------------------------
# 9. INTERRUPTED is accepted like RUNNING by Resume and Cancel (§1).

def interrupted_run():
    d, store = stopped_while_deciding()
    with store.tx() as tx:
        tx.execute("UPDATE runs SET status = 'INTERRUPTED' WHERE id = 'r'")
    assert store.get_run("r").status == "INTERRUPTED"
    return d, store


def test_resume_accepts_an_interrupted_run():
    d, store = interrupted_run()
    run = d.resume("r")
    assert (run.status, run.reason, run.step_count) == ("COMPLETED", "goal_completed", 2)
    assert types(store, "r")[3:] == ["step.interrupted", "run.resumed", "step.started",
                                     "step.decided", "run.finished"]
    step = store.list_steps("r")[0]
    assert (step.status, step.observation.summary) == (
        "interrupted", "step interrupted while deciding")


def test_cancel_accepts_an_interrupted_run():
    _, store = interrupted_run()
    run = cancel(store, "r", "op", "n")
    assert (run.status, run.reason, run.reason_detail) == ("CANCELLED", "operator_cancelled", "n")
    assert types(store, "r")[3:] == ["run.finished"]
    step = store.list_steps("r")[0]
    assert (step.status, step.observation.kind, step.observation.summary) == (
        "failed", "interrupted", "cancelled by operator: n")


# ---------------------------------------------------------------------------
# 10. A tool spec is stored once, however many steps and runs use it (§4.4).

def test_a_tool_spec_is_stored_once_across_steps_and_runs():
    d, store, _, _ = make(script=[call("read", b'{"n":1}'), call("read", b'{"n":2}'),
                                  call("write", b'{"n":3}'), Decision.complete()])
    d.start("g", limits(), run_id="r1")

    def count() -> int:
        return store.db().execute("SELECT count(*) FROM tool_specs").fetchone()[0]

    assert count() == 4  # the four registered tools, put at Start
    d2, _, _, _ = make(store=store, script=[call("read", b'{"n":4}'), Decision.complete()])
    d2.start("g", limits(), run_id="r2")
    assert count() == 4
    rows = dict(store.db().execute("SELECT hash, spec_json FROM tool_specs").fetchall())
    for h, spec_json in rows.items():
        assert canonical_json(spec_json.encode()) == spec_json.encode()
        assert hashlib.sha256(spec_json.encode()).hexdigest() == h
    reads = [s.spec_hash for r in ("r1", "r2") for s in store.list_steps(r)
             if s.decision.tool == "read"]
    assert len(reads) == 3 and len(set(reads)) == 1 and reads[0] in rows
    for run_id in ("r1", "r2"):
        assert sorted(payload(store.list_events(run_id)[0])["tools"]) == sorted(rows)
