"""The page transport: export once per page, retry until accepted, map once."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult

from agentrt.events import Event
from agentrt_otel import Backoff, ExportStopped, OTelSink, SpanMapper, SpanRecord
from agentrt_otel.testing import EventStream, scenario_completed, scenario_model_retry

FAST = Backoff(initial=0.001, maximum=0.005)


class FakeExporter(SpanExporter):
    """Answers from a script of results (then SUCCESS); keeps every call."""

    def __init__(self, script: Sequence[SpanExportResult | Exception] = ()) -> None:
        self.script = list(script)
        self.calls: list[list[ReadableSpan]] = []
        self.shutdowns = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls.append(list(spans))
        if self.script:
            result = self.script.pop(0)
            if isinstance(result, Exception):
                raise result
            return result
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shutdowns += 1


class CountingMapper(SpanMapper):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def map(self, event: Event) -> list[SpanRecord]:
        self.seen.append(event.seq)
        return super().map(event)


def events() -> list[Event]:
    s = EventStream("r")
    scenario_completed(s)
    s.use("m")
    scenario_model_retry(s)
    return s.events


def test_one_export_call_per_page_with_that_pages_finished_spans() -> None:
    exporter = FakeExporter()
    sink = OTelSink(exporter)
    evs = events()
    sink.handle_page(evs[:10])
    sink.handle_page(evs[10:])
    assert [len(c) for c in exporter.calls] == [2, 10]
    assert sink.exported == 12 and sink.pending == 0


def test_a_page_that_finishes_no_span_sends_nothing() -> None:
    exporter = FakeExporter()
    OTelSink(exporter).handle_page(events()[:3])
    assert exporter.calls == []


def test_a_large_page_is_sent_in_batches() -> None:
    exporter = FakeExporter()
    OTelSink(exporter, max_batch=5).handle_page(events())
    assert [len(c) for c in exporter.calls] == [5, 5, 2]


def test_requests_hold_at_most_512_spans_by_default() -> None:
    exporter = FakeExporter()
    s = EventStream("r")
    for i in range(600):  # 600 finished steps: 600 step spans, then the run's
        s.step_started(f"s{i}", i)
        s.step_failed(f"s{i}", "x", "x")
    s.run_finished("FAILED", "x")
    OTelSink(exporter).handle_page(s.events)
    assert [len(c) for c in exporter.calls] == [512, 89]


def test_a_failed_export_is_retried_with_the_same_spans_and_no_event_is_mapped_twice() -> None:
    failure = SpanExportResult.FAILURE
    exporter = FakeExporter([failure, RuntimeError("encoder bug"), failure])
    mapper = CountingMapper()
    sink = OTelSink(exporter, mapper=mapper, backoff=FAST)
    evs = events()
    sink.handle_page(evs)
    assert len(exporter.calls) == 4
    first = exporter.calls[0]
    assert all([id(s) for s in c] == [id(s) for s in first] for c in exporter.calls)
    assert mapper.seen == [e.seq for e in evs]


def test_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    backoff = Backoff(initial=1.0, maximum=30.0, jitter=0.2)
    for attempt, base in [(0, 1.0), (1, 2.0), (3, 8.0), (10, 30.0), (500, 30.0)]:
        delays = [backoff.delay(attempt) for _ in range(200)]
        assert all(base * 0.8 <= d <= base * 1.2 for d in delays)
        # Jittered: spread over the band (exporters restarted together do not
        # retry in step), not the base each time.
        assert len(set(delays)) > 150
        assert min(delays) < base * 0.9 and max(delays) > base * 1.1


def test_a_stop_cuts_the_wait_short_and_leaves_the_page_unacknowledged() -> None:
    exporter = FakeExporter([SpanExportResult.FAILURE] * 1000)
    stop = threading.Event()
    sink = OTelSink(exporter, stop=stop, backoff=Backoff(initial=30.0, maximum=30.0))
    threading.Timer(0.05, stop.set).start()
    began = time.monotonic()
    with pytest.raises(ExportStopped):
        sink.handle_page(events())
    assert time.monotonic() - began < 2
    assert sink.pending == 12 and sink.exported == 0


def test_a_stop_while_the_collector_is_healthy_still_delivers_the_page_in_hand() -> None:
    stop = threading.Event()
    stop.set()
    exporter = FakeExporter()
    sink = OTelSink(exporter, stop=stop)
    sink.handle_page(events())
    assert sink.exported == 12


def test_handing_in_a_page_again_after_a_stop_sends_the_pending_spans_and_maps_nothing_twice(
) -> None:
    exporter = FakeExporter([SpanExportResult.FAILURE])
    stop = threading.Event()
    stop.set()  # the first failure ends the call at once
    mapper = CountingMapper()
    sink = OTelSink(exporter, stop=stop, mapper=mapper)
    evs = events()
    with pytest.raises(ExportStopped):
        sink.handle_page(evs[:20])
    sink.handle_page(evs[:20])  # the follower retries the same page
    sink.handle_page(evs[20:])
    assert mapper.seen == [e.seq for e in evs]
    sent = [s.context.span_id for c in exporter.calls[1:] for s in c if s.context]
    whole = [r.span_id for r in SpanMapper().map_all(evs)]
    assert sent == whole


def test_recovery_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    exporter = FakeExporter([SpanExportResult.FAILURE] * 3)
    OTelSink(exporter, backoff=FAST).handle_page(events())
    failed = [r for r in caplog.records if "retrying with backoff" in r.getMessage()]
    recovered = [r for r in caplog.records if "accepted spans again" in r.getMessage()]
    assert len(failed) == 1 and len(recovered) == 1
    assert "after 3 failed attempts" in recovered[0].getMessage()


class SaidComplaints:
    """Complaints as the SDK exporter would leave them: ``said`` after each
    failed attempt, nothing after a success."""

    def __init__(self, exporter: FakeExporter | SizeLimitedExporter, said: str) -> None:
        self.exporter, self.said, self.cleared = exporter, said, 0

    def clear(self) -> None:
        self.cleared += 1

    def reason(self) -> str:
        return self.said

    def too_large(self) -> bool:
        return "larger than max" in self.said


def test_the_outage_line_says_why_the_exporter_failed(caplog: pytest.LogCaptureFixture) -> None:
    exporter = FakeExporter([SpanExportResult.FAILURE])
    complaints = SaidComplaints(exporter, "collector:4318: Connection refused")
    OTelSink(exporter, backoff=FAST, complaints=complaints).handle_page(events())
    assert complaints.cleared == len(exporter.calls)  # each attempt explained on its own
    failed = [r.getMessage() for r in caplog.records if "retrying with backoff" in r.getMessage()]
    assert len(failed) == 1 and "(collector:4318: Connection refused)" in failed[0]


def test_close_stops_and_shuts_the_exporter_down_once() -> None:
    exporter = FakeExporter()
    sink = OTelSink(exporter)
    sink.close()
    sink.close()
    assert exporter.shutdowns == 1
    assert sink.stop_event.is_set()


def test_close_from_another_thread_ends_a_retry_loop() -> None:
    exporter = FakeExporter([SpanExportResult.FAILURE] * 1000)
    sink = OTelSink(exporter, backoff=Backoff(initial=30.0, maximum=30.0))
    threading.Timer(0.05, sink.close).start()
    with pytest.raises(ExportStopped):
        sink.handle_page(events())


def test_without_an_exporter_events_are_mapped_and_spans_dropped() -> None:
    mapper = CountingMapper()
    sink = OTelSink(None, mapper=mapper)
    sink.handle_page(events())
    assert sink.pending == 0 and sink.exported == 0
    assert len(mapper.seen) == len(events())


class SizeLimitedExporter(FakeExporter):
    """A collector that refuses any request of more than ``limit`` spans."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.accepted: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls.append(list(spans))
        if len(spans) > self.limit:
            return SpanExportResult.FAILURE
        self.accepted.extend(spans)
        return SpanExportResult.SUCCESS


