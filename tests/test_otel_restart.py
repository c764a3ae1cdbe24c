"""Restarts: the spans of a stream split between two mappers equal one pass's.

The second mapper of each split is fresh and has the store's rows (a
:class:`StreamSource` over what the stream wrote), as an exporter restarted
on its cursor has the read-only database.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from agentrt.events import Event
from agentrt.records import Decision, PolicyDecision
from agentrt.timefmt import to_unix_nanos
from agentrt_otel import SpanMapper, SpanRecord, span_id
from agentrt_otel.testing import (
    EventStream,
    StreamSource,
    scenario_cancelled,
    scenario_completed,
    scenario_crash_takeover,
    scenario_failed,
    scenario_limit,
    scenario_loop,
    scenario_model_retry,
    scenario_paused,
)

Scenario = Callable[[EventStream], None]
ALL = [scenario_completed, scenario_paused, scenario_crash_takeover, scenario_cancelled,
       scenario_model_retry, scenario_limit, scenario_loop, scenario_failed]
WITHOUT_APPROVALS = [scenario_completed, scenario_cancelled, scenario_model_retry,
                     scenario_limit, scenario_loop, scenario_failed]


def written(scenario: Scenario) -> EventStream:
    s = EventStream(scenario.__name__)
    scenario(s)
    return s


def full(span: SpanRecord) -> tuple[Any, ...]:
    return (*span.identity(), span.start_ns, span.end_ns, tuple(sorted(span.attributes.items())),
            span.status_code, span.status_description)


def split(s: EventStream, k: int, *, source: bool = True) -> list[SpanRecord]:
    first = SpanMapper().map_all(s.events[:k])
    second = SpanMapper(s.source() if source else None).map_all(s.events[k:])
    return first + second


@pytest.mark.parametrize("scenario", ALL, ids=lambda f: f.__name__)
def test_any_split_gives_the_same_spans_ids_parents_and_end_times(scenario: Scenario) -> None:
    s = written(scenario)
    whole = SpanMapper().map_all(s.events)
    expected = sorted((*sp.identity(), sp.end_ns, sp.status_code) for sp in whole)
    for k in range(1, len(s.events)):
        spans = split(s, k)
        assert sorted((*sp.identity(), sp.end_ns, sp.status_code) for sp in spans) == expected, k
        assert not [sp for sp in spans if "agentrt.span.start_unknown" in sp.attributes], k
        assert all(sp.start_ns <= sp.end_ns for sp in spans)


@pytest.mark.parametrize("scenario", WITHOUT_APPROVALS, ids=lambda f: f.__name__)
def test_any_split_of_a_run_without_approvals_gives_identical_spans(scenario: Scenario) -> None:
    s = written(scenario)
    whole = sorted(map(full, SpanMapper().map_all(s.events)))
    for k in range(1, len(s.events)):
        assert sorted(map(full, split(s, k))) == whole, (k, s.events[k - 1].type)


def _approved_step_window(s: EventStream) -> tuple[str, range]:
    """The step resumed after an approval, and the split points inside it."""
    resumed = next(e for e in s.events
                   if e.type == "step.tool_started" and b"approval_id" in e.payload)
    started = next(i for i, e in enumerate(s.events)
                   if e.type == "step.started" and e.step_id == resumed.step_id)
    finished = next(i for i, e in enumerate(s.events)
                    if e.type == "step.tool_finished" and e.step_id == resumed.step_id)
    return resumed.step_id, range(started + 1, finished + 1)


@pytest.mark.parametrize("scenario", [scenario_paused, scenario_crash_takeover],
                         ids=lambda f: f.__name__)
def test_a_split_during_an_approval_wait_differs_only_where_the_store_forgets(
    scenario: Scenario,
) -> None:
    s = written(scenario)
    whole = {sp.span_id: sp for sp in SpanMapper().map_all(s.events)}
    step_id, window = _approved_step_window(s)
    resumed_at = next(to_unix_nanos(e.at) for e in s.events
                      if e.type == "step.tool_started" and b"approval_id" in e.payload)
    for k in range(1, len(s.events)):
        got = {sp.span_id: sp for sp in split(s, k)}
        assert got.keys() == whole.keys()
        for sid, span in got.items():
            want = whole[sid]
            if k not in window:
                assert full(span) == full(want), (k, span.name)
                continue
            # Known limits (mapping.py docstring): the store keeps the resumed
            # step's start as the resume time and only its latest policy; an
            # approval's reason lives only in its approval.requested event.
            if sid == span_id("step", step_id):
                assert span.start_ns == resumed_at
            else:
                assert span.start_ns == want.start_ns
            diff = {key for key in set(span.attributes) | set(want.attributes)
                    if span.attributes.get(key) != want.attributes.get(key)}
            assert diff <= {"agentrt.policy.kind", "agentrt.policy.id",
                            "agentrt.approval.reason"}, (k, span.name, diff)


@pytest.mark.parametrize("scenario", ALL, ids=lambda f: f.__name__)
def test_the_reference_split_points_produce_no_duplicates(scenario: Scenario) -> None:
    s = written(scenario)
    n = len(s.events)
    for k in sorted({1, n // 3, n // 2, 2 * n // 3, n - 2}):
        spans = split(s, k)
        counts = Counter(sp.identity() for sp in spans)
        assert max(counts.values()) == 1, k


def test_without_a_store_missed_starts_are_flagged_start_unknown() -> None:
    for scenario in ALL:
        s = written(scenario)
        skipped = [e for e in s.events
                   if e.type not in ("run.created", "step.started", "approval.requested")]
        spans = SpanMapper().map_all(skipped)
        flagged = [sp for sp in spans if sp.attributes.get("agentrt.span.start_unknown")]
        assert flagged, scenario.__name__
        assert all(sp.start_ns <= sp.end_ns for sp in spans)
        unflagged = {sp.name for sp in spans} - {sp.name for sp in flagged}
        assert unflagged <= {"agentrt.model", "agentrt.tool.late", "agentrt.step"}
        for sp in spans:
            if "agentrt.span.start_unknown" not in sp.attributes and sp.name == "agentrt.step":
                # a step ended by its tool result starts at the implied tool start
                assert sp.attributes["agentrt.step.end"] == "step.tool_finished"


def test_a_run_rebuilt_from_the_store_keeps_its_goal_and_limits() -> None:
    s = written(scenario_completed)
    whole = [sp for sp in SpanMapper().map_all(s.events) if sp.name == "agentrt.run"]
    (rebuilt,) = [sp for sp in split(s, 3) if sp.name == "agentrt.run"]
    assert rebuilt.attributes == whole[0].attributes
    assert rebuilt.start_ns == whole[0].start_ns


def test_a_split_just_before_the_end_still_ends_the_last_step() -> None:
    s = written(scenario_completed)
    spans = split(s, len(s.events) - 1)  # the second mapper sees only run.finished
    assert [sp.name for sp in spans].count("agentrt.step") == 5


def test_a_store_read_that_fails_is_treated_as_missing() -> None:
    class Broken:
        def get_run_capped(self, run_id: str) -> Any:
            raise OSError("disk I/O error")

        def list_steps_page(self, run_id: str, limit: int, offset: int) -> Any:
            raise OSError("disk I/O error")

        def get_approval(self, run_id: str, approval_id: str) -> Any:
            raise OSError("disk I/O error")

    s = written(scenario_completed)
    spans = SpanMapper(Broken()).map_all(s.events[5:])
    assert {sp.name for sp in spans} == {"agentrt.run", "agentrt.step"}
    run = next(sp for sp in spans if sp.name == "agentrt.run")
    assert run.attributes["agentrt.span.start_unknown"] is True


def test_the_step_lookup_pages_through_a_long_run() -> None:
    s = EventStream("long")
    s.run_created()
    for i in range(450):
        s.step_started(f"s{i}", i)
        s.step_decided(f"s{i}", Decision.tool_call("read", b"{}"))
    source = s.source()
    mapper = SpanMapper(source)
    mapper.map(s.step_policy("s449", PolicyDecision.allow()))
    pages = [c for c in source.calls if c[0] == "list_steps_page"]
    assert [c[3] for c in pages] == ["0", "200", "400"]


# -- deliberate fixes of the reference's duplicate spans ---------------------

def _finished_run() -> EventStream:
    s = EventStream("done")
    s.run_created()
    s.run_finished("COMPLETED", "goal_completed")
    return s


@pytest.mark.parametrize("late", ["run.started", "run.resumed", "lease.taken_over",
                                  "limit.exceeded", "loop.detected", "step.started",
                                  "step.decided", "approval.decided", "run.created",
                                  "run.finished", "model.dispatched"])
def test_an_event_for_a_finished_run_never_reopens_it(late: str) -> None:
    s = _finished_run()
    mapper = SpanMapper()
    mapper.map_all(s.events)
    (span,) = mapper.map(Event(99, "done", "s", s.now, late, b"{}"))
    assert span.name == "agentrt.event"
    assert span.span_id == span_id("event", "99")
    assert span.attributes["agentrt.event.type"] == late
    assert mapper.open_runs == 0 and mapper.open_spans == 0


def _cancel_during_model_call(s: EventStream) -> None:
    s.run_created("think")
    s.step_started("s", 0)
    s.model_dispatched("s", "c1", 1)
    s.run_finished("CANCELLED", "operator_cancelled", "stop", steps=1, by="operator")
    s.model_result("s", "c1", 1, "ok", (7, 1, 0), 3, latency_ms=2)


def test_a_model_result_after_a_cancel_ends_its_span_once() -> None:
    s = EventStream("c")
    _cancel_during_model_call(s)
    spans = SpanMapper().map_all(s.events)
    models = [sp for sp in spans if sp.name == "agentrt.model"]
    assert len(models) == 1
    assert models[0].attributes["agentrt.model.status"] == "ok"
    assert models[0].start_ns == to_unix_nanos(s.events[2].at)
    for k in range(1, len(s.events)):
        again = [sp for sp in split(s, k) if sp.name == "agentrt.model"]
        assert [full(sp) for sp in again] == [full(m) for m in models], k


def test_a_pending_model_call_ends_as_unknown_when_its_run_is_forgotten() -> None:
    s = EventStream("c")
    _cancel_during_model_call(s)
    mapper = SpanMapper(finished_runs=1)
    mapper.map_all(s.events[:-1])
    assert mapper.open_spans == 1
    other = EventStream("other", start=s.now)
    other.run_created()
    other.run_finished("COMPLETED", "goal_completed")
    spans = mapper.map_all(other.events)
    unknown = [sp for sp in spans if sp.name == "agentrt.model"]
    assert unknown and unknown[0].attributes["agentrt.model.status"] == "unknown"
    assert unknown[0].end_ns == to_unix_nanos(s.events[-2].at)  # the run's end
    assert mapper.open_spans == 0 and mapper.remembered_runs == 1


def test_a_model_call_cut_off_by_another_ending_closes_as_unknown() -> None:
    s = EventStream("crashed")
    s.run_created()
    s.step_started("s", 0)
    s.model_dispatched("s", "c1", 1)
    s.run_finished("FAILED", "internal_error", "internal: boom")
    (model,) = [sp for sp in SpanMapper().map_all(s.events) if sp.name == "agentrt.model"]
    assert model.attributes["agentrt.model.status"] == "unknown"


def test_a_spent_grant_that_expires_is_a_step_event_not_a_second_approval_span() -> None:
    s = EventStream("ttl")
    s.run_created()
    s.step_started("s", 0)
    s.step_decided("s", Decision.tool_call("publish", b"{}"))
    s.step_policy("s", PolicyDecision.need_approval("remote_mutation"))
    s.approval_requested("s", "a", "remote_mutation")
    s.approval_decided("s", "a", "approved", "op", "ok")
    s.approval_decided("s", "a", "expired")
    s.run_finished("CANCELLED", "approval_expired", "approval a expired", steps=1)
    spans = SpanMapper().map_all(s.events)
    approvals = [sp for sp in spans if sp.name == "agentrt.approval"]
    assert len(approvals) == 1 and approvals[0].attributes["agentrt.approval.status"] == (
        "approved")
    (step,) = [sp for sp in spans if sp.name == "agentrt.step"]
    expired = [e for e in step.events if e.name == "approval.decided"]
    assert [dict(e.attributes) for e in expired] == [
        {"agentrt.approval.id": "a", "agentrt.approval.status": "expired"}]
    for k in range(1, len(s.events)):
        again = split(s, k)
        assert [sp.name for sp in again].count("agentrt.approval") == 1, k


# -- memory ------------------------------------------------------------------

def test_memory_follows_open_spans_across_many_open_runs() -> None:
    s = EventStream("r0")
    for i in range(2000):
        s.use(f"r{i}")
        s.run_created()
        s.step_started(f"s{i}", 0)
    mapper = SpanMapper(finished_runs=100)
    mapper.map_all(s.events)
    assert (mapper.open_runs, mapper.open_spans) == (2000, 4000)
    for i in range(2000):
        s.use(f"r{i}")
        mapper.map(s.run_finished("COMPLETED", "goal_completed"))
    assert (mapper.open_runs, mapper.open_spans) == (0, 0)
    assert mapper.remembered_runs == 100


def _interleaved(order: list[int]) -> tuple[list[Event], StreamSource]:
    streams = []
    for i, scenario in enumerate([scenario_completed, scenario_model_retry, scenario_cancelled,
                                  scenario_limit]):
        s = EventStream(f"run-{i}")
        scenario(s)
        streams.append(s)
    queues = [list(s.events) for s in streams]
    merged: list[Event] = []
    for pick in order:
        live = [q for q in queues if q]
        if not live:
            break
        merged.append(live[pick % len(live)].pop(0))
    for q in queues:
        merged.extend(q)
    events = [Event(i + 1, e.run_id, e.step_id, e.at, e.type, e.payload)
              for i, e in enumerate(merged)]
    sources = [s.source() for s in streams]
    source = StreamSource({k: v for src in sources for k, v in src.runs.items()},
                          {k: v for src in sources for k, v in src.steps.items()},
                          {k: v for src in sources for k, v in src.approvals.items()})
    return events, source


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3), max_size=80),
       st.integers(min_value=1, max_value=200))
def test_interleaved_runs_split_anywhere_give_identical_spans(order: list[int], cut: int) -> None:
    events, source = _interleaved(order)
    k = cut % (len(events) - 1) + 1
    whole = sorted(map(full, SpanMapper().map_all(events)))
    got = SpanMapper().map_all(events[:k]) + SpanMapper(source).map_all(events[k:])
    assert sorted(map(full, got)) == whole
