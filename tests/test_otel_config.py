"""Settings from arguments and OTEL_* variables (spec 3.10, STYLE.md 9)."""

from __future__ import annotations

import io

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentrt.errors import AgentrtError
from agentrt.records import default_limits
from agentrt_otel import ConfigError, OTelSink, build_exporter, resolve_config, span_id, trace_id
from agentrt_otel.testing import EventStream


def test_service_name_and_resource_attributes_come_from_the_environment() -> None:
    config = resolve_config(environ={
        "OTEL_TRACES_EXPORTER": "none", "OTEL_SERVICE_NAME": "svc",
        "OTEL_RESOURCE_ATTRIBUTES": "service.name=ignored,deployment.environment=prod%20eu"})
    attrs = dict(config.resource().attributes)
    assert attrs["service.name"] == "svc"
    assert attrs["deployment.environment"] == "prod eu"
    assert attrs["telemetry.sdk.language"] == "python"
    assert "service.instance.id" not in attrs
    assert build_exporter(config) is None


def test_the_default_service_name_is_agentrt_and_the_resource_is_repeatable() -> None:
    first = resolve_config(environ={}).resource()
    second = resolve_config(environ={}).resource()
    assert first.attributes["service.name"] == "agentrt"
    assert dict(first.attributes) == dict(second.attributes)
    assert resolve_config(environ={"OTEL_RESOURCE_ATTRIBUTES": "service.name=x"}).resource(
    ).attributes["service.name"] == "x"


def test_the_resource_equals_and_hashes_as_the_sdk_resource_with_its_attributes() -> None:
    # The resource computes its hash once (the SDK's encoder hashes it per span);
    # it must stay interchangeable with a plain Resource.
    resource = resolve_config(environ={"OTEL_SERVICE_NAME": "billing"}).resource()
    plain = Resource(dict(resource.attributes))
    assert resource == plain and plain == resource
    assert hash(resource) == hash(plain)
    assert {resource: 1}[plain] == 1


def test_none_still_maps_and_a_provided_exporter_gets_one_span_with_derived_ids() -> None:
    s = EventStream("r")
    s.run_created("g", default_limits())
    s.run_finished("COMPLETED", "goal_completed")
    OTelSink(None).handle_page(s.events)  # maps and discards
    memory = InMemorySpanExporter()
    config = resolve_config(environ={"OTEL_TRACES_EXPORTER": "none", "OTEL_SERVICE_NAME": "svc"})
    OTelSink(memory, resource=config.resource()).handle_page(s.events)
    (span,) = memory.get_finished_spans()
    assert span.context is not None
    assert (span.context.trace_id, span.context.span_id) == (trace_id("r"), span_id("run", "r"))
    assert span.resource.attributes["service.name"] == "svc"


def test_empty_payloads_still_yield_one_run_span() -> None:
    s = EventStream("r")
    s.emit("run.created", b"{}")
    s.emit("run.finished", b"{}")
    memory = InMemorySpanExporter()
    OTelSink(memory).handle_page(s.events)
    assert len(memory.get_finished_spans()) == 1


def test_console_builds_and_prints_spans() -> None:
    out = io.StringIO()
    exporter = build_exporter(resolve_config(environ={"OTEL_TRACES_EXPORTER": " Console "}),
                              console_out=out)
    assert isinstance(exporter, ConsoleSpanExporter)
    s = EventStream("r")
    s.run_created()
    s.run_finished("COMPLETED", "goal_completed")
    OTelSink(exporter).handle_page(s.events)
    assert "agentrt.run" in out.getvalue()


@pytest.mark.parametrize(("env", "kind"), [
    ({}, HttpExporter),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, HttpExporter),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": ""}, HttpExporter),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, GrpcExporter),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
      "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, GrpcExporter),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
      "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, HttpExporter),
])
def test_otlp_builds_the_exporter_for_the_protocol(env: dict[str, str], kind: type) -> None:
    exporter = build_exporter(resolve_config(environ=env))
    assert isinstance(exporter, kind)
    assert exporter is not None
    exporter.shutdown()


