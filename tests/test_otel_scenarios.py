"""The scenario shapes of spec 3.8, hand-fed: what an operator sees for each."""

from __future__ import annotations

from opentelemetry.trace import SpanKind, StatusCode

from agentrt.events import Event
from agentrt.records import Decision
from agentrt.timefmt import to_unix_nanos
from agentrt_otel import SpanMapper, SpanRecord, span_id, trace_id
from agentrt_otel.testing import (
    EventStream,
    scenario_cancelled,
    scenario_completed,
    scenario_crash_takeover,
    scenario_failed,
    scenario_limit,
    scenario_loop,
    scenario_model_retry,
    scenario_paused,
)


def run(scenario: object, run_id: str) -> tuple[EventStream, list[SpanRecord]]:
    s = EventStream(run_id)
    scenario(s)  # type: ignore[operator]
    mapper = SpanMapper()
    spans = mapper.map_all(s.events)
    assert mapper.open_runs == 0 and mapper.open_spans == 0
    assert {sp.trace_id for sp in spans} == {trace_id(run_id)}
    return s, spans


def ns(event: Event) -> int:
    return to_unix_nanos(event.at)


def named(spans: list[SpanRecord], name: str) -> list[SpanRecord]:
    return [s for s in spans if s.name == name]


def events(span: SpanRecord) -> list[str]:
    return [e.name for e in span.events]


def attrs_of(span: SpanRecord, event: str) -> dict[str, object]:
    (found,) = [e for e in span.events if e.name == event]
    return dict(found.attributes)


def test_a_completed_run_is_one_run_span_and_one_span_per_step() -> None:
    s, spans = run(scenario_completed, "completed")
    (run_span,) = named(spans, "agentrt.run")
    steps = named(spans, "agentrt.step")
    assert len(spans) == 6 and len(steps) == 5
    assert run_span.parent_span_id is None
    assert (run_span.start_ns, run_span.end_ns) == (ns(s.events[0]), ns(s.events[-1]))
    a = run_span.attributes
    assert (a["agentrt.run.status"], a["agentrt.run.reason"], a["agentrt.run.steps"]) == (
        "COMPLETED", "goal_completed", 5)
    assert run_span.status_code is StatusCode.OK
    assert (a["agentrt.limits.max_steps"], a["agentrt.limits.loop_threshold"]) == (10, 3)
    assert "agentrt.limits.max_model_calls" not in a
    for i, step in enumerate(steps):
        assert step.parent_span_id == run_span.span_id
        assert step.attributes["agentrt.step.index"] == i
        assert step.attributes["agentrt.run.id"] == "completed"
    s0, s1, s2, _, s4 = steps
    assert s0.attributes["agentrt.decision.tool"] == "read"
    assert s0.attributes["agentrt.decision.args"] == '{"n":1}'
    assert s0.attributes["agentrt.policy.outcome"] == "allow"
    assert s0.attributes["agentrt.tool.summary"] == "read done"
    assert (s0.attributes["agentrt.step.status"], s0.attributes["agentrt.step.end"]) == (
        "done", "step.tool_finished")
    assert len(str(s0.attributes["agentrt.tool.content_hash"])) == 64
    assert "agentrt.policy.id" not in s0.attributes
    assert events(s0) == ["step.decided", "step.policy", "step.tool_started"]
    assert s1.attributes["agentrt.step.observation"] == "invalid_decision"
    assert s1.status_code is StatusCode.ERROR
    assert "agentrt.policy.outcome" not in s1.attributes and "agentrt.tool.name" not in (
        s1.attributes)
    assert s2.attributes["agentrt.policy.outcome"] == "deny"
    assert s2.attributes["agentrt.step.observation"] == "policy_denied"
    assert s4.attributes["agentrt.decision.kind"] == "complete"
    assert s4.attributes["agentrt.decision.result"] == '{"done":true}'
    assert s4.attributes["agentrt.step.end"] == "run.finished"
    assert "agentrt.step.status" not in s4.attributes
    assert s4.end_ns == run_span.end_ns


