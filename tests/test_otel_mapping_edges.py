"""Mapping edges a real database can hold: a model result recorded after its
run ended some other way than a cancel, times the Go runtime wrote with
nanoseconds, and ids as long as a page read hands out."""

from __future__ import annotations

import gc
import tracemalloc
from collections import Counter

import pytest
from span_helpers import full, one_pass, restarted

from agentrt.events import Event
from agentrt_otel import SpanMapper, span_id


def _event(seq: int, type_: str, payload: bytes = b"{}", step: str = "",
           at: str | None = None) -> Event:
    return Event(seq, "r", step, at or f"2026-10-01T09:00:{seq:02d}Z", type_, payload)


# What the real driver writes when its lease is taken over while its model call
# is in flight and the new owner ends the run: the stale driver's record needs
# no lease, so its result lands after run.finished.
_STALE_RESULT = [
    _event(1, "run.created", b'{"goal":"g"}'),
    _event(2, "run.started"),
    _event(3, "step.started", b'{"index":0}', "a-1"),
    _event(4, "model.dispatched", b'{"attempt":1,"call_id":"a-2","model":"m"}', "a-1"),
    _event(5, "lease.taken_over", b'{"owner":"b/1","previous_expires_at":'
           b'"2026-10-01T09:00:05Z","previous_owner":"a/1"}'),
    _event(6, "step.interrupted", b'{"previous_status":{"previous_status":"deciding"}}', "a-1"),
    _event(7, "run.resumed", b'{"after":"interruption"}'),
    _event(8, "step.started", b'{"index":1}', "b-1"),
    _event(9, "step.decided", b'{"kind":"fail","message":"x"}', "b-1"),
    _event(10, "run.finished", b'{"detail":"x","reason":"goal_failed","status":"FAILED",'
           b'"steps":2}'),
    _event(11, "model.completed", b'{"attempt":1,"call_id":"a-2","cost_micros":0,"error":"",'
           b'"latency_ms":250,"model":"m","status":"ok","usage":{"input_tokens":1,'
           b'"output_tokens":1}}', "a-1"),
]


def test_a_model_result_after_a_failed_end_is_a_late_span_not_its_call_exported_again(
) -> None:
    spans = SpanMapper().map_all(_STALE_RESULT)
    ids = Counter((s.trace_id, s.span_id) for s in spans)
    assert max(ids.values()) == 1
    models = [s for s in spans if s.name == "agentrt.model"]
    assert [s.attributes["agentrt.model.status"] for s in models] == ["unknown", "ok"]
    late = spans[-1]
    assert (late.name, late.span_id, late.parent_span_id) == (
        "agentrt.model", span_id("model.late", "a-2"), span_id("step", "a-1"))
    assert late.attributes["agentrt.model.late"] is True
    assert late.attributes["agentrt.model.input_tokens"] == 1


def test_the_stale_result_maps_the_same_after_a_restart_at_every_event() -> None:
    for cut in range(1, len(_STALE_RESULT)):
        spans = restarted(_STALE_RESULT, [cut])
        assert sorted(map(full, spans)) == one_pass(_STALE_RESULT), cut


def test_span_times_keep_the_nanoseconds_of_a_go_written_time() -> None:
    spans = SpanMapper().map_all([
        _event(1, "run.created", b'{"goal":"g"}', at="2026-09-25T14:03:04.123456789Z"),
        _event(2, "run.finished", b'{"status":"COMPLETED"}', at="2026-09-25T14:03:05.9876543Z"),
    ])
    (run,) = spans
    assert (run.start_ns, run.end_ns) == (1790344984123456789, 1790344985987654300)


def test_ids_of_ended_runs_are_not_kept_alive_however_long() -> None:
    mapper = SpanMapper(finished_runs=1)
    tracemalloc.start()
    try:
        seq = 0
        for i in range(100):  # a fresh str per row, as page reads give
            for type_, payload in (("run.created", b'{"goal":"g"}'),
                                   ("step.started", b'{"index":0}'),
                                   ("run.finished", b'{"status":"COMPLETED"}')):
                seq += 1
                run = f"{i:06d}" + "\U0001F600" * 65_530
                step = run + "s" if type_ == "step.started" else ""
                mapper.map(Event(seq, run, step, "2026-10-01T09:00:00Z", type_, payload))
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert mapper.open_spans == 0
    assert kept < 5_000_000, f"{kept / 1e6:.0f} MB kept after every run ended"