TOO_LARGE = "collector:4317: StatusCode.RESOURCE_EXHAUSTED: Received message larger than max"


def test_a_batch_refused_as_too_large_goes_in_halves_at_once_and_smaller_from_then_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = SizeLimitedExporter(limit=3)
    evs = events()  # 38 events, 12 spans: 8 finished by the 30th event, 4 after
    # A 30 s backoff: a wait anywhere would end in ExportStopped when the timer closes it.
    sink = OTelSink(exporter, backoff=Backoff(initial=30.0, maximum=30.0), max_batch=16,
                    complaints=SaidComplaints(exporter, TOO_LARGE))
    timer = threading.Timer(10.0, sink.close)
    timer.start()
    try:
        sink.handle_page(evs[:30])
        sink.handle_page(evs[30:])
    finally:
        timer.cancel()
    # 8 refused -> 4 + 4; 4 refused -> 2 + 2, both accepted; the other 4 likewise.
    # The second page goes out two spans at a time with nothing refused.
    assert [len(c) for c in exporter.calls] == [8, 4, 2, 2, 4, 2, 2, 2, 2]
    whole = [r.span_id for r in SpanMapper().map_all(evs)]
    assert [s.context.span_id for s in exporter.accepted if s.context] == whole  # order kept
    lines = [r.getMessage() for r in caplog.records if "as too large" in r.getMessage()]
    assert len(lines) == 2 and "RESOURCE_EXHAUSTED" in lines[0]
    assert "at most 4 per request" in lines[0] and "at most 2 per request" in lines[1]
    assert not [r for r in caplog.records if "retrying with backoff" in r.getMessage()]


