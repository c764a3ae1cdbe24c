"""Restarts: the spans of a stream mapped by several mappers in turn equal one pass's.

Each mapper after the first is fresh and has the events before its cursor (a
:class:`StreamSource` over the stream), as an exporter restarted on its cursor
has the read-only database. It rebuilds the runs it meets in the middle by
replaying their earlier events, so the comparison is exact: ids, parents,
names, kinds, times, attributes, span events and statuses.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from span_helpers import full, one_pass, restarted

from agentrt.events import Event
from agentrt.records import Decision, PolicyDecision
from agentrt.timefmt import to_unix_nanos
from agentrt_otel import SpanMapper, SpanRecord, span_id
from agentrt_otel._restart import REPLAY_PAGE
from agentrt_otel.testing import (
    SCENARIOS,
    EventStream,
    StreamSource,
    scenario_cancelled,
    scenario_completed,
    scenario_crash_takeover,
    scenario_limit,
    scenario_model_retry,
    scenario_paused,
)

Scenario = Callable[[EventStream], None]


def written(scenario: Scenario) -> EventStream:
    s = EventStream(scenario.__name__)
    scenario(s)
    return s


def split(s: EventStream, k: int) -> list[SpanRecord]:
    return restarted(s.events, [k])


# -- exact equality -----------------------------------------------------------

@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_a_restart_after_any_event_gives_exactly_the_one_pass_spans(scenario: Scenario) -> None:
    s = written(scenario)
    whole = one_pass(s.events)
    for k in range(1, len(s.events)):
        spans = split(s, k)
        assert sorted(map(full, spans)) == whole, (k, s.events[k - 1].type)
        assert not [sp for sp in spans if "agentrt.span.start_unknown" in sp.attributes]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_a_restart_after_every_event_gives_exactly_the_one_pass_spans(
        scenario: Scenario) -> None:
    s = written(scenario)
    spans = restarted(s.events, range(1, len(s.events)))
    assert sorted(map(full, spans)) == one_pass(s.events)


@pytest.mark.parametrize("scenario", [scenario_paused, scenario_crash_takeover],
                         ids=lambda f: f.__name__)
def test_a_step_resumed_after_an_approval_keeps_its_start_policies_events_and_reason(
        scenario: Scenario) -> None:
    """What the store's rows forget: the step's first start (its row holds the
    resume time), the policy of its pause, its earlier span events, and the
    approval's reason. A replay has them all."""
    s = written(scenario)
    resumed = next(e for e in s.events
                   if e.type == "step.tool_started" and b"approval_id" in e.payload)
    k = s.events.index(resumed)  # restart just before the approved tool runs
    whole = {sp.span_id: sp for sp in SpanMapper().map_all(s.events)}
    got = {sp.span_id: sp for sp in split(s, k)}
    step = got[span_id("step", resumed.step_id)]
    assert full(step) == full(whole[step.span_id])
    assert step.start_ns < to_unix_nanos(resumed.at)
    assert [e.name for e in step.events].count("step.policy") >= 2
    (approval,) = [sp for sp in got.values() if sp.name == "agentrt.approval"]
    assert approval.attributes["agentrt.approval.reason"]


def test_a_kill_sends_at_most_the_page_in_flight_again_and_nothing_else_differs() -> None:
    """A SIGKILL after the exporter mapped and sent a page but before it saved
    its cursor: the next process maps that page again, and the spans it sends
    again are exactly the ones that page ended."""
    events, source = _interleaved(list(range(60)))
    mapper = SpanMapper()
    per_event = [mapper.map(e) for e in events]
    whole = one_pass(events)
    page = 5
    for killed_after in range(page, len(events), page):
        saved = killed_after - page
        got = (SpanMapper().map_all(events[:killed_after])
               + restarted(events[saved:], [], source))
        assert sorted(set(map(full, got))) == whole, killed_after
        twice = Counter(map(full, got)) - Counter(whole)
        in_flight = Counter(full(sp) for spans in per_event[saved:killed_after] for sp in spans)
        assert twice == in_flight, killed_after


# -- what a replay reads ----------------------------------------------------

def test_a_pass_from_the_start_never_reads_the_source() -> None:
    events, source = _interleaved(list(range(80)))
    SpanMapper(source).map_all(events)
    assert source.calls == []