def test_span_times_keep_the_nanoseconds_whatever_the_zone_is_written_as() -> None:
    def start(at: str) -> int:
        (run,) = SpanMapper().map_all([
            _event(1, "run.created", b'{"goal":"g"}', at=at),
            _event(2, "run.finished", b'{"status":"COMPLETED"}', at="2026-09-25T14:03:05Z")])
        return run.start_ns

    assert {start("2026-09-25T14:03:04.123456789Z"), start("2026-09-25T14:03:04.123456789z"),
            start("2026-09-25T16:03:04.123456789+02:00")} == {1790344984123456789}


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"max_text": 2.5}, "otel: max_text is a float (2.5), not an int: 0 or more"),
    ({"max_text": None}, "otel: max_text is None, not an int: 0 or more"),
    ({"max_text": "5"}, "otel: max_text is a str ('5'), not an int: 0 or more"),
    ({"max_text": True}, "otel: max_text is a bool (True), not an int: 0 or more"),
    ({"finished_runs": 1.5}, "otel: finished_runs is a float (1.5), not an int: 1 or more"),
])
def test_a_span_mapper_refuses_a_setting_that_is_not_an_int_when_built(kwargs, said) -> None:
    """Before: 2.5 was taken and the first long text failed inside map() with
    'byte indices must be integers'; None and '5' failed with a comparison."""
    with pytest.raises(TypeError) as info:
        SpanMapper(**kwargs)
    assert str(info.value) == said


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"max_text": -1}, "otel: max_text -1 is negative"),
    ({"finished_runs": -1}, "otel: finished_runs -1 must be 1 or more: "),
    ({"finished_runs": 0}, "otel: finished_runs 0 must be 1 or more: "),
])
def test_a_span_mapper_refuses_a_negative_setting(kwargs, said) -> None:
    """No memory of finished runs was taken: a run was forgotten at its end,
    and its call's late result exported the call's span id a second time."""
    with pytest.raises(ValueError) as info:
        SpanMapper(**kwargs)
    assert str(info.value).startswith(said)


def _cancelled_during_a_call(run: str) -> list[Event]:
    """A run cancelled while its model call is in flight; no result yet."""
    return [Event(seq, run, step, f"2026-10-01T09:00:{seq:02d}Z", type_, payload)
            for seq, step, type_, payload in (
                (1, "", "run.created", b'{"goal":"g"}'),
                (2, "s", "step.started", b'{"index":0}'),
                (3, "s", "model.dispatched", b'{"attempt":1,"call_id":"c","model":"m"}'),
                (4, "", "run.finished", b'{"reason":"operator_cancelled","status":"CANCELLED",'
                 b'"steps":1}'))]


def test_without_a_source_a_late_result_of_a_run_out_of_the_finished_memory_takes_its_calls_id(
) -> None:
    """The one limitation left (module docstring): the run is no longer known
    to have ended, and without a source nothing tells. With one, the replay
    reads the run's end again and the result is the late span."""
    from agentrt_otel.testing import StreamSource

    events = _cancelled_during_a_call("a")
    other = _cancelled_during_a_call("b")
    events += [Event(4 + e.seq, "b", e.step_id, e.at, e.type,
                     e.payload.replace(b'"c"', b'"cb"')) for e in other]
    events.append(Event(9, "a", "s", "2026-10-01T09:00:09Z", "model.completed",
                        b'{"attempt":1,"call_id":"c","latency_ms":2,"status":"ok"}'))

    def result_id(mapper: SpanMapper) -> int:
        return mapper.map_all(events)[-1].span_id

    assert result_id(SpanMapper(finished_runs=1)) == span_id("model", "c")
    assert result_id(SpanMapper(finished_runs=2)) == span_id("model.late", "c")
    assert result_id(SpanMapper(StreamSource(events), finished_runs=1)) == span_id(
        "model.late", "c")