def test_one_span_too_large_for_the_collector_is_an_outage_not_a_skip() -> None:
    exporter = SizeLimitedExporter(limit=0)
    stop = threading.Event()
    sink = OTelSink(exporter, backoff=FAST, stop=stop, max_batch=4,
                    complaints=SaidComplaints(exporter, TOO_LARGE))
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(ExportStopped):
        sink.handle_page(events())
    assert exporter.accepted == [] and sink.pending > 0
    assert any(len(c) == 1 for c in exporter.calls)


def test_a_failure_that_is_not_about_size_never_splits_the_batch() -> None:
    exporter = FakeExporter([SpanExportResult.FAILURE] * 3)
    complaints = SaidComplaints(exporter, "collector:4317: StatusCode.RESOURCE_EXHAUSTED: "
                                          "rate limited")
    OTelSink(exporter, backoff=FAST, complaints=complaints).handle_page(events())
    assert len({len(c) for c in exporter.calls}) == 1


class ClosedPipe(io.StringIO):
    """stdout whose reader went away (``| head``): the first flush fails."""

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stream_under_the_console_exporter_ends_the_page_instead_of_waiting() -> None:
    # The console exporter's BrokenPipeError was taken for a collector outage
    # and retried for ever (the 30 s backoff and the timer would end that as
    # ExportStopped); now it propagates at once, the spans still pending.
    sink = OTelSink(ConsoleSpanExporter(out=ClosedPipe()),
                    backoff=Backoff(initial=30.0, maximum=30.0))
    timer = threading.Timer(5.0, sink.close)
    timer.start()
    try:
        with pytest.raises(BrokenPipeError):
            sink.handle_page(events())
    finally:
        timer.cancel()
    assert sink.exported == 0 and sink.pending == 12


def test_an_oserror_is_a_local_stream_failure_only_for_an_exporter_that_writes_one() -> None:
    full = OSError(28, "No space left on device")
    with pytest.raises(OSError, match="No space left"):
        OTelSink(FakeExporter([full]), backoff=FAST, local_stream=True).handle_page(events())
    # An OSError out of a network exporter is still an outage, retried.
    exporter = FakeExporter([ConnectionResetError(104, "Connection reset by peer")])
    sink = OTelSink(exporter, backoff=FAST)
    sink.handle_page(events())
    assert len(exporter.calls) == 2 and sink.exported == 12