def test_a_replay_reads_the_run_once_a_page_at_a_time_and_only_before_the_event() -> None:
    s = EventStream("long")
    s.run_created()
    for i in range(450):
        s.step_started(f"s{i}", i)
        s.step_decided(f"s{i}", Decision.tool_call("read", b"{}"))
    k = len(s.events)
    s.step_policy("s449", PolicyDecision.allow())
    s.run_finished("COMPLETED", "goal_completed")
    s.use("other").run_created()
    source = s.source()
    mapper = SpanMapper(source)
    spans = mapper.map_all(s.events[k:])
    # 901 earlier events: five pages, the last one short; nothing read again later.
    assert k == 901
    assert source.calls == [("long", after, REPLAY_PAGE) for after in (0, 200, 400, 600, 800)]
    # The replay's own spans (449 steps ended before the cursor) are not returned.
    assert sorted(sp.name for sp in spans) == ["agentrt.run", "agentrt.step"]
    assert sorted(map(full, spans)) == sorted(map(full, SpanMapper().map_all(s.events)[-2:]))


def test_many_runs_open_at_a_restart_are_replayed_once_each_and_memory_follows_open_spans(
        ) -> None:
    s = EventStream("r0")
    for i in range(300):
        s.use(f"r{i}")
        s.run_created()
        s.step_started(f"s{i}", 0)
    cursor = len(s.events)
    for i in range(300):
        s.use(f"r{i}")
        s.step_decided(f"s{i}", Decision.complete(b"{}"))
        s.run_finished("COMPLETED", "goal_completed")
    source = s.source()
    mapper = SpanMapper(source, finished_runs=10)
    spans = mapper.map_all(s.events[cursor:])
    assert [c[0] for c in source.calls] == [f"r{i}" for i in range(300)]
    assert (mapper.open_runs, mapper.open_spans, mapper.remembered_runs) == (0, 0, 10)
    assert sorted(map(full, spans)) == one_pass(s.events)


def test_a_late_result_of_a_run_that_ended_before_the_cursor_is_recognised() -> None:
    """Replay sees run.finished, so a late tool result is its late span and a
    cancelled call's result ends the call's own span (started at dispatch)."""
    s = EventStream("c")
    _cancel_during_model_call(s)
    s.tool_finished("s", "block", 5, "done after cancel", late=True)
    whole = one_pass(s.events)
    k = next(i for i, e in enumerate(s.events) if e.type == "run.finished") + 1
    mapper = SpanMapper(s.source())
    got = mapper.map_all(s.events[k:])
    assert sorted(sp.name for sp in got) == ["agentrt.model", "agentrt.tool.late"]
    assert sorted(map(full, SpanMapper().map_all(s.events[:k]) + got)) == whole
    assert mapper.open_spans == 0 and mapper.remembered_runs == 1


def test_a_late_model_result_after_a_restart_past_its_runs_end_is_the_late_span_of_one_pass(
) -> None:
    """The restarted mapper replays the finished run (whose spans it drops:
    exported before) and maps the result as one pass did, even with a memory
    of one finished run that the replay's own run pushes another out of."""
    s = EventStream("a")
    s.run_created()
    s.step_started("sa", 0)
    s.model_dispatched("sa", "ca", 1)
    s.run_finished("CANCELLED", "operator_cancelled", steps=1)
    cursor = len(s.events)
    s.use("b")
    s.run_created()
    s.step_started("sb", 0)
    s.model_dispatched("sb", "cb", 1)
    s.run_finished("CANCELLED", "operator_cancelled", steps=1)
    s.use("a")
    s.model_result("sa", "ca", 1, "ok", latency_ms=2)
    got = SpanMapper(s.source(), finished_runs=1).map_all(s.events[cursor:])
    calls = {sp.span_id: sp.attributes["agentrt.model.status"] for sp in got
             if sp.name == "agentrt.model"}
    assert calls == {span_id("model", "cb"): "unknown", span_id("model.late", "ca"): "ok"}
    one_pass = SpanMapper(s.source(), finished_runs=1).map_all(s.events)
    assert sorted(map(full, got)) == sorted(
        full(sp) for sp in one_pass if sp.attributes.get("agentrt.run.id") != "a"
        or sp.span_id == span_id("model.late", "ca"))


def test_without_a_store_missed_starts_are_flagged_start_unknown() -> None:
    for scenario in SCENARIOS:
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