@pytest.mark.parametrize(("env", "message"), [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
     'otel: OTLP protocol "http/json": http/protobuf or grpc'),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
     'otel: OTLP protocol "http/json": http/protobuf or grpc'),
    ({"OTEL_TRACES_EXPORTER": "zipkin"},
     'otel: OTEL_TRACES_EXPORTER "zipkin": otlp, console, or none'),
    ({"OTEL_EXPORTER_OTLP_INSECURE": "yes"},
     'otel: OTEL_EXPORTER_OTLP_INSECURE "yes": true or false'),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"},
     'otel: OTEL_EXPORTER_OTLP_TIMEOUT "soon": give a positive number of milliseconds'),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "api-key"},
     'otel: OTEL_EXPORTER_OTLP_HEADERS "api-key": write each header as key=value, '
     "separated by commas"),
])
def test_unusable_settings_are_refused_in_one_sentence(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_config(environ=env)
    assert str(caught.value) == message
    assert isinstance(caught.value, AgentrtError)


def test_a_protocol_argument_beats_the_environment_and_is_checked_too() -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
    assert resolve_config(protocol="grpc", environ=env).protocol == "grpc"
    with pytest.raises(ConfigError, match='"http/json"'):
        resolve_config(protocol="http/json", environ={})


@pytest.mark.parametrize(("arg", "env", "endpoint"), [
    (None, {}, "http://localhost:4318/v1/traces"),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318/v1/traces"),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/otlp"},
     "http://c:4318/otlp/v1/traces"),
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t:1/custom",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "https://t:1/custom"),
    ("http://a:9", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t:1/custom"},
     "http://a:9/v1/traces"),
    ("http://a:9/x", {}, "http://a:9/x"),
    ("a:9", {}, "https://a:9/v1/traces"),
])
def test_the_http_endpoint_follows_argument_specific_generic_default(
    arg: str | None, env: dict[str, str], endpoint: str,
) -> None:
    assert resolve_config(endpoint=arg, environ=env).endpoint == endpoint


def test_a_schemeless_endpoint_is_plain_text_only_when_insecure() -> None:
    config = resolve_config(endpoint="a:9", insecure=True, environ={})
    assert (config.endpoint, config.insecure) == ("http://a:9/v1/traces", True)


@pytest.mark.parametrize(("arg", "env", "endpoint", "insecure"), [
    (None, {}, "http://localhost:4317", True),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317"}, "https://c:4317", False),
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "t:4317",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, "t:4317", False),
    ("a:1", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, "a:1", True),
    ("a:1", {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false",
             "OTEL_EXPORTER_OTLP_INSECURE": "true"}, "a:1", False),
])
def test_the_grpc_endpoint_and_tls_follow_the_same_precedence(
    arg: str | None, env: dict[str, str], endpoint: str, insecure: bool,
) -> None:
    config = resolve_config(protocol="grpc", endpoint=arg, environ=env)
    assert (config.endpoint, config.insecure) == (endpoint, insecure)


def test_an_insecure_argument_beats_the_variables() -> None:
    env = {"OTEL_EXPORTER_OTLP_INSECURE": "false"}
    assert resolve_config(protocol="grpc", endpoint="a:1", insecure=True, environ=env).insecure


def test_headers_follow_argument_specific_generic() -> None:
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "Api-Key=generic,x=1",
           "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=spec%20ific"}
    assert dict(resolve_config(environ=env).headers) == {"api-key": "spec ific"}
    env.pop("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
    assert dict(resolve_config(environ=env).headers) == {"api-key": "generic", "x": "1"}
    assert dict(resolve_config(headers={"A": "b"}, environ=env).headers) == {"a": "b"}


def test_timeouts_are_milliseconds_in_the_environment_and_seconds_as_arguments() -> None:
    assert resolve_config(environ={}).timeout == 10.0
    assert resolve_config(environ={"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}).timeout == 2.5
    env = {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "500", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}
    assert resolve_config(environ=env).timeout == 0.5
    assert resolve_config(timeout=3, environ=env).timeout == 3.0
    with pytest.raises(ConfigError):
        resolve_config(timeout=0, environ={})


def test_the_built_exporters_use_the_resolved_settings() -> None:
    config = resolve_config(endpoint="http://h:1", headers={"k": "v"}, timeout=2, environ={})
    exporter = build_exporter(config)
    assert isinstance(exporter, HttpExporter)
    assert exporter._endpoint == "http://h:1/v1/traces"
    exporter.shutdown()
    grpc = build_exporter(resolve_config(protocol="grpc", endpoint="http://h:2", environ={}))
    assert isinstance(grpc, GrpcExporter)
    assert grpc._endpoint == "h:2" and grpc._insecure is True
    grpc.shutdown()


def test_an_exporter_that_is_shut_down_reports_failure_rather_than_raising() -> None:
    exporter = build_exporter(resolve_config(environ={}))
    assert exporter is not None
    exporter.shutdown()
    assert exporter.export([]) is SpanExportResult.FAILURE
