"""Mapping rules of spec 3.5 (and ExampleFollower of 2.2) that the other tests
leave unpinned: one rule per test, with the exact keys and values of the
spec's table."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.trace import SpanKind, StatusCode
from span_helpers import an_event, event_names, named, one, spans_of

import agentrt
from agentrt.driver import DefaultPolicy, Driver
from agentrt.events import ALL_EVENT_TYPES, Event
from agentrt.records import Decision, Limits, PolicyDecision, default_limits
from agentrt.testing import ScriptedAgent, static_tool
from agentrt.timefmt import to_unix_nanos
from agentrt_export import Follower, JSONLSink
from agentrt_otel import SpanMapper, SpanRecord, span_id
from agentrt_otel.testing import HASH, EventStream

#: A payload the store capped (spec 0.3): only ``agentrt.payload.truncated`` can come of it.
CAP = b'{"truncated":true,"length":99999,"head":"xx"}'
T = "agentrt.payload.truncated"
MS = 1_000_000



def ns(event: Event) -> int:
    return to_unix_nanos(event.at)


def limit_attrs(span: SpanRecord) -> dict[str, object]:
    return {k: v for k, v in span.attributes.items() if k.startswith("agentrt.limits.")}


def raw_event(seq: int, type_: str, payload: bytes, step_id: str = "") -> Event:
    return Event(seq, "r", step_id, datetime(2026, 1, 1, 0, 0, seq, tzinfo=UTC), type_, payload)


def _step(s: EventStream, step_id: str = "s") -> None:
    s.run_created("goal")
    s.run_started()
    s.step_started(step_id, 0)


# -- run.created ------------------------------------------------------------

def test_run_created_is_ignored_while_the_run_span_is_open() -> None:
    s = EventStream("r")
    first = s.run_created("first goal", replace(default_limits(), max_model_calls=4))
    s.run_started()
    mapper = SpanMapper()
    mapper.map_all(s.events)
    again = [s.run_created("second goal", replace(default_limits(), max_steps=99,
                                                  max_total_tokens=7)),
             s.emit("run.created", CAP)]
    assert mapper.map_all(again) == []
    (run,) = mapper.map(s.run_finished("COMPLETED", "goal_completed"))
    assert run.start_ns == ns(first)
    assert run.attributes["agentrt.run.goal"] == "first goal"
    assert limit_attrs(run) == {"agentrt.limits.max_steps": 50,
                                "agentrt.limits.max_consecutive_tool_failures": 3,
                                "agentrt.limits.loop_threshold": 3,
                                "agentrt.limits.max_model_calls": 4}
    assert T not in run.attributes
    assert event_names(run) == ["run.started"]


def test_run_created_after_another_event_opened_the_run_span_is_ignored() -> None:
    s = EventStream("r")
    started = s.run_started()
    s.run_created("late goal", replace(default_limits(), max_steps=9))
    s.run_finished("COMPLETED", "goal_completed")
    run = one(spans_of(s), "agentrt.run")
    assert run.start_ns == ns(started)
    assert run.attributes["agentrt.span.start_unknown"] is True
    assert "agentrt.run.goal" not in run.attributes
    assert limit_attrs(run) == {}


def _limits_payload(limits: bytes) -> bytes:
    return b'{"goal":"g","limits":' + limits + b"}"


def _run_span_for_limits(limits: bytes) -> SpanRecord:
    mapper = SpanMapper()
    mapper.map(raw_event(1, "run.created", _limits_payload(limits)))
    (run,) = mapper.map(raw_event(2, "run.finished", b'{"status":"COMPLETED"}'))
    return run


#: Every limit set, durations in nanoseconds that are not whole milliseconds.
ALL_LIMITS = (b'{"max_steps":10,"max_consecutive_tool_failures":2,"loop_threshold":4,'
              b'"max_model_calls":5,"max_output_tokens_per_call":6,"max_total_tokens":7,'
              b'"max_estimated_cost_micros":8,"max_active_time":1500999999,'
              b'"max_elapsed_time":2000000001,"approval_ttl":60000000000,"grant_ttl":3999999}')


def test_every_limit_maps_to_its_key_with_durations_in_whole_milliseconds_truncated() -> None:
    assert limit_attrs(_run_span_for_limits(ALL_LIMITS)) == {
        "agentrt.limits.max_steps": 10,
        "agentrt.limits.max_consecutive_tool_failures": 2,
        "agentrt.limits.loop_threshold": 4,
        "agentrt.limits.max_model_calls": 5,
        "agentrt.limits.max_output_tokens_per_call": 6,
        "agentrt.limits.max_total_tokens": 7,
        "agentrt.limits.max_estimated_cost_micros": 8,
        "agentrt.limits.max_active_time_ms": 1500,
        "agentrt.limits.max_elapsed_time_ms": 2000,
        "agentrt.limits.approval_ttl_ms": 60000,
        "agentrt.limits.grant_ttl_ms": 3,
    }


def test_limits_written_by_the_runtime_map_the_same_way() -> None:
    s = EventStream("r")
    s.run_created("g", Limits(max_steps=10, max_consecutive_tool_failures=2, loop_threshold=4,
                              max_output_tokens_per_call=6,
                              max_estimated_cost_micros=8,
                              max_active_time=timedelta(milliseconds=1500, microseconds=999),
                              max_elapsed_time=timedelta(seconds=2),
                              grant_ttl=timedelta(seconds=3)))
    s.run_finished("COMPLETED", "goal_completed")
    assert limit_attrs(one(spans_of(s), "agentrt.run")) == {
        "agentrt.limits.max_steps": 10,
        "agentrt.limits.max_consecutive_tool_failures": 2,
        "agentrt.limits.loop_threshold": 4,
        "agentrt.limits.max_output_tokens_per_call": 6,
        "agentrt.limits.max_estimated_cost_micros": 8,
        "agentrt.limits.max_active_time_ms": 1500,
        "agentrt.limits.max_elapsed_time_ms": 2000,
        "agentrt.limits.grant_ttl_ms": 3000,
    }


@pytest.mark.parametrize("limits", [
    b"{}",
    b'{"max_steps":0,"max_consecutive_tool_failures":0,"loop_threshold":0,'
    b'"max_model_calls":0,"max_output_tokens_per_call":0,"max_total_tokens":0,'
    b'"max_estimated_cost_micros":0,"max_active_time":0,"max_elapsed_time":0,'
    b'"approval_ttl":0,"grant_ttl":0}',
], ids=["absent", "zero"])
def test_zero_limits_give_only_the_three_that_are_always_set(limits: bytes) -> None:
    assert limit_attrs(_run_span_for_limits(limits)) == {
        "agentrt.limits.max_steps": 0,
        "agentrt.limits.max_consecutive_tool_failures": 0,
        "agentrt.limits.loop_threshold": 0,
    }


LIMIT_KEYS = ("max_steps", "max_consecutive_tool_failures", "loop_threshold",
              "max_model_calls", "max_output_tokens_per_call", "max_total_tokens",
              "max_estimated_cost_micros", "max_active_time", "max_elapsed_time",
              "approval_ttl", "grant_ttl")


@pytest.mark.parametrize("bad", [b'"1000000"', b"1.5", b"[]"], ids=["string", "float", "array"])
@pytest.mark.parametrize("key", LIMIT_KEYS)
def test_one_limit_of_a_wrong_type_gives_no_limit_attributes_at_all(key: str, bad: bytes) -> None:
    good = json.loads(ALL_LIMITS)
    assert key in good
    limits = ALL_LIMITS.replace(b'"' + key.encode() + b'":' + str(good[key]).encode(),
                                b'"' + key.encode() + b'":' + bad)
    assert limits != ALL_LIMITS
    run = _run_span_for_limits(limits)
    assert limit_attrs(run) == {}
    assert run.attributes["agentrt.run.goal"] == "g"


# -- span events without attributes; run.resumed, limit.exceeded -------------

@pytest.mark.parametrize("capped", [False, True], ids=["plain", "capped"])
def test_run_started_step_decided_and_step_policy_events_carry_no_attributes(
    capped: bool,
) -> None:
    s = EventStream("r")
    s.run_created("goal")
    if capped:
        s.emit("run.started", CAP)
        s.step_started("s", 0)
        s.emit("step.decided", CAP, "s")
        s.emit("step.policy", CAP, "s")
    else:
        s.run_started()
        s.step_started("s", 0)
        s.step_decided("s", Decision.tool_call("read", b'{"n":1}', reason="why"))
        s.step_policy("s", PolicyDecision.allow("ok"), policy_id="p")
    s.run_finished("COMPLETED", "goal_completed")
    spans = spans_of(s)
    run = one(spans, "agentrt.run")
    step = one(spans, "agentrt.step")
    assert event_names(run) == ["run.started"]
    assert an_event(run, "run.started") == {}
    assert event_names(step) == ["step.decided", "step.policy"]
    assert an_event(step, "step.decided") == {}
    assert an_event(step, "step.policy") == {}


def test_run_resumed_after_an_interruption_sets_resumed_after() -> None:
    s = EventStream("r")
    s.run_created()
    s.run_resumed("", after="interruption")
    s.run_resumed("s", approval_id="a1")
    s.run_finished("COMPLETED", "goal_completed")
    run = one(spans_of(s), "agentrt.run")
    first, second = [dict(e.attributes) for e in run.events if e.name == "run.resumed"]
    assert first == {"agentrt.resumed.after": "interruption"}
    assert second == {"agentrt.approval.id": "a1"}


def test_limit_exceeded_sets_the_limit_detail_as_text() -> None:
    s = EventStream("r")
    s.run_created()
    s.limit_exceeded("limit_steps", "step limit 1 reached")
    s.run_finished("FAILED", "limit_steps")
    whole = an_event(one(spans_of(s), "agentrt.run"), "limit.exceeded")
    assert whole == {"agentrt.limit.reason": "limit_steps",
                     "agentrt.limit.detail": "step limit 1 reached"}
    cut = an_event(one(spans_of(s, SpanMapper(max_text=8)), "agentrt.run"), "limit.exceeded")
    assert cut["agentrt.limit.detail"] == "step lim…[truncated: 20 bytes]"


# -- step.started -----------------------------------------------------------

@pytest.mark.parametrize("interrupted", [False, True], ids=["plain", "interrupted"])
def test_step_started_ends_the_current_step(interrupted: bool) -> None:
    s = EventStream("r")
    _step(s, "a")
    s.step_decided("a", Decision.tool_call("read", b"{}"))
    if interrupted:
        s.step_interrupted("a")
    mapper = SpanMapper()
    assert mapper.map_all(s.events) == []
    nxt = s.step_started("b", 1)
    (ended,) = mapper.map(nxt)
    assert ended.name == "agentrt.step"
    assert ended.span_id == span_id("step", "a")
    assert ended.end_ns == ns(nxt)
    assert ended.attributes["agentrt.step.end"] == "step.started"
    assert ended.status_code is StatusCode.UNSET
    if interrupted:
        assert ended.attributes["agentrt.step.status"] == "interrupted"
    else:
        assert "agentrt.step.status" not in ended.attributes
    # b is now the current step: it is the one run.finished ends.
    (b, run) = mapper.map(s.run_finished("COMPLETED", "goal_completed"))
    assert (b.span_id, b.attributes["agentrt.step.index"]) == (span_id("step", "b"), 1)
    assert b.start_ns == ns(nxt)


@pytest.mark.parametrize("payload", [b'{"index":9}', CAP], ids=["plain", "capped"])
def test_step_started_for_the_open_step_changes_nothing(payload: bytes) -> None:
    s = EventStream("r")
    _step(s)
    first = s.events[-1]
    s.step_decided("s", Decision.tool_call("read", b"{}"))
    mapper = SpanMapper()
    mapper.map_all(s.events)
    assert mapper.map(s.emit("step.started", payload, "s")) == []
    assert mapper.open_spans == 2
    (step, _) = mapper.map(s.run_finished("COMPLETED", "goal_completed"))
    assert step.start_ns == ns(first)
    assert step.attributes["agentrt.step.index"] == 0
    assert step.attributes["agentrt.step.end"] == "run.finished"
    assert T not in step.attributes
    assert event_names(step) == ["step.decided"]


# -- step.decided, step.tool_finished, step.failed --------------------------

def test_step_decided_records_invalid_args_invalid_result_and_invalid_base64() -> None:
    s = EventStream("r")
    _step(s)
    s.step_decided("s", replace(Decision.complete(b'{"x":1}'), invalid_args="x" * 50,
                                invalid_result="y" * 50, invalid_base64=True))
    s.run_finished("COMPLETED", "goal_completed")
    whole = one(spans_of(s), "agentrt.step").attributes
    assert whole["agentrt.decision.invalid_args"] == "x" * 50
    assert whole["agentrt.decision.invalid_result"] == "y" * 50
    assert whole["agentrt.decision.invalid_base64"] is True
    cut = one(spans_of(s, SpanMapper(max_text=16)), "agentrt.step").attributes
    assert cut["agentrt.decision.invalid_args"] == "x" * 16 + "…[truncated: 50 bytes]"
    assert cut["agentrt.decision.invalid_result"] == "y" * 16 + "…[truncated: 50 bytes]"


def test_invalid_base64_is_absent_unless_true() -> None:
    s = EventStream("r")
    _step(s)
    s.emit("step.decided", b'{"kind":"complete","invalid_base64":false}', "s")
    s.run_finished("COMPLETED", "goal_completed")
    assert "agentrt.decision.invalid_base64" not in one(spans_of(s), "agentrt.step").attributes


def test_tool_finished_records_its_duration() -> None:
    s = EventStream("r")
    _step(s)
    s.tool_started("s", "read")
    s.tool_finished("s", "read", 3, "read it")
    s.run_finished("COMPLETED", "goal_completed")
    assert one(spans_of(s), "agentrt.step").attributes["agentrt.tool.duration_ms"] == 3


def test_a_tool_result_for_a_step_not_seen_starts_it_at_the_implied_tool_start() -> None:
    s = EventStream("r")
    s.run_created()
    done = s.tool_finished("x", "read", 3000, "read it")
    s.run_finished("COMPLETED", "goal_completed")
    step = one(spans_of(s), "agentrt.step")
    assert (step.start_ns, step.end_ns) == (ns(done) - 3000 * MS, ns(done))
    assert "agentrt.span.start_unknown" not in step.attributes
    assert step.attributes["agentrt.tool.duration_ms"] == 3000


def test_the_late_tool_span_starts_exactly_duration_ms_before_its_event() -> None:
    s = EventStream("r")
    _step(s)
    s.tool_started("s", "block")
    s.run_finished("CANCELLED", "operator_cancelled", "changed my mind", by="operator")
    late_event = s.tool_finished("s", "block", 5, "finished after cancel", late=True)
    late = one(spans_of(s), "agentrt.tool.late")
    assert late.start_ns == ns(late_event) - 5 * MS
    assert late.end_ns == ns(late_event)
    assert late.attributes["agentrt.tool.duration_ms"] == 5


def test_step_failed_records_its_detail_and_content_hash() -> None:
    s = EventStream("r")
    _step(s)
    s.step_failed("s", "no such file: /etc/x", "tool_error", content_hash="cd" * 32)
    s.run_finished("FAILED", "goal_failed")
    step = one(spans_of(s), "agentrt.step")
    assert step.attributes["agentrt.step.detail"] == "no such file: /etc/x"
    assert step.attributes["agentrt.step.content_hash"] == "cd" * 32
    cut = one(spans_of(s, SpanMapper(max_text=6)), "agentrt.step")
    assert cut.attributes["agentrt.step.detail"] == "no suc…[truncated: 20 bytes]"
    assert cut.attributes["agentrt.step.content_hash"] == "cd" * 32  # a hash is never cut


# -- approvals ----------------------------------------------------------------

def test_the_approval_span_records_the_capability_and_spans_the_wait_exactly() -> None:
    s = EventStream("r")
    _step(s)
    requested = s.approval_requested("s", "a", "remote_mutation", "needs a person")
    decided = s.approval_decided("s", "a", "approved", "operator", "looks right")
    s.run_finished("COMPLETED", "goal_completed")
    approval = one(spans_of(s), "agentrt.approval")
    assert (approval.start_ns, approval.end_ns) == (ns(requested), ns(decided))
    assert approval.attributes["agentrt.approval.capability"] == '{"args":{},"tool":"publish"}'
    assert approval.attributes["agentrt.approval.hash"] == HASH
    cut = one(spans_of(s, SpanMapper(max_text=10)), "agentrt.approval")
    assert cut.attributes["agentrt.approval.capability"] == (
        '{"args":{}…[truncated: 28 bytes]')


# -- model calls --------------------------------------------------------------

@pytest.mark.parametrize("usage", [b"", b',"usage":{}', b',"usage":{"input_tokens":7}'],
                         ids=["no-usage", "empty-usage", "input-only"])
@pytest.mark.parametrize("type_", ["model.completed", "model.failed"])
def test_token_attributes_default_to_zero(type_: str, usage: bytes) -> None:
    s = EventStream("r")
    _step(s)
    dispatched = s.model_dispatched("s", "c", 1)
    status = b"ok" if type_ == "model.completed" else b"error"
    result = s.emit(type_, b'{"call_id":"c","attempt":1,"status":"' + status + b'"' + usage
                    + b"}", "s")
    s.run_finished("COMPLETED", "goal_completed")
    model = one(spans_of(s), "agentrt.model")
    tokens = {k: model.attributes[k] for k in (
        "agentrt.model.input_tokens", "agentrt.model.output_tokens",
        "agentrt.model.cached_input_tokens")}
    assert tokens == {"agentrt.model.input_tokens": 7 if b"input" in usage else 0,
                      "agentrt.model.output_tokens": 0,
                      "agentrt.model.cached_input_tokens": 0}
    assert (model.start_ns, model.end_ns) == (ns(dispatched), ns(result))


def test_an_ambiguous_attempt_is_an_error_span_named_by_its_status() -> None:
    s = EventStream("r")
    _step(s)
    dispatched = s.model_dispatched("s", "c", 1)
    result = s.model_result("s", "c", 1, "ambiguous", (10, 0, 0), 30, latency_ms=1,
                            error="connection reset after send")
    s.run_finished("COMPLETED", "goal_completed")
    model = one(spans_of(s), "agentrt.model")
    assert result.type == "model.failed"
    assert model.kind is SpanKind.CLIENT
    assert (model.status_code, model.status_description) == (StatusCode.ERROR, "ambiguous")
    a = model.attributes
    assert (a["agentrt.model.status"], a["agentrt.model.error"],
            a["agentrt.model.input_tokens"], a["agentrt.model.cost_micros"]) == (
        "ambiguous", "connection reset after send", 10, 30)
    assert (model.start_ns, model.end_ns) == (ns(dispatched), ns(result))


@pytest.mark.parametrize("status", ["ok", "error"])
def test_a_model_result_without_its_dispatch_spans_its_latency_and_ends_at_its_time(
    status: str,
) -> None:
    s = EventStream("r")
    _step(s)
    result = s.model_result("s", "c", 2, status, latency_ms=1500)
    s.run_finished("COMPLETED", "goal_completed")
    model = one(spans_of(s), "agentrt.model")
    assert (model.start_ns, model.end_ns) == (ns(result) - 1500 * MS, ns(result))
    assert "agentrt.span.start_unknown" not in model.attributes
    assert model.attributes["agentrt.model.attempt"] == 2


# -- run.finished of a cancelled run ------------------------------------------

def test_the_run_cancelled_event_carries_the_reason_by_and_detail() -> None:
    s = EventStream("r")
    s.run_created()
    s.run_finished("CANCELLED", "operator_cancelled", "changed my mind", steps=0,
                   by="operator")
    run = one(spans_of(s), "agentrt.run")
    assert an_event(run, "run.cancelled") == {"agentrt.run.reason": "operator_cancelled",
                                              "agentrt.run.by": "operator",
                                              "agentrt.run.detail": "changed my mind"}
    assert run.status_code is StatusCode.UNSET
    cut = one(spans_of(s, SpanMapper(max_text=7)), "agentrt.run")
    assert an_event(cut, "run.cancelled")["agentrt.run.detail"] == (
        "changed…[truncated: 15 bytes]")
    assert cut.attributes["agentrt.run.detail"] == "changed…[truncated: 15 bytes]"


# -- agentrt.payload.truncated ------------------------------------------------

def _ctx_none(s: EventStream) -> None:
    pass


def _ctx_run(s: EventStream) -> None:
    s.run_created("goal")


def _ctx_step(s: EventStream) -> None:
    _step(s)


def _ctx_approval(s: EventStream) -> None:
    _step(s)
    s.approval_requested("s", "", "remote_mutation")  # the id a capped payload reads as


def _ctx_model(s: EventStream) -> None:
    _step(s)
    s.model_dispatched("s", "", 1)  # the call id a capped payload reads as


def _ctx_cancelled(s: EventStream) -> None:
    _step(s)
    s.run_finished("CANCELLED", "operator_cancelled", by="operator")


LATE_CAP = CAP[:-1] + b',"late":true}'
#: (case, context, event type, payload, where the attribute must be and nowhere else:
#: a span name, or "span name/event name" for a span event)
TRUNCATED_CASES: list[tuple[str, Callable[[EventStream], None], str, bytes, list[str]]] = [
    ("run.created", _ctx_none, "run.created", CAP, ["agentrt.run"]),
    ("run.started", _ctx_run, "run.started", CAP, []),
    ("run.resumed", _ctx_run, "run.resumed", CAP, ["agentrt.run/run.resumed"]),
    ("lease.taken_over", _ctx_run, "lease.taken_over", CAP, ["agentrt.run/lease.taken_over"]),
    ("limit.exceeded", _ctx_run, "limit.exceeded", CAP, ["agentrt.run/limit.exceeded"]),
    ("loop.detected", _ctx_run, "loop.detected", CAP, ["agentrt.run/loop.detected"]),
    ("step.started", _ctx_run, "step.started", CAP, ["agentrt.step"]),
    ("step.decided", _ctx_step, "step.decided", CAP, ["agentrt.step"]),
    ("step.policy", _ctx_step, "step.policy", CAP, ["agentrt.step"]),
    ("step.tool_started", _ctx_step, "step.tool_started", CAP, ["agentrt.step"]),
    ("step.tool_finished", _ctx_step, "step.tool_finished", CAP, ["agentrt.step"]),
    ("step.failed", _ctx_step, "step.failed", CAP, ["agentrt.step"]),
    ("step.interrupted", _ctx_step, "step.interrupted", CAP,
     ["agentrt.step/step.interrupted"]),
    ("approval.requested", _ctx_step, "approval.requested", CAP, ["agentrt.approval"]),
    ("approval.decided", _ctx_approval, "approval.decided", CAP, ["agentrt.approval"]),
    ("model.dispatched", _ctx_step, "model.dispatched", CAP, ["agentrt.model"]),
    ("model.completed", _ctx_model, "model.completed", CAP, ["agentrt.model"]),
    ("model.failed", _ctx_model, "model.failed", CAP, ["agentrt.model"]),
    ("run.finished", _ctx_run, "run.finished", CAP, ["agentrt.run"]),
    ("late-tool", _ctx_cancelled, "step.tool_finished", LATE_CAP, ["agentrt.tool.late"]),
    ("unknown-type", _ctx_run, "future.event", CAP, ["agentrt.run/future.event"]),
]


def _truncated_places(spans: list[SpanRecord]) -> list[str]:
    where = []
    for sp in spans:
        if T in sp.attributes:
            assert sp.attributes[T] == 99999
            where.append(sp.name)
        for e in sp.events:
            if T in e.attributes:
                assert e.attributes[T] == 99999
                where.append(f"{sp.name}/{e.name}")
    return sorted(where)


def test_the_truncated_cases_cover_every_event_type() -> None:
    assert {c[2] for c in TRUNCATED_CASES} >= set(ALL_EVENT_TYPES)


@pytest.mark.parametrize(("context", "type_", "payload", "expected"),
                         [c[1:] for c in TRUNCATED_CASES], ids=[c[0] for c in TRUNCATED_CASES])
def test_a_capped_payload_is_recorded_where_the_spec_places_it(
    context: Callable[[EventStream], None], type_: str, payload: bytes, expected: list[str],
) -> None:
    s = EventStream("r")
    context(s)
    s.emit(type_, payload, "" if type_.startswith(("run.", "lease.", "limit.", "loop.",
                                                    "future.")) else "s")
    if type_ != "run.finished" and context is not _ctx_cancelled:
        s.run_finished("COMPLETED", "goal_completed")
    mapper = SpanMapper()
    spans = spans_of(s, mapper)
    assert mapper.open_spans == 0
    assert _truncated_places(spans) == sorted(expected)


def _ctx_run_started(s: EventStream) -> None:
    s.run_created("goal")
    s.run_started()


#: A capped start event for a span that is already open starts nothing, so it
#: records nothing (run.created ignored; step.started stops; approval.requested
#: only adds its step event; model.dispatched does nothing).
IGNORED_CASES: list[tuple[str, Callable[[EventStream], None], str]] = [
    ("run.created", _ctx_run_started, "run.created"),
    ("step.started", _ctx_step, "step.started"),
    ("approval.requested", _ctx_approval, "approval.requested"),
    ("model.dispatched", _ctx_model, "model.dispatched"),
]


@pytest.mark.parametrize(("context", "type_"), [c[1:] for c in IGNORED_CASES],
                         ids=[c[0] for c in IGNORED_CASES])
def test_a_capped_start_event_for_an_open_span_records_nothing(
    context: Callable[[EventStream], None], type_: str,
) -> None:
    s = EventStream("r")
    context(s)
    s.emit(type_, CAP, "" if type_ == "run.created" else "s")
    s.run_finished("COMPLETED", "goal_completed")
    spans = spans_of(s)
    assert _truncated_places(spans) == []
    assert len(named(spans, "agentrt.run")) == 1
    assert len(named(spans, "agentrt.step")) == (0 if type_ == "run.created" else 1)


# -- TestExporter_DecisionOrigin, first half ----------------------------------

def test_exporter_decision_origin_hand_fed_operator_decision() -> None:
    events = [
        raw_event(1, "run.created", b'{"goal":"g"}'),
        raw_event(2, "step.started", b'{"index":0}', "s"),
        raw_event(3, "step.decided",
                  b'{"kind":"complete","result":{"ok":true},"origin":"operator"}', "s"),
        raw_event(4, "run.finished", b'{"status":"COMPLETED","reason":"goal_completed"}'),
    ]
    spans = SpanMapper().map_all(events)
    step = one(spans, "agentrt.step")
    assert step.attributes["agentrt.decision.origin"] == "operator"
    assert step.attributes["agentrt.decision.kind"] == "complete"
    assert "agentrt.decision.origin" not in one(spans, "agentrt.run").attributes


# -- ExampleFollower ------------------------------------------------------------

def test_example_follower_prints_the_seq_and_type_of_every_event() -> None:
    store = agentrt.open_store(":memory:")
    try:
        agent = ScriptedAgent([Decision.tool_call("echo", '{"text":"hi"}'),
                               Decision.complete('{"done":true}')])
        run = Driver(store, agent, DefaultPolicy(), [static_tool("echo")]).start(
            "echo once", Limits(max_steps=10, max_consecutive_tool_failures=3,
                                loop_threshold=3))
        assert (run.status, run.reason) == ("COMPLETED", "goal_completed")
        out = io.BytesIO()
        Follower(store, once=True).follow(JSONLSink(out))
    finally:
        store.close()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["seq"], r["type"]) for r in records] == [
        (1, "run.created"), (2, "run.started"), (3, "step.started"), (4, "step.decided"),
        (5, "step.policy"), (6, "step.tool_started"), (7, "step.tool_finished"),
        (8, "step.started"), (9, "step.decided"), (10, "run.finished"),
    ]
    assert {r["run_id"] for r in records} == {run.id}