def test_a_paused_and_approved_run_shows_the_wait_as_an_approval_span() -> None:
    _, spans = run(scenario_paused, "paused")
    (approval,) = named(spans, "agentrt.approval")
    steps = named(spans, "agentrt.step")
    publish = steps[1]
    assert approval.parent_span_id == publish.span_id == span_id("step", "p1")
    assert approval.span_id == span_id("approval", "a1")
    a = approval.attributes
    assert (a["agentrt.approval.status"], a["agentrt.approval.by"],
            a["agentrt.approval.note"]) == ("approved", "operator", "looks right")
    assert len(str(a["agentrt.approval.hash"])) == 64 and a["agentrt.approval.kind"]
    assert publish.attributes["agentrt.policy.kind"] == "remote_mutation"  # kept: accumulates
    assert publish.attributes["agentrt.step.status"] == "done"
    assert attrs_of(publish, "approval.requested")["agentrt.approval.id"] == "a1"
    assert attrs_of(publish, "step.tool_started")["agentrt.approval.id"] == "a1"
    assert approval.end_ns <= publish.end_ns
    (run_span,) = named(spans, "agentrt.run")
    assert attrs_of(run_span, "run.resumed")["agentrt.approval.id"] == "a1"


def test_a_crash_and_takeover_continue_the_same_trace_with_one_step_span() -> None:
    s, spans = run(scenario_crash_takeover, "interrupted-run")
    assert [e.type for e in s.events] == [
        "run.created", "run.started", "step.started", "step.decided", "step.policy",
        "step.tool_started", "lease.taken_over", "step.interrupted", "step.policy",
        "approval.requested", "approval.decided", "run.resumed", "step.policy",
        "step.tool_started", "step.tool_finished", "step.started", "step.decided",
        "run.finished"]
    (run_span,) = named(spans, "agentrt.run")
    lease = attrs_of(run_span, "lease.taken_over")
    assert str(lease["agentrt.lease.previous_owner"]).startswith("crasher")
    assert str(lease["agentrt.lease.owner"]).startswith("resumer")
    assert lease["agentrt.lease.previous_expires_at"]
    assert attrs_of(run_span, "run.resumed")["agentrt.approval.id"] == "a-crash"
    steps = named(spans, "agentrt.step")
    assert len(steps) == 2
    first = steps[0]
    assert attrs_of(first, "step.interrupted")["agentrt.step.previous_status"] == "executing"
    assert first.attributes["agentrt.step.status"] == "done"
    assert first.attributes["agentrt.tool.summary"] == "write done"
    assert first.attributes["agentrt.policy.kind"] == "interrupted_side_effect"
    (approval,) = named(spans, "agentrt.approval")
    assert approval.attributes["agentrt.approval.kind"] == "interrupted_side_effect"
    assert approval.attributes["agentrt.approval.status"] == "approved"
    assert "write" in str(approval.attributes["agentrt.approval.presentation"])
    assert run_span.attributes["agentrt.run.status"] == "COMPLETED"


def test_a_cancelled_run_ends_its_step_and_the_late_tool_result_is_its_own_span() -> None:
    s, spans = run(scenario_cancelled, "cancelled-run")
    assert s.events[-1].type == "step.tool_finished"
    (run_span,) = named(spans, "agentrt.run")
    a = run_span.attributes
    assert (a["agentrt.run.status"], a["agentrt.run.reason"], a["agentrt.run.by"],
            a["agentrt.run.detail"]) == ("CANCELLED", "operator_cancelled", "operator",
                                         "changed my mind")
    assert run_span.status_code is StatusCode.UNSET
    assert attrs_of(run_span, "run.cancelled")["agentrt.run.by"] == "operator"
    (step,) = named(spans, "agentrt.step")
    assert step.end_ns == run_span.end_ns
    assert step.attributes["agentrt.step.end"] == "run.finished"
    (late,) = named(spans, "agentrt.tool.late")
    assert late.parent_span_id == span_id("step", "k0")
    assert late.span_id == span_id("late", "k0")
    assert late.attributes["agentrt.tool.name"] == "block"
    assert late.attributes["agentrt.tool.summary"] == "finished after cancel"
    assert '"late":true' in str(late.attributes["agentrt.tool.observation"])
    assert late.start_ns <= late.end_ns and late.end_ns > run_span.end_ns
    assert late.end_ns == ns(s.events[-1])


