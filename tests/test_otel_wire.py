"""Over the wire: real OTLP receivers on 127.0.0.1, gRPC and HTTP/protobuf.

What arrives is decoded from the protobuf the SDK exporters send, so these
tests check the ids, parents, names, attributes and statuses a collector
sees, and that a collector that refuses or goes away loses nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExporter
from otlp_receivers import GrpcReceiver, HttpReceiver, ReceivedSpan

from agentrt.events import Event
from agentrt_otel import (
    SCOPE_NAME,
    Backoff,
    ExportStopped,
    OTelSink,
    SpanMapper,
    SpanRecord,
    build_exporter,
    resolve_config,
)
from agentrt_otel.complaints import ExporterComplaints
from agentrt_otel.config import build_resource, resource_attributes
from agentrt_otel.spans import to_readable_spans
from agentrt_otel.testing import (
    EventStream,
    scenario_cancelled,
    scenario_crash_takeover,
    scenario_model_retry,
    scenario_paused,
)

FAST = Backoff(initial=0.01, maximum=0.05)


def stream() -> EventStream:
    s = EventStream("paused")
    scenario_paused(s)
    for run_id, scenario in (("model", scenario_model_retry), ("cancelled", scenario_cancelled),
                             ("crash", scenario_crash_takeover)):
        s.use(run_id)
        scenario(s)
    return s


def pages(events: list[Event], size: int) -> Iterator[list[Event]]:
    for i in range(0, len(events), size):
        yield events[i:i + size]


def exporter_for(protocol: str, rx: GrpcReceiver | HttpReceiver) -> SpanExporter:
    config = resolve_config(exporter="otlp", protocol=protocol, endpoint=rx.endpoint,
                            insecure=True, timeout=0.3, headers={"x-tenant": "t1"}, environ={})
    exporter = build_exporter(config)
    assert exporter is not None
    return exporter


@contextmanager
def receiver(protocol: str, port: int = 0,
             max_bytes: int | None = None) -> Iterator[GrpcReceiver | HttpReceiver]:
    rx: GrpcReceiver | HttpReceiver = GrpcReceiver(port, max_bytes) if protocol == "grpc" else (
        HttpReceiver(port, max_bytes))
    with rx:
        yield rx


def expected(records: list[SpanRecord]) -> set[tuple[Any, ...]]:
    out = set()
    for r in records:
        out.add((
            f"{r.trace_id:032x}", f"{r.span_id:016x}",
            f"{r.parent_span_id:016x}" if r.parent_span_id is not None else "",
            r.name, r.start_ns, r.end_ns, tuple(sorted(r.attributes.items())),
            r.status_code.value, r.status_description,
        ))
    return out


def received(spans: list[ReceivedSpan]) -> set[tuple[Any, ...]]:
    return {(s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_ns, s.end_ns,
             tuple(sorted(s.attributes.items())), s.status_code, s.status_message)
            for s in spans}


def ship(protocol: str, rx: GrpcReceiver | HttpReceiver, events: list[Event],
         page_size: int = 7) -> OTelSink:
    sink = OTelSink(exporter_for(protocol, rx), backoff=FAST)
    for page in pages(events, page_size):
        sink.handle_page(page)
    sink.close()
    return sink


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_every_span_arrives_with_its_ids_parents_attributes_and_status(protocol: str) -> None:
    s = stream()
    records = SpanMapper().map_all(s.events)
    with receiver(protocol) as rx:
        sink = ship(protocol, rx, s.events)
        spans = rx.spans()
    assert sink.exported == len(records) == len(spans)
    assert received(spans) == expected(records)
    assert {sp.scope for sp in spans} == {SCOPE_NAME}
    assert spans[0].resource["service.name"] == "agentrt"
    assert "service.instance.id" not in spans[0].resource
    assert rx.headers[0]["x-tenant"] == "t1"
    kinds = {sp.name: sp.kind for sp in spans}
    assert kinds["agentrt.model"] == 3 and kinds["agentrt.run"] == 1  # CLIENT, INTERNAL
    runs = [sp for sp in spans if sp.name == "agentrt.run"]
    assert len(runs) == 4 and all(sp.parent_span_id == "" for sp in runs)


def test_grpc_and_http_deliver_identical_spans() -> None:
    s = stream()
    with receiver("grpc") as g:
        ship("grpc", g, s.events, page_size=5)
    with receiver("http/protobuf") as h:
        ship("http/protobuf", h, s.events, page_size=11)
    assert sorted(sp.key() for sp in g.spans()) == sorted(sp.key() for sp in h.spans())
    assert [sp.resource for sp in g.spans()][:1] == [sp.resource for sp in h.spans()][:1]


def test_span_events_arrive_with_their_attributes() -> None:
    s = stream()
    with receiver("http/protobuf") as rx:
        ship("http/protobuf", rx, s.events)
    runs = [sp for sp in rx.spans() if sp.name == "agentrt.run"]
    resumed = [(n, a) for sp in runs for n, _, a in sp.events if n == "run.resumed"]
    assert ("run.resumed", {"agentrt.approval.id": "a1"}) in resumed


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_refusing_collector_gets_every_span_once_it_recovers(
    protocol: str, caplog: pytest.LogCaptureFixture,
) -> None:
    s = stream()
    records = SpanMapper().map_all(s.events)
    with receiver(protocol) as rx:
        rx.fail_next(3)
        sink = OTelSink(exporter_for(protocol, rx), backoff=FAST)
        delivered: list[int] = []
        for page in pages(s.events, 9):
            sink.handle_page(page)
            delivered.append(page[-1].seq)  # the cursor a follower would save now
            # Nothing is acknowledged without the collector having it.
            have = received(rx.spans())
            assert expected(SpanMapper().map_all(s.events[:page[-1].seq])) <= have
        sink.close()
        assert rx.refused == 3
        assert received(rx.spans()) == expected(records)
    assert len(rx.spans()) == len(records)  # nothing skipped, nothing twice
    recovered = [r for r in caplog.records if "accepted spans again" in r.getMessage()]
    assert len(recovered) == 1


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_collector_that_goes_away_and_comes_back_loses_nothing(protocol: str) -> None:
    s = stream()
    records = SpanMapper().map_all(s.events)
    chunks = list(pages(s.events, 6))
    half = len(chunks) // 2
    rx = GrpcReceiver() if protocol == "grpc" else HttpReceiver()
    port = rx.port
    with rx:
        sink = OTelSink(exporter_for(protocol, rx), backoff=FAST)
        for page in chunks[:half]:
            sink.handle_page(page)
    got = rx.spans()
    cursor = [chunks[half - 1][-1].seq]
    finished = threading.Event()

    def follow() -> None:
        for page in chunks[half:]:
            sink.handle_page(page)
            cursor.append(page[-1].seq)
        finished.set()

    worker = threading.Thread(target=follow)
    worker.start()
    time.sleep(0.4)  # the collector is down: the follower must not get ahead
    assert cursor == [chunks[half - 1][-1].seq]
    with receiver(protocol, port) as back:
        worker.join(20)
        assert not worker.is_alive()
        sink.close()
    assert finished.is_set()
    assert cursor[-1] == s.events[-1].seq
    assert received(got + back.spans()) == expected(records)
    # A reply lost on a busy host (the receiver decoded the request, the client
    # gave up on its answer) sends that page again: never more than one page.
    mapper = SpanMapper()
    most = max(len(mapper.map_all(page)) for page in chunks)
    assert 0 <= len(got) + len(back.spans()) - len(records) <= most


def test_a_stop_during_an_outage_ends_the_page_unacknowledged() -> None:
    s = stream()
    with receiver("http/protobuf") as rx:
        rx.fail_next(10**6)
        stop = threading.Event()
        sink = OTelSink(exporter_for("http/protobuf", rx), stop=stop,
                        backoff=Backoff(initial=5.0, maximum=5.0))
        threading.Timer(0.2, stop.set).start()
        began = time.monotonic()
        with pytest.raises(ExportStopped):
            sink.handle_page(s.events)
        assert time.monotonic() - began < 3
        assert sink.pending > 0 and sink.exported == 0
        sink.close()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_collector_refusing_large_requests_gets_every_span_in_smaller_ones(
    protocol: str, caplog: pytest.LogCaptureFixture,
) -> None:
    s = stream()
    records = SpanMapper().map_all(s.events)
    resource = build_resource(resource_attributes({}))
    whole = len(encode_spans(to_readable_spans(records, resource)).SerializeToString())
    # The whole stream as one page is one request the collector refuses for its
    # size; a third of it passes. Its answer comes from grpc or from the HTTP status.
    with receiver(protocol, max_bytes=whole // 3) as rx:
        # Long enough for a first gRPC connection, too short for the SDK's own
        # retry of RESOURCE_EXHAUSTED (about 1 s): each refusal returns at once.
        # (A first connection slower than that on a loaded host is an ordinary
        # failure, retried after FAST's short wait; that a refusal for size is
        # split without any wait is test_otel_transport's.)
        exporter = build_exporter(resolve_config(
            exporter="otlp", protocol=protocol, endpoint=rx.endpoint, insecure=True,
            timeout=0.7, environ={}))
        assert exporter is not None
        complaints = ExporterComplaints(rx.endpoint).install()
        try:
            sink = OTelSink(exporter, backoff=FAST, complaints=complaints)
            sink.handle_page(s.events)
            sink.close()
        finally:
            complaints.uninstall()
        spans = rx.spans()
    assert received(spans) == expected(records)
    assert len(spans) == len(records)  # nothing skipped, nothing twice
    split = [r.getMessage() for r in caplog.records if "as too large" in r.getMessage()]
    assert split and rx.endpoint in split[0]
    assert ("larger than max" if protocol == "grpc" else "413") in split[0]
