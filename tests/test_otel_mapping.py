"""The event-to-span mapping, event type by event type (spec 3.4, 3.5)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.trace import SpanKind, StatusCode
from span_helpers import an_event, named, one, spans_of

from agentrt.events import ALL_EVENT_TYPES, Event
from agentrt.records import Decision, PolicyDecision, default_limits
from agentrt_otel import SPAN_NAMES, SpanMapper, SpanRecord, span_id, trace_id
from agentrt_otel.testing import EventStream


def raw_event(seq: int, type_: str, payload: bytes, run_id: str = "r", step_id: str = "",
              at: datetime | None = None) -> Event:
    return Event(seq, run_id, step_id, at or datetime(2026, 1, 1, tzinfo=UTC), type_, payload)


# -- every event type has its own mapping -----------------------------------

def test_the_mapper_has_a_specific_handler_for_every_runtime_event_type() -> None:
    assert SpanMapper().handled_types == frozenset(ALL_EVENT_TYPES)
    assert len(ALL_EVENT_TYPES) == 19


def _step_context(s: EventStream) -> None:
    s.run_created("goal")
    s.run_started()
    s.step_started("s", 0)


def _approval_context(s: EventStream) -> None:
    _step_context(s)
    s.step_decided("s", Decision.tool_call("publish", b"{}"))
    s.approval_requested("s", "a", "remote_mutation", "needs a person")


def _model_context(s: EventStream) -> None:
    _step_context(s)
    s.model_dispatched("s", "c", 1)


def _check_run_created(spans: list[SpanRecord]) -> None:
    run = one(spans, "agentrt.run")
    assert run.attributes["agentrt.run.goal"] == "goal"
    assert run.attributes["agentrt.limits.max_steps"] == 50
    assert "agentrt.span.start_unknown" not in run.attributes


def _run_event_check(name: str, **attrs: object) -> Callable[[list[SpanRecord]], None]:
    def check(spans: list[SpanRecord]) -> None:
        got = an_event(one(spans, "agentrt.run"), name)
        for key, value in attrs.items():
            assert got[key] == value
        assert not named(spans, "agentrt.event")
    return check


def _step_check(**attrs: object) -> Callable[[list[SpanRecord]], None]:
    def check(spans: list[SpanRecord]) -> None:
        step = one(spans, "agentrt.step")
        for key, value in attrs.items():
            assert step.attributes.get(key) == value, key
    return check


def _check_step_event(name: str, **attrs: object) -> Callable[[list[SpanRecord]], None]:
    def check(spans: list[SpanRecord]) -> None:
        got = an_event(one(spans, "agentrt.step"), name)
        for key, value in attrs.items():
            assert got[key] == value
    return check


def _check_failed(spans: list[SpanRecord]) -> None:
    step = one(spans, "agentrt.step")
    assert step.status_code is StatusCode.ERROR
    assert step.status_description == "policy_denied"
    assert step.attributes["agentrt.step.status"] == "failed"
    assert step.attributes["agentrt.step.end"] == "step.failed"


def _check_approval_open(spans: list[SpanRecord]) -> None:
    approval = one(spans, "agentrt.approval")  # closed by run.finished as pending
    assert approval.attributes["agentrt.approval.status"] == "pending"
    assert approval.attributes["agentrt.approval.reason"] == "needs a person"
    assert approval.parent_span_id == span_id("step", "s")
    assert an_event(one(spans, "agentrt.step"), "approval.requested") == {
        "agentrt.approval.id": "a", "agentrt.approval.kind": "remote_mutation"}


def _check_approval_decided(spans: list[SpanRecord]) -> None:
    approval = one(spans, "agentrt.approval")
    assert approval.attributes["agentrt.approval.status"] == "approved"
    assert approval.attributes["agentrt.approval.by"] == "op"
    assert approval.end_ns < one(spans, "agentrt.run").end_ns


def _check_model_open(spans: list[SpanRecord]) -> None:
    model = one(spans, "agentrt.model")
    assert model.kind is SpanKind.CLIENT
    assert model.attributes["agentrt.model.status"] == "unknown"  # cut off by the run's end
    assert model.attributes["agentrt.model.attempt"] == 1


def _check_model(status: StatusCode) -> Callable[[list[SpanRecord]], None]:
    def check(spans: list[SpanRecord]) -> None:
        model = one(spans, "agentrt.model")
        assert model.status_code is status
        assert model.attributes["agentrt.model.input_tokens"] == 3
        assert model.attributes["agentrt.model.cost_micros"] == 9
    return check


def _check_run_finished(spans: list[SpanRecord]) -> None:
    run = one(spans, "agentrt.run")
    assert run.attributes["agentrt.run.status"] == "COMPLETED"
    assert run.status_code is StatusCode.OK


# (event type, context before it, the event, what it must have done)
CASES: list[tuple[str, Callable[[EventStream], object], Callable[[EventStream], object],
                  Callable[[list[SpanRecord]], None]]] = [
    ("run.created", lambda s: None, lambda s: s.run_created("goal"), _check_run_created),
    ("run.started", lambda s: s.run_created(), lambda s: s.run_started(),
     _run_event_check("run.started")),
    ("run.resumed", lambda s: s.run_created(), lambda s: s.run_resumed("s", approval_id="a"),
     _run_event_check("run.resumed", **{"agentrt.approval.id": "a"})),
    ("lease.taken_over", lambda s: s.run_created(), lambda s: s.lease_taken_over("old", "new"),
     _run_event_check("lease.taken_over", **{"agentrt.lease.previous_owner": "old",
                                             "agentrt.lease.owner": "new"})),
    ("limit.exceeded", lambda s: s.run_created(), lambda s: s.limit_exceeded("limit_steps", "d"),
     _run_event_check("limit.exceeded", **{"agentrt.limit.reason": "limit_steps"})),
    ("loop.detected", lambda s: s.run_created(), lambda s: s.loop_detected(2, "read"),
     _run_event_check("loop.detected", **{"agentrt.loop.repeats": 2})),
    ("step.started", lambda s: s.run_created(), lambda s: s.step_started("s", 7),
     _step_check(**{"agentrt.step.index": 7, "agentrt.step.end": "run.finished"})),
    ("step.decided", _step_context,
     lambda s: s.step_decided("s", Decision.tool_call("read", b'{"n":1}')),
     _step_check(**{"agentrt.decision.kind": "tool_call", "agentrt.decision.args": '{"n":1}'})),
    ("step.policy", _step_context, lambda s: s.step_policy("s", PolicyDecision.allow("ok")),
     _step_check(**{"agentrt.policy.outcome": "allow", "agentrt.policy.reason": "ok"})),
    ("step.tool_started", _step_context, lambda s: s.tool_started("s", "read"),
     _step_check(**{"agentrt.tool.name": "read"})),
    ("step.tool_finished", _step_context, lambda s: s.tool_finished("s", "read", 2, "read it"),
     _step_check(**{"agentrt.step.status": "done", "agentrt.tool.summary": "read it",
                    "agentrt.step.end": "step.tool_finished"})),
    ("step.failed", _step_context, lambda s: s.step_failed("s", "denied", "policy_denied"),
     _check_failed),
    ("step.interrupted", _step_context, lambda s: s.step_interrupted("s"),
     _check_step_event("step.interrupted", **{"agentrt.step.previous_status": "executing"})),
    ("approval.requested", _step_context,
     lambda s: s.approval_requested("s", "a", "remote_mutation", "needs a person"),
     _check_approval_open),
    ("approval.decided", _approval_context,
     lambda s: s.approval_decided("s", "a", "approved", "op", "fine"), _check_approval_decided),
    ("model.dispatched", _step_context, lambda s: s.model_dispatched("s", "c", 1),
     _check_model_open),
    ("model.completed", _model_context,
     lambda s: s.model_result("s", "c", 1, "ok", (3, 4, 0), 9), _check_model(StatusCode.UNSET)),
    ("model.failed", _model_context,
     lambda s: s.model_result("s", "c", 1, "error", (3, 4, 0), 9, error="boom"),
     _check_model(StatusCode.ERROR)),
    ("run.finished", lambda s: s.run_created(), lambda s: None, _check_run_finished),
]


def test_the_case_table_covers_every_event_type() -> None:
    assert sorted(c[0] for c in CASES) == sorted(ALL_EVENT_TYPES)


@pytest.mark.parametrize(("type_", "context", "act", "check"), CASES,
                         ids=[c[0] for c in CASES])
def test_each_event_type_has_its_specific_effect(
    type_: str,
    context: Callable[[EventStream], object],
    act: Callable[[EventStream], object],
    check: Callable[[list[SpanRecord]], None],
) -> None:
    s = EventStream("r")
    context(s)
    act(s)
    s.run_finished("COMPLETED", "goal_completed", steps=1)
    assert type_ in {e.type for e in s.events}
    spans = spans_of(s)
    check(spans)
    assert not named(spans, "agentrt.event")


# -- run spans, limits and payload decoding ---------------------------------

def test_limits_map_to_attributes_with_durations_in_whole_milliseconds() -> None:
    s = EventStream("r")
    s.run_created("g", replace(default_limits(), max_model_calls=4,
                               approval_ttl=timedelta(seconds=60, microseconds=999)))
    s.run_finished("COMPLETED", "goal_completed")
    attrs = one(spans_of(s), "agentrt.run").attributes
    assert attrs["agentrt.limits.max_model_calls"] == 4
    assert attrs["agentrt.limits.approval_ttl_ms"] == 60000
    assert attrs["agentrt.limits.loop_threshold"] == 3
    assert "agentrt.limits.grant_ttl_ms" not in attrs
    assert "agentrt.limits.max_total_tokens" not in attrs


@pytest.mark.parametrize("limits", [b'{"max_steps":1.0}', b'{"max_steps":"5"}', b'"x"',
                                    b'{"max_steps":true}', b"[1]"])
def test_limits_of_a_wrong_type_anywhere_give_no_limit_attributes(limits: bytes) -> None:
    mapper = SpanMapper()
    mapper.map(raw_event(1, "run.created", b'{"goal":"g","limits":' + limits + b"}"))
    (run,) = mapper.map(raw_event(2, "run.finished", b'{"status":"COMPLETED"}'))
    assert not [k for k in run.attributes if k.startswith("agentrt.limits.")]
    assert run.attributes["agentrt.run.goal"] == "g"


def test_null_limits_decode_as_zero_and_absent_limits_as_nothing() -> None:
    mapper = SpanMapper()
    mapper.map(raw_event(1, "run.created", b'{"limits":null}'))
    (run,) = mapper.map(raw_event(2, "run.finished", b"{}"))
    assert run.attributes["agentrt.limits.max_steps"] == 0
    mapper.map(raw_event(3, "run.created", b"{}", run_id="r2"))
    (run2,) = mapper.map(raw_event(4, "run.finished", b"{}", run_id="r2"))
    assert not [k for k in run2.attributes if k.startswith("agentrt.limits.")]
    assert run2.attributes["agentrt.run.status"] == ""  # always set, even empty


@pytest.mark.parametrize(("raw", "expected"), [
    (b"7", 7), (b"-3", -3), (b"1.0", None), (b"1e3", None), (b'"5"', None),
    (b"9223372036854775808", None), (b"null", None), (b"true", None),
])
def test_integer_attributes_need_a_base_10_int64(raw: bytes, expected: int | None) -> None:
    mapper = SpanMapper()
    mapper.map(raw_event(1, "step.started", b'{"index":' + raw + b"}", step_id="s"))
    (step, _) = mapper.map(raw_event(2, "run.finished", b'{"status":"COMPLETED"}'))
    assert step.attributes.get("agentrt.step.index") == expected


def test_string_attributes_show_other_json_values_as_their_text() -> None:
    mapper = SpanMapper()
    mapper.map(raw_event(1, "step.started", b'{"index":0}', step_id="s"))
    mapper.map(raw_event(2, "step.decided",
                         b'{"kind":"tool_call","tool":"t","args":{"a": "\\u003c", "n": 1.50},'
                         b'"result":null,"invalid_base64":"true","origin":"operator"}',
                         step_id="s"))
    (step, _) = mapper.map(raw_event(3, "run.finished", b'{"status":"COMPLETED"}'))
    assert step.attributes["agentrt.decision.args"] == '{"a": "\\u003c", "n": 1.50}'
    assert "agentrt.decision.result" not in step.attributes  # null reads as ""
    assert "agentrt.decision.invalid_base64" not in step.attributes  # only exactly true
    assert step.attributes["agentrt.decision.origin"] == "operator"


def test_a_payload_that_does_not_decode_still_does_the_bookkeeping() -> None:
    mapper = SpanMapper()
    mapper.map(raw_event(1, "run.created", b"not json"))
    mapper.map(raw_event(2, "step.started", b"[]", step_id="s"))
    spans = mapper.map(raw_event(3, "run.finished", b'{"status":'))
    assert [s.name for s in spans] == ["agentrt.step", "agentrt.run"]
    assert spans[1].attributes["agentrt.run.status"] == ""
    assert mapper.open_runs == 0


def test_a_capped_payload_is_recorded_and_an_unknown_type_after_the_end_gets_its_own_span(
) -> None:
    mapper = SpanMapper()
    capped = b'{"truncated":true,"length":99999,"head":"{\\"goal\\":\\"gggg"}'
    assert mapper.map(raw_event(1, "run.created", capped)) == []
    (run,) = mapper.map(raw_event(2, "run.finished", b'{"status":"COMPLETED"}'))
    (late,) = mapper.map(raw_event(3, "future.event", b"not json"))
    assert run.attributes["agentrt.payload.truncated"] == 99999
    assert run.status_code is StatusCode.OK
    assert "agentrt.run.goal" not in run.attributes
    assert late.name == "agentrt.event"
    assert late.attributes["agentrt.event.type"] == "future.event"
    assert late.attributes["agentrt.event.seq"] == 3
    assert late.parent_span_id == span_id("run", "r")
    assert late.span_id == span_id("event", "3")
    assert late.start_ns == late.end_ns


def test_an_unknown_type_is_an_event_on_an_open_run_span() -> None:
    mapper = SpanMapper()
    mapper.map(raw_event(1, "run.created", b"{}"))
    assert mapper.map(raw_event(2, "future.event",
                                b'{"truncated":true,"length":70000,"head":""}')) == []
    (run,) = mapper.map(raw_event(3, "run.finished", b"{}"))
    assert an_event(run, "future.event") == {"agentrt.payload.truncated": 70000}


def test_an_operator_decision_records_its_origin() -> None:
    s = EventStream("r")
    s.run_created()
    s.step_started("s", 0)
    s.step_decided("s", Decision.complete(b"{}", origin="operator"))
    s.run_finished("COMPLETED", "goal_completed", steps=1)
    step = one(spans_of(s), "agentrt.step")
    assert step.attributes["agentrt.decision.origin"] == "operator"
    assert step.attributes["agentrt.decision.kind"] == "complete"


def test_a_tool_error_leaves_the_step_for_step_failed_to_end() -> None:
    s = EventStream("r")
    _step_context(s)
    s.tool_started("s", "read")
    assert spans_of(s) == []
    mapper = SpanMapper()
    mapper.map_all(s.events)
    assert mapper.map(s.tool_finished("s", "read", 4, error="read timeout: slow")) == []
    (step,) = mapper.map(s.step_failed("s", "read timeout: slow", "tool_error"))
    assert step.attributes["agentrt.tool.error"] == "read timeout: slow"
    assert step.attributes["agentrt.step.status"] == "failed"
    assert step.status_description == "tool_error"


def test_step_interrupted_reads_the_nested_or_the_plain_previous_status() -> None:
    mapper = SpanMapper()
    mapper.map(raw_event(1, "step.started", b"{}", step_id="s"))
    mapper.map(raw_event(2, "step.interrupted", b'{"previous_status":"deciding"}', step_id="s"))
    mapper.map(raw_event(3, "step.interrupted", b"{}", step_id="s"))
    (step, _) = mapper.map(raw_event(4, "run.finished", b"{}"))
    values = [e.attributes["agentrt.step.previous_status"] for e in step.events]
    assert values == ["deciding", ""]
    assert step.attributes["agentrt.step.status"] == "interrupted"


def test_the_run_span_is_the_root_and_children_have_derived_parents() -> None:
    s = EventStream("run-1")
    _approval_context(s)
    s.model_dispatched("s", "c", 1)
    s.run_finished("COMPLETED", "goal_completed")
    spans = spans_of(s)
    assert {sp.trace_id for sp in spans} == {trace_id("run-1")}
    run = one(spans, "agentrt.run")
    assert (run.span_id, run.parent_span_id) == (span_id("run", "run-1"), None)
    step = one(spans, "agentrt.step")
    assert (step.span_id, step.parent_span_id) == (span_id("step", "s"), run.span_id)
    assert one(spans, "agentrt.approval").span_id == span_id("approval", "a")
    assert one(spans, "agentrt.model").span_id == span_id("model", "c")
    for child in ("agentrt.approval", "agentrt.model"):
        assert one(spans, child).parent_span_id == step.span_id


# -- text cutting and attribute hygiene -------------------------------------

@pytest.mark.parametrize("max_text", [1024, 100])
def test_model_chosen_text_is_cut_and_nothing_names_a_span(max_text: int) -> None:
    s = EventStream("r")
    s.run_created("g" * 3000)
    s.step_started("s", 0)
    s.step_decided("s", Decision.tool_call("read", b"{}", reason="because " * 400))
    s.step_failed("s", "x" * 5000, "invalid_decision")
    s.step_started("t", 1)
    s.step_decided("t", Decision.fail("no " * 1000))
    s.run_finished("FAILED", "goal_failed", "no " * 1000)
    spans = spans_of(s, SpanMapper(max_text=max_text))
    run = one(spans, "agentrt.run")
    goal = run.attributes["agentrt.run.goal"]
    assert goal == "g" * max_text + "…[truncated: 3000 bytes]"
    assert len(str(goal).encode()) <= max_text + 40
    first, second = named(spans, "agentrt.step")
    assert "…[truncated: 3200 bytes]" in str(first.attributes["agentrt.decision.reason"])
    assert len(str(second.attributes["agentrt.decision.message"]).encode()) <= max_text + 40
    assert {sp.name for sp in spans} <= set(SPAN_NAMES)
    for sp in spans:
        for key, value in sp.attributes.items():
            assert key and value is not None
        for ev in sp.events:
            assert "." in ev.name and " " not in ev.name


def test_short_text_is_kept_whole() -> None:
    s = EventStream("r")
    s.run_created("publish with approval")
    s.run_finished("COMPLETED", "goal_completed")
    assert one(spans_of(s), "agentrt.run").attributes["agentrt.run.goal"] == (
        "publish with approval")


def test_ids_hashes_and_statuses_are_carried_whole_past_the_text_cap() -> None:
    run_id, step_id, call_id, approval_id = ("r" * 40, "s" * 40, "c" * 40, "a" * 40)
    long_hash = "f" * 64
    s = EventStream(run_id)
    s.run_created("g" * 100)
    s.step_started(step_id, 0)
    s.step_decided(step_id, Decision.tool_call("publish", b"{}"))
    s.model_dispatched(step_id, call_id, 1)
    s.model_result(step_id, call_id, 1)
    s.step_policy(step_id, PolicyDecision.need_approval("tool_approval", "r"),
                  policy_id="p" * 40, spec_hash=long_hash)
    s.approval_requested(step_id, approval_id, "tool_approval")
    s.approval_decided(step_id, approval_id, "approved", by="op")
    s.run_finished("COMPLETED", "goal_completed")
    spans = spans_of(s, SpanMapper(max_text=16))
    whole = {"agentrt.run.id": run_id, "agentrt.step.id": step_id,
             "agentrt.model.call_id": call_id, "agentrt.approval.id": approval_id,
             "agentrt.policy.id": "p" * 40, "agentrt.policy.spec_hash": long_hash}
    seen = {k: v for sp in spans for k, v in sp.attributes.items() if k in whole}
    assert seen == whole
    hashes = [v for sp in spans for k, v in sp.attributes.items() if k.endswith("hash")]
    assert hashes and all(len(str(h)) == 64 for h in hashes)
    statuses = [v for sp in spans for k, v in sp.attributes.items() if k.endswith("status")]
    assert "COMPLETED" in statuses and "approved" in statuses
    assert "…[truncated" in str(one(spans, "agentrt.run").attributes["agentrt.run.goal"])


# -- GenAI and OpenInference conventions ------------------------------------

def test_runs_tool_steps_and_model_calls_carry_the_genai_conventions() -> None:
    s = EventStream("r")
    s.run_created()
    s.step_started("s", 0)
    s.model_dispatched("s", "c", 1, model="claude")
    s.model_result("s", "c", 1, "ok", (10, 2, 0), model="claude")
    s.step_decided("s", Decision.tool_call("read", b"{}"))
    s.step_policy("s", PolicyDecision.allow())
    s.tool_started("s", "read")
    s.tool_finished("s", "read", 1, "ok")
    s.step_started("t", 1)
    s.step_decided("t", Decision.complete(b"{}"))
    s.run_finished("COMPLETED", "goal_completed")
    spans = spans_of(s)
    run = one(spans, "agentrt.run").attributes
    assert (run["gen_ai.operation.name"], run["gen_ai.conversation.id"],
            run["openinference.span.kind"]) == ("invoke_agent", "r", "AGENT")
    tool, other = named(spans, "agentrt.step")
    assert (tool.attributes["gen_ai.operation.name"], tool.attributes["gen_ai.tool.name"],
            tool.attributes["openinference.span.kind"]) == ("execute_tool", "read", "TOOL")
    assert other.attributes["openinference.span.kind"] == "CHAIN"
    assert "gen_ai.operation.name" not in other.attributes
    model = one(spans, "agentrt.model").attributes
    assert (model["gen_ai.operation.name"], model["gen_ai.request.model"],
            model["gen_ai.usage.input_tokens"], model["gen_ai.usage.output_tokens"],
            model["gen_ai.conversation.id"], model["openinference.span.kind"]) == (
        "chat", "claude", 10, 2, "r", "LLM")


def test_a_denied_tool_call_is_still_a_tool_step_and_approvals_are_guardrails() -> None:
    s = EventStream("r")
    _approval_context(s)
    s.approval_decided("s", "a", "rejected", "op", "no")
    s.run_finished("CANCELLED", "approval_rejected", "no")
    spans = spans_of(s)
    step = one(spans, "agentrt.step").attributes
    assert step["openinference.span.kind"] == "TOOL"
    assert step["gen_ai.tool.name"] == "publish"  # from the decision: the tool never ran
    assert one(spans, "agentrt.approval").attributes["openinference.span.kind"] == "GUARDRAIL"


# -- times OTLP cannot carry --------------------------------------------------

#: The latest time a stored event can hold (Python's datetime stops at 9999;
#: the nanoseconds are the Go reference's).
FAR_FUTURE = "9999-12-31T23:59:59.999999999Z"
#: The largest signed 64-bit count of nanoseconds: 2262-04-11T23:47:16.854775807Z.
LATEST_NS = 2**63 - 1


def _all_times(spans: list[SpanRecord]) -> list[int]:
    return [t for s in spans for t in (s.start_ns, s.end_ns, *(e.time_ns for e in s.events))]


def _send_everywhere(spans: list[SpanRecord]) -> str:
    """Encode ``spans`` as the OTLP exporters do and print them as the console
    exporter does; either raised on every attempt for a time out of range."""
    import io

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExportResult

    from agentrt_otel import build_resource, to_readable_spans

    ready = to_readable_spans(spans, build_resource({}))
    encode_spans(ready).SerializeToString()
    out = io.StringIO()
    assert ConsoleSpanExporter(out=out).export(ready) is SpanExportResult.SUCCESS
    return out.getvalue()


def test_an_event_dated_9999_maps_to_the_latest_time_otlp_carries_and_the_page_encodes(
) -> None:
    from agentrt_otel.testing import scenario_completed

    s = EventStream("r")
    scenario_completed(s)
    # Every event from the first step on is dated past what OTLP carries.
    first_step = next(i for i, e in enumerate(s.events) if e.type == "step.started")
    events = s.events[:first_step] + [e._replace(at=FAR_FUTURE) for e in s.events[first_step:]]
    assert events[-1].at.year == 9999
    spans = SpanMapper().map_all(events)
    run = one(spans, "agentrt.run")
    assert run.start_ns == 1_790_344_984_001_000_000  # 2026-09-25T14:03:04.001Z, its own
    assert run.end_ns == LATEST_NS
    assert {s.end_ns for s in named(spans, "agentrt.step")} == {LATEST_NS}
    assert max(_all_times(spans)) == LATEST_NS
    assert "2262-04-11T23:47:16" in _send_everywhere(spans)


def test_a_duration_or_latency_that_implies_a_start_out_of_range_is_clamped() -> None:
    s = EventStream("r")
    s.run_created()
    # Spans whose start was not seen start at the time the duration implies.
    s.tool_finished("s", "read", 2**63 - 1)  # before 1970: at 0
    s.model_result("t", "c", 1, latency_ms=2**63 - 1)
    s.emit("step.tool_finished", {"tool": "read", "duration_ms": -(2**63)}, "u")
    s.tool_finished("v", "read", 2**63 - 1, late=True)
    s.run_finished("COMPLETED", "goal_completed")
    spans = SpanMapper().map_all(s.events)
    steps = {sp.attributes["agentrt.step.id"]: sp for sp in named(spans, "agentrt.step")}
    assert steps["s"].start_ns == 0
    assert steps["u"].start_ns == steps["u"].end_ns  # implied after its end: at its end
    assert one(spans, "agentrt.model").start_ns == 0
    assert one(spans, "agentrt.tool.late").start_ns == 0
    assert min(_all_times(spans)) == 0 and max(_all_times(spans)) <= LATEST_NS
    _send_everywhere(spans)


# -- damaged rows found by tests/test_export_fuzz.py ------------------------------


def test_a_negative_tool_duration_never_starts_a_step_after_it_ends() -> None:
    mapper = SpanMapper()
    mapper.map(raw_event(1, "run.created", b"{}"))
    spans = mapper.map(raw_event(2, "step.tool_finished", b'{"duration_ms":-5000}',
                                 step_id="s"))
    step = one(spans, "agentrt.step")
    assert step.start_ns <= step.end_ns


def test_a_field_is_read_at_the_top_level_not_from_a_nested_object_with_its_key() -> None:
    mapper = SpanMapper()
    mapper.map(raw_event(1, "run.created", b"{}"))
    mapper.map(raw_event(2, "step.started", b'{"index":0}', step_id="s"))
    mapper.map(raw_event(3, "step.decided", b'{"kind":"tool_call", "args": [1E2], '
                         b'"n":{"args":[100.0]}}', step_id="s"))
    spans = mapper.map(raw_event(4, "run.finished", b'{"status":"COMPLETED"}'))
    step = one(spans, "agentrt.step")
    assert step.attributes["agentrt.decision.args"] == "[1E2]"  # the text Go would read


def test_a_deeply_nested_payload_reads_the_same_whatever_the_callers_stack_depth() -> None:
    """Python's scanner recurses once per level: past a bound the raw members
    are not read at all, rather than read or not by how deep the caller is (a
    replay runs a few frames deeper than the first pass)."""
    deep = b'{"kind":"tool_call","args":' + b"[" * 900 + b"]" * 900 + b"}"

    def args_read(extra_frames: int) -> object:
        if extra_frames:
            return args_read(extra_frames - 1)
        mapper = SpanMapper()
        mapper.map(raw_event(1, "run.created", b"{}"))
        mapper.map(raw_event(2, "step.started", b'{"index":0}', step_id="s"))
        mapper.map(raw_event(3, "step.decided", deep, step_id="s"))
        spans = mapper.map(raw_event(4, "run.finished", b'{"status":"COMPLETED"}'))
        return one(spans, "agentrt.step").attributes.get("agentrt.decision.args")

    assert args_read(0) == args_read(60) == args_read(200)


def test_a_run_id_is_written_to_the_log_escaped(caplog: pytest.LogCaptureFixture) -> None:
    class Failing:
        def list_events_after(self, run_id: str, seq: int, limit: int) -> list[Event]:
            raise OSError("disk gone")

    mapper = SpanMapper(Failing())
    with caplog.at_level("WARNING", logger="agentrt_otel"):
        mapper.map(raw_event(5, "step.started", b'{"index":0}', run_id="r\n\x1b[31mx",
                             step_id="s"))
    [message] = [r.getMessage() for r in caplog.records]
    assert "\n" not in message and "\x1b" not in message and "disk gone" in message