def test_each_model_attempt_is_a_client_span_under_its_step() -> None:
    s, spans = run(scenario_model_retry, "model")
    models = named(spans, "agentrt.model")
    assert len(models) == 3 and len(named(spans, "agentrt.step")) == 2
    assert len(spans) == 6
    failed, retry, final = models
    assert failed.parent_span_id == retry.parent_span_id == span_id("step", "m0")
    assert final.parent_span_id == span_id("step", "m1")
    assert failed.kind is SpanKind.CLIENT
    assert (failed.status_code, failed.status_description) == (StatusCode.ERROR, "error")
    assert failed.attributes["agentrt.model.attempt"] == 1
    assert "429" in str(failed.attributes["agentrt.model.error"])
    assert failed.attributes["agentrt.model.name"] == "scripted-model"
    assert retry.status_code is StatusCode.UNSET
    r = retry.attributes
    assert (r["agentrt.model.status"], r["agentrt.model.attempt"],
            r["agentrt.model.input_tokens"], r["agentrt.model.output_tokens"],
            r["agentrt.model.cost_micros"]) == ("ok", 2, 100, 20, 200)
    assert final.attributes["agentrt.model.cached_input_tokens"] == 50
    assert retry.span_id == span_id("model", "call-2")
    dispatched = [e for e in s.events if e.type == "model.dispatched"]
    assert retry.start_ns == ns(dispatched[1])
    assert failed.end_ns < retry.start_ns  # the backoff gap lies between the attempts
    assert "agentrt.model.latency_ms" in r


def test_limit_loop_and_failure_end_the_run_as_errors_with_their_reasons() -> None:
    _, spans = run(scenario_limit, "limit")
    (limit,) = named(spans, "agentrt.run")
    assert attrs_of(limit, "limit.exceeded")["agentrt.limit.reason"] == "limit_steps"
    assert (limit.status_code, limit.status_description) == (StatusCode.ERROR, "limit_steps")
    assert "run.started" in events(limit)

    _, spans = run(scenario_loop, "loop")
    (loop,) = named(spans, "agentrt.run")
    detected = attrs_of(loop, "loop.detected")
    assert (detected["agentrt.loop.repeats"], detected["agentrt.loop.tool"]) == (2, "read")
    assert len(str(detected["agentrt.loop.args_hash"])) == 64
    assert len(str(detected["agentrt.loop.observation_hash"])) == 64
    assert "limit.exceeded" not in events(loop)
    assert loop.attributes["agentrt.run.reason"] == "loop_detected"

    _, spans = run(scenario_failed, "failed")
    (failed,) = named(spans, "agentrt.run")
    assert failed.attributes["agentrt.run.reason"] == "goal_failed"
    (step,) = named(spans, "agentrt.step")
    assert step.attributes["agentrt.decision.kind"] == "fail"
    assert str(step.attributes["agentrt.decision.message"]).startswith("no no")


def test_an_unfinished_run_exports_only_what_has_ended() -> None:
    s = EventStream("waiting")
    scenario_paused(s)
    cut = next(i for i, e in enumerate(s.events) if e.type == "approval.requested") + 1
    mapper = SpanMapper()
    spans = mapper.map_all(s.events[:cut])
    assert [sp.name for sp in spans] == ["agentrt.step"]  # only the finished read step
    assert mapper.open_runs == 1 and mapper.open_spans == 3  # run, step, approval


def test_the_reference_example_gives_the_pinned_ids() -> None:
    s = EventStream("run-1")
    s.run_created("read then finish")
    s.run_started()
    s.tool_step("step-1", 0, "read", summary="read it")
    s.step_started("step-2", 1)
    s.step_decided("step-2", Decision.complete(b'{"ok":true}'))
    s.run_finished("COMPLETED", "goal_completed", steps=2)
    spans = sorted(SpanMapper().map_all(s.events), key=lambda sp: (sp.start_ns, sp.name))
    lines = [(f"{sp.trace_id:032x}", f"{sp.span_id:016x}", f"{sp.parent_span_id or 0:016x}",
              sp.name) for sp in spans]
    assert lines == [
        ("93afafd5ba988f2a2bebf175c7cde8d6", "d925db6dbbd9dfb1", "0000000000000000",
         "agentrt.run"),
        ("93afafd5ba988f2a2bebf175c7cde8d6", "a814125d85e59b99", "d925db6dbbd9dfb1",
         "agentrt.step"),
        ("93afafd5ba988f2a2bebf175c7cde8d6", "02240d837b60d1a6", "d925db6dbbd9dfb1",
         "agentrt.step"),
    ]
    run_span, first, second = spans
    assert run_span.attributes["agentrt.run.status"] == "COMPLETED"
    assert (first.attributes["agentrt.step.index"], first.attributes["agentrt.decision.tool"],
            first.attributes["agentrt.tool.summary"], first.attributes["agentrt.step.status"]) == (
        0, "read", "read it", "done")
    assert second.attributes["agentrt.step.index"] == 1
    assert "agentrt.step.status" not in second.attributes