def test_a_store_read_that_fails_is_treated_as_missing(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def list_events_after(self, run_id: str, seq: int, limit: int) -> list[Event]:
            raise OSError("disk I/O error")

    s = written(scenario_completed)
    with caplog.at_level(logging.WARNING, "agentrt_otel"):
        spans = SpanMapper(Broken()).map_all(s.events[5:])
    assert {sp.name for sp in spans} == {"agentrt.run", "agentrt.step"}
    run = next(sp for sp in spans if sp.name == "agentrt.run")
    assert run.attributes["agentrt.span.start_unknown"] is True
    assert len([r for r in caplog.records if "disk I/O error" in r.getMessage()]) == 1


def test_a_read_that_fails_half_way_leaves_no_half_rebuilt_run() -> None:
    s = EventStream("long")
    s.run_created()
    for i in range(REPLAY_PAGE):
        s.step_started(f"s{i}", i)
    source = s.source()

    class FailsOnPageTwo:
        def list_events_after(self, run_id: str, seq: int, limit: int) -> list[Event]:
            if seq:
                raise OSError("gone")
            return source.list_events_after(run_id, seq, limit)

    s.run_finished("COMPLETED", "goal_completed")
    spans = SpanMapper(FailsOnPageTwo()).map_all(s.events[-1:])
    assert [sp.name for sp in spans] == ["agentrt.run"]
    assert spans[0].attributes["agentrt.span.start_unknown"] is True


# -- deliberate fixes of the reference's duplicate spans ---------------------

def _finished_run() -> EventStream:
    s = EventStream("done")
    s.run_created()
    s.run_finished("COMPLETED", "goal_completed")
    return s


LATE = ["run.started", "run.resumed", "lease.taken_over", "limit.exceeded", "loop.detected",
        "step.started", "step.decided", "approval.decided", "run.created", "run.finished",
        "model.dispatched"]


# After a restart too, but for run.created: a run's first event, never replayed
# (the runtime commits a run's row and its one run.created together).
@pytest.mark.parametrize(("late", "restart"), [(t, False) for t in LATE]
                         + [(t, True) for t in LATE if t != "run.created"])
def test_an_event_for_a_finished_run_never_reopens_it(late: str, restart: bool) -> None:
    s = _finished_run()
    mapper = SpanMapper(s.source())
    if not restart:
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


def test_a_model_call_in_flight_at_a_cancel_ends_with_the_run_and_its_result_is_a_late_span(
) -> None:
    s = EventStream("c")
    _cancel_during_model_call(s)
    spans = SpanMapper().map_all(s.events)
    call, late = [sp for sp in spans if sp.name == "agentrt.model"]
    assert (call.span_id, call.attributes["agentrt.model.status"]) == (
        span_id("model", "c1"), "unknown")
    assert call.start_ns == to_unix_nanos(s.events[2].at)
    assert call.end_ns == to_unix_nanos(s.events[3].at)  # the run's end
    assert (late.span_id, late.parent_span_id) == (span_id("model.late", "c1"),
                                                   span_id("step", "s"))
    assert late.attributes["agentrt.model.status"] == "ok"
    assert late.attributes["agentrt.model.late"] is True
    assert late.end_ns == to_unix_nanos(s.events[4].at)
    for k in range(1, len(s.events)):
        assert sorted(map(full, split(s, k))) == sorted(map(full, spans)), k


def test_a_model_call_in_flight_at_a_cancel_with_no_result_is_exported_with_the_run() -> None:
    """Before: the call was held for a result that never came (the driver had
    crashed), and a mapper that stopped before 4096 other runs ended never
    exported it; a restart past the run's end never saw it again."""
    s = EventStream("c")
    _cancel_during_model_call(s)
    mapper = SpanMapper()
    spans = mapper.map_all(s.events[:-1])
    assert [sp.attributes["agentrt.model.status"] for sp in spans
            if sp.name == "agentrt.model"] == ["unknown"]
    assert mapper.open_spans == 0


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
        assert sorted(map(full, split(s, k))) == sorted(map(full, spans)), k


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
                                  scenario_limit, scenario_paused, scenario_crash_takeover]):
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
    return events, StreamSource(events)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=5), max_size=100),
       st.lists(st.integers(min_value=1, max_value=1000), max_size=6))
def test_interleaved_runs_restarted_anywhere_any_number_of_times_give_identical_spans(
        order: list[int], cuts: list[int]) -> None:
    events, source = _interleaved(order)
    cuts = [c % (len(events) - 1) + 1 for c in cuts]
    assert sorted(map(full, restarted(events, cuts, source))) == one_pass(events)