def test_a_stop_sentence_does_not_take_the_abandoned_attempts_complaint_as_the_next_ones(
        monkeypatch):
    """A page handed in again after a stop: the attempt given up at the stop
    logs its giving-up line as it ends, which is not the next attempt's (that
    one heard nothing: the collector hangs)."""
    import logging
    import threading

    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    import agentrt_otel.transport as transport
    from agentrt_otel import ExportStopped, OTelSink
    from agentrt_otel.complaints import ExporterComplaints
    from agentrt_otel.testing import EventStream, scenario_completed

    monkeypatch.setattr(transport, "STOP_GRACE", 0.3)
    sdk = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    complaints = ExporterComplaints("http://collector:4318/v1/traces")
    cleared = threading.Event()
    real_clear = complaints.clear

    def clear() -> None:
        real_clear()
        cleared.set()

    complaints.clear = clear  # type: ignore[method-assign]
    release = threading.Event()

    class Exporter(SpanExporter):
        calls = 0

        def export(self, spans):
            Exporter.calls += 1
            if Exporter.calls == 1:  # refused, and the SDK retries past the stop
                sdk.warning("Transient error Service Unavailable encountered while exporting "
                            "span batch, retrying in 4.00s.")
                cleared.clear()
                cleared.wait(10)  # the SDK gives up at its deadline: here, after the next clear
                sdk.error("Failed to export span batch due to timeout, max retries or shutdown.")
                return SpanExportResult.FAILURE
            release.wait(10)  # the collector now does not answer at all
            return SpanExportResult.FAILURE

        def shutdown(self):
            pass

    s = EventStream("r")
    scenario_completed(s)
    stop = threading.Event()
    stop.set()
    complaints.install()
    try:
        sink = OTelSink(Exporter(), stop=stop, complaints=complaints)
        with pytest.raises(ExportStopped) as first:
            sink.handle_page(s.events)
        assert "still retrying after" in str(first.value)  # true: attempt 1 was refused
        with pytest.raises(ExportStopped) as second:
            sink.handle_page(s.events)
    finally:
        release.set()
        complaints.uninstall()
    assert "had not answered" in str(second.value), str(second.value)


def test_a_stop_after_a_pages_first_batch_was_accepted_moves_past_the_events_it_completed(
) -> None:
    """Batches of 5 of the page's 12 spans: the first accepted, the second refused,
    and a stop. PartialPage counts the events whose spans were all in the first
    batch (an event whose spans straddle the cut is not one), so the follower
    saves the cursor after them; handing in the rest sends the pending spans,
    each span once over the two calls."""
    from agentrt_export import PartialPage
    from agentrt_otel.transport import ExportStoppedPartway

    evs = events()
    one_pass, ends = SpanMapper(), []
    for event in evs:  # spans made up to each event, as one pass makes them
        ends.append(len(one_pass.map(event)) + (ends[-1] if ends else 0))
    completed = sum(1 for end in ends if end <= 5)
    exporter = FakeExporter([SpanExportResult.SUCCESS, SpanExportResult.FAILURE])
    stop = threading.Event()
    stop.set()  # the first failure ends the call at once
    mapper = CountingMapper()
    sink = OTelSink(exporter, stop=stop, mapper=mapper, max_batch=5)
    with pytest.raises(PartialPage) as cut:
        sink.handle_page(evs)
    assert 0 < cut.value.accepted == completed < len(evs)
    assert isinstance(cut.value.error, ExportStoppedPartway)
    assert cut.value.error.resent == "the rest of the page is sent again on restart"
    sink.handle_page(evs[completed:])  # the follower goes on after the saved cursor
    assert mapper.seen == [e.seq for e in evs]
    sent = [s.context.span_id for c in exporter.calls if c is not exporter.calls[1]
            for s in c if s.context]
    assert sent == [r.span_id for r in SpanMapper().map_all(evs)]


def test_a_stop_before_any_batch_of_the_page_was_accepted_gives_up_the_whole_page() -> None:
    exporter = FakeExporter([SpanExportResult.FAILURE])
    stop = threading.Event()
    stop.set()
    sink = OTelSink(exporter, stop=stop, max_batch=5)
    with pytest.raises(ExportStopped) as stopped:
        sink.handle_page(events())
    assert type(stopped.value) is ExportStopped and sink.pending == 12
