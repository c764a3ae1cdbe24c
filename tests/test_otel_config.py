"""Settings from arguments and OTEL_* variables (spec 3.10, STYLE.md 9)."""

from __future__ import annotations

import io
import logging
import os
from typing import Any
from urllib.parse import quote

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
     'otel: OTLP protocol "http/json": http/protobuf or grpc (set by '
     'OTEL_EXPORTER_OTLP_PROTOCOL)'),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
     'otel: OTLP protocol "http/json": http/protobuf or grpc (set by '
     'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)'),
    ({"OTEL_TRACES_EXPORTER": "zipkin"},
     'otel: OTEL_TRACES_EXPORTER "zipkin": otlp, console, or none'),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"},
     'otel: OTEL_EXPORTER_OTLP_TIMEOUT "soon": give a number of milliseconds from 1 to '
     "86400000 (a day)"),
    # A timeout the SDK cannot keep: infinite, past a day, below a millisecond.
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "1e400"},
     'otel: OTEL_EXPORTER_OTLP_TIMEOUT "1e400": give a number of milliseconds from 1 to '
     "86400000 (a day)"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "1e15"},
     'otel: OTEL_EXPORTER_OTLP_TIMEOUT "1e15": give a number of milliseconds from 1 to '
     "86400000 (a day)"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "1e-9"},
     'otel: OTEL_EXPORTER_OTLP_TIMEOUT "1e-9": give a number of milliseconds from 1 to '
     "86400000 (a day)"),
    # The entry that is not key=value is never echoed: it may hold a secret.
    ({"OTEL_EXPORTER_OTLP_HEADERS": "a=b,Bearer TOPSECRET"},
     "otel: OTEL_EXPORTER_OTLP_HEADERS: an entry is not key=value; write each header as "
     "key=value, separated by commas"),
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
    ("https://[::1]:9", {}, "https://[::1]:9/v1/traces"),
    ("http://a:9?tenant=1", {}, "http://a:9/v1/traces?tenant=1"),
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "", "OTEL_EXPORTER_OTLP_ENDPOINT": " "},
     "http://localhost:4318/v1/traces"),
])
def test_the_http_endpoint_follows_argument_specific_generic_default(
    arg: str | None, env: dict[str, str], endpoint: str,
) -> None:
    assert resolve_config(endpoint=arg, environ=env).endpoint == endpoint


def test_a_schemeless_endpoint_is_plain_text_only_when_insecure() -> None:
    # A gRPC endpoint may be host:port (the specification lets it take any form
    # the gRPC client does); an HTTP one must be a URL, so its scheme says.
    config = resolve_config(protocol="grpc", endpoint="a:9", insecure=True, environ={})
    assert (config.endpoint, config.insecure) == ("a:9", True)
    assert resolve_config(protocol="grpc", endpoint="a:9", environ={}).insecure is False
    with pytest.raises(ConfigError, match='--endpoint "a:9": it has no http:// or https://'):
        resolve_config(endpoint="a:9", insecure=True, environ={})


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


@pytest.mark.parametrize("endpoint", [None, "http://localhost:4317", "http://c:4317"])
@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_INSECURE",
                                      "OTEL_EXPORTER_OTLP_TRACES_INSECURE"])
def test_an_insecure_false_variable_leaves_an_http_endpoint_in_plain_text(
    variable: str, endpoint: str | None,
) -> None:
    # The specification: _INSECURE applies only to an endpoint without an http
    # or https scheme; "false" turned on TLS for http://, the default included.
    config = resolve_config(protocol="grpc", endpoint=endpoint, environ={variable: "false"})
    assert config.insecure is True
    exporter = build_exporter(config)
    assert isinstance(exporter, GrpcExporter) and exporter._insecure is True
    exporter.shutdown()
    env = {variable: "false", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint or "http://c:4317"}
    assert resolve_config(protocol="grpc", environ=env).insecure is True
    # The flag keeps its meaning: insecure=False asks for TLS whatever the scheme.
    assert resolve_config(protocol="grpc", endpoint=endpoint, insecure=False,
                          environ={}).insecure is False


@pytest.mark.parametrize("value", ["yes", "1", "maybe", "on"])
@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_INSECURE",
                                      "OTEL_EXPORTER_OTLP_TRACES_INSECURE"])
def test_a_boolean_variable_neither_true_nor_false_counts_as_false_with_a_warning(
    variable: str, value: str,
) -> None:
    # The specification: any value but a case-insensitive "true" MUST be
    # false, with a warning. It was refused.
    config = resolve_config(protocol="grpc", endpoint="c:4317", environ={variable: value})
    assert config.insecure is False
    assert config.warnings == (
        f'otel: {variable} "{value}" is not true or false, so it counts as false (TLS), as '
        "the OpenTelemetry specification says: write true for plain text, or false",)
    assert resolve_config(protocol="grpc", endpoint="c:4317",
                          environ={variable: " TRUE "}).warnings == ()
    # Where the scheme decides, the variable is not read, so not warned of.
    assert resolve_config(protocol="grpc", environ={variable: value}).warnings == ()
    assert resolve_config(environ={variable: value}).warnings == ()


@pytest.mark.parametrize(("kw", "said"), [
    ({"insecure": "false"}, "otel: insecure is a str ('false'), not True, False or None"),
    ({"insecure": 1}, "otel: insecure is an int (1), not True, False or None"),
    ({"timeout": "5"}, "otel: timeout is a str ('5'), not a number of seconds, nor None"),
    ({"timeout": True}, "otel: timeout is a bool (True), not a number of seconds, nor None"),
    ({"endpoint": 5}, "otel: endpoint is an int (5), not a str, nor None"),
    ({"protocol": 1}, "otel: protocol is an int (1), not a str, nor None"),
    ({"exporter": b"otlp"}, "otel: exporter is a bytes (b'otlp'), not a str, nor None"),
    ({"headers": "a=b"}, "otel: headers is a str, not a mapping of header names to "
     "values (str to str), nor None"),
    ({"headers": [("a", "b")]}, "otel: headers is a list, not a mapping of header names to "
     "values (str to str), nor None"),
    ({"headers": {"a": 1}}, 'otel: header "a" is given an int, not a str'),
    ({"headers": {"a": None}}, 'otel: header "a" is given None, not a str'),
    ({"headers": {1: "b"}}, "otel: headers has a name that is an int (1), not a str"),
    ({"environ": ["OTEL_X"]}, "otel: environ is a list, not a mapping of variable names to "
     "values, nor None (for os.environ)"),
])
def test_resolve_config_refuses_arguments_of_the_wrong_type_in_one_sentence(
    kw: dict[str, Any], said: str,
) -> None:
    # insecure="false" gave plain text; the others raised a TypeError or an
    # AttributeError from deep inside.
    kw.setdefault("environ", {})
    with pytest.raises(ConfigError) as caught:
        resolve_config(**kw)
    assert str(caught.value) == said


def test_an_insecure_argument_beats_the_variables() -> None:
    env = {"OTEL_EXPORTER_OTLP_INSECURE": "false"}
    assert resolve_config(protocol="grpc", endpoint="a:1", insecure=True, environ=env).insecure


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("env", [
    {"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317"},
    {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c:4317/v1/traces"},
])
def test_an_insecure_variable_yields_to_an_https_endpoint(
    protocol: str, env: dict[str, str],
) -> None:
    # Unlike --insecure, which an https URL contradicts (refused), the
    # variables yield to the scheme, as the specification says.
    assert resolve_config(protocol=protocol, environ=env).insecure is False


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


# -- values the exporter could never use are refused before anything is sent --

_HTTP = "http/protobuf"


@pytest.mark.parametrize(("protocol", "value", "problem"), [
    (_HTTP, "http://[::1", "it is not a URL (Invalid IPv6 URL)"),
    ("grpc", "http://[::1", "it is not a URL (Invalid IPv6 URL)"),
    (_HTTP, "notaurl", "it has no http:// or https:// in front"),
    (_HTTP, "collector:4318", "it has no http:// or https:// in front"),
    (_HTTP, "ftp://x/", 'its scheme "ftp" is not http or https'),
    ("grpc", "ftp://x/", 'its scheme "ftp" is not http or https'),
    (_HTTP, "http://host:99999/", 'port "99999" is not a number from 1 to 65535'),
    ("grpc", "https://host:0", 'port "0" is not a number from 1 to 65535'),
    ("grpc", "host:99999", 'port "99999" is not a number from 1 to 65535'),
    (_HTTP, "http://host:+1/", 'port "+1" is not a number from 1 to 65535'),
    (_HTTP, "http://:4318", "it names no host"),
    (_HTTP, "http://bad host:4318", "it holds U+0020"),
    (_HTTP, "http://b<d:4318", 'host "b<d" is not a host name or address'),
    ("grpc", "[::1:4317", 'its IPv6 address has no closing "]"'),
    ("grpc", "notaurl", "give the port too, such as notaurl:4317"),
    ("grpc", "unix:", "a gRPC unix: target needs an address"),
    (_HTTP, "http://host:4318/v1/\ttraces", "it holds U+0009"),
    ("grpc", "dns:///host :4317", "it holds U+0020"),
])
@pytest.mark.parametrize("source", [
    "--endpoint", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"])
def test_a_malformed_endpoint_is_one_sentence_naming_it_and_where_it_came_from(
    source: str, protocol: str, value: str, problem: str,
) -> None:
    # 'http://[::1' raised urllib's ValueError (a traceback); the others were
    # accepted and then retried for ever as if the collector were down.
    kw: dict[str, Any] = ({"endpoint": value, "environ": {}} if source == "--endpoint"
                          else {"environ": {source: value}})
    with pytest.raises(ConfigError) as caught:
        resolve_config(protocol=protocol, **kw)
    message = str(caught.value)
    shown = value.encode("unicode_escape").decode()  # a tab shows as \t
    assert message.startswith(f'otel: {source} "{shown}": {problem}'), message
    assert "\n" not in message and len(message.splitlines()) == 1


@pytest.mark.parametrize("endpoint", [
    "localhost:4317", "127.0.0.1:4317", "[::1]:4317", "http://collector:4317",
    "https://collector", "unix:///run/otel.sock", "unix:relative.sock", "dns:///collector:4317",
    "ipv4:127.0.0.1:4317",
])
def test_a_grpc_endpoint_may_be_host_port_a_url_or_a_grpc_target(endpoint: str) -> None:
    assert resolve_config(protocol="grpc", endpoint=endpoint, environ={}).endpoint == endpoint


def test_an_empty_endpoint_argument_is_refused_and_an_empty_variable_is_unset() -> None:
    for empty in ("", "  "):
        with pytest.raises(ConfigError, match=r'^otel: --endpoint "\s*": give the collector'):
            resolve_config(endpoint=empty, environ={})
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:1"}
    assert resolve_config(environ=env).endpoint == "http://c:1/v1/traces"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}
    assert resolve_config(protocol="grpc", environ=env).endpoint == "http://localhost:4317"


@pytest.mark.parametrize(("protocol", "headers", "said"), [
    (_HTTP, {"k": "v\nx"}, 'header "k" (from --header): its value holds U+000A'),
    (_HTTP, {"k": "v\rx"}, 'header "k" (from --header): its value holds U+000D'),
    (_HTTP, {"k": "v€"}, 'header "k" (from --header): its value holds "€" (U+20AC)'),
    (_HTTP, {"k": "v\x7f"}, 'header "k" (from --header): its value holds U+007F'),
    (_HTTP, {"bad key": "v"}, 'header "bad key" (from --header): a header name is letters'),
    (_HTTP, {"k:x": "v"}, 'header "k:x" (from --header): a header name is letters'),
    ("grpc", {"k": "é"}, 'header "k" (from --header): its value holds "é" (U+00E9); a gRPC'),
    ("grpc", {"k": "a\tb"}, 'header "k" (from --header): its value holds U+0009; a gRPC'),
    ("grpc", {"x!y": "v"}, 'header "x!y" (from --header): a gRPC metadata name holds only'),
    ("grpc", {"k-bin": "v"}, 'header "k-bin" (from --header): a name ending in -bin'),
])
def test_a_header_the_transport_could_never_send_is_refused(
    protocol: str, headers: dict[str, str], said: str,
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_config(protocol=protocol, headers=headers, environ={})
    assert str(caught.value).startswith("otel: " + said), str(caught.value)
    # The value may be a secret: the header is named, its value not shown.
    assert all(v not in str(caught.value) for v in headers.values() if len(v) > 1)
    # The same from the variables, where values are percent-decoded first.
    env_value = ",".join(f"{k}={quote(v)}" for k, v in headers.items())
    for name in ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"):
        with pytest.raises(ConfigError) as caught:
            resolve_config(protocol=protocol, environ={name: env_value})
        assert str(caught.value).startswith("otel: " + said.replace("--header", name))


def test_headers_a_collector_takes_pass() -> None:
    ok = {"authorization": "Bearer abc.DEF-_~+/=", "x-tenant": "Zürich\tnord", "e": ""}
    assert dict(resolve_config(headers=ok, environ={}).headers) == ok
    grpc_ok = {"authorization": "Bearer abc", "x-tenant.id_2": "a b"}
    assert dict(resolve_config(protocol="grpc", headers=grpc_ok, environ={}).headers) == grpc_ok


@pytest.mark.parametrize(("env", "protocol", "compression"), [
    ({}, _HTTP, "none"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": ""}, _HTTP, "none"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": " GZIP "}, _HTTP, "gzip"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"}, _HTTP, "deflate"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
      "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none"}, "grpc", "none"),
    ({"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip"}, "grpc", "gzip"),
])
def test_compression_follows_the_specific_then_the_generic_variable(
    env: dict[str, str], protocol: str, compression: str,
) -> None:
    config = resolve_config(protocol=protocol, environ=env)
    assert config.compression == compression
    exporter = build_exporter(config)  # the SDK's gRPC exporter raised on "none"
    assert exporter is not None
    if protocol == "grpc":
        assert isinstance(exporter, GrpcExporter)
        assert exporter._compression.name.lower() == {"none": "nocompression"}.get(
            compression, compression)
    else:
        assert isinstance(exporter, HttpExporter)
        assert exporter._compression.value == compression
    exporter.shutdown()


@pytest.mark.parametrize(("env", "protocol", "message"), [
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "bad"}, _HTTP,
     'otel: OTEL_EXPORTER_OTLP_COMPRESSION "bad": gzip, deflate, or none'),
    ({"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zstd"}, "grpc",
     'otel: OTEL_EXPORTER_OTLP_TRACES_COMPRESSION "zstd": gzip or none'),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"}, "grpc",
     'otel: OTEL_EXPORTER_OTLP_COMPRESSION "deflate": gzip or none over grpc (a collector\'s '
     "gRPC receiver does not take deflate; http/protobuf does)"),
])
def test_an_unknown_compression_is_refused_instead_of_the_sdks_warning(
    env: dict[str, str], protocol: str, message: str,
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_config(protocol=protocol, environ=env)
    assert str(caught.value) == message


@pytest.mark.parametrize(("raw", "problem"), [
    ("garbage", '"garbage" is not key=value'),
    ("team=a,garbage", '"garbage" is not key=value'),
    ("=x", '"=x" has no key'),
    ("team=100%", '"team=100%" has a % that is not a percent escape'),
    ("team=%FF", '"team=%FF" decodes to bytes that are not UTF-8'),
])
def test_resource_attributes_that_do_not_decode_are_discarded_whole_with_a_warning(
    raw: str, problem: str,
) -> None:
    # The resource SDK specification: on any error, discard the entire value
    # and report it; the export goes on.
    config = resolve_config(environ={"OTEL_RESOURCE_ATTRIBUTES": raw, "OTEL_SERVICE_NAME": "s"})
    attrs = dict(config.resource().attributes)
    assert "team" not in attrs and attrs["service.name"] == "s"
    (warning,) = config.warnings
    assert warning.startswith(f'otel: OTEL_RESOURCE_ATTRIBUTES "{raw}" is ignored, all of it: '
                              f"{problem}"), warning
    good = resolve_config(environ={"OTEL_RESOURCE_ATTRIBUTES": " team=a%2Cb , ,x=1"})
    assert good.warnings == () and good.resource().attributes["team"] == "a,b"


def test_otlp_settings_are_not_checked_for_the_console_or_none_exporter() -> None:
    stale = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1", "OTEL_EXPORTER_OTLP_HEADERS": "a b=c",
             "OTEL_EXPORTER_OTLP_COMPRESSION": "bad", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
    for kind in ("console", "none"):
        assert resolve_config(environ={**stale, "OTEL_TRACES_EXPORTER": kind}).exporter == kind


def test_an_exporter_that_is_shut_down_reports_failure_rather_than_raising() -> None:
    exporter = build_exporter(resolve_config(environ={}))
    assert exporter is not None
    exporter.shutdown()
    assert exporter.export([]) is SpanExportResult.FAILURE


@pytest.mark.parametrize("name", ["OTEL_EXPORTER_OTLP_CERTIFICATE",
                                  "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY"])
def test_a_tls_file_variable_naming_nothing_readable_is_refused(tmp_path, name: str) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigError) as caught:
        resolve_config(environ={name: missing})
    assert str(caught.value) == (f'otel: {name} "{missing}" is not a file this user can read: '
                                 "name the PEM file, or unset it")
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    resolve_config(environ={name: str(pem)})  # a readable file is the SDK's to judge


@pytest.mark.parametrize(("env", "files"), [
    ({"OTEL_EXPORTER_OTLP_CERTIFICATE": " {ca} "}, ("{ca}", None)),
    ({"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "\t", "OTEL_EXPORTER_OTLP_CERTIFICATE": "{ca}"},
     ("{ca}", None)),
    ({"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "{ca}", "OTEL_EXPORTER_OTLP_CERTIFICATE": "{x}"},
     ("{ca}", None)),
    ({"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "{crt} ", "OTEL_EXPORTER_OTLP_CLIENT_KEY": " {key}",
      "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": ""}, (True, ("{crt}", "{key}"))),
    ({"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": " "}, (True, None)),
])
def test_the_http_exporter_is_given_the_stripped_tls_files_that_were_checked(
    tmp_path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], files: tuple[Any, Any],
) -> None:
    # The SDK's HTTP exporter read the variables raw: a path with a space
    # around it passed the check and failed every export ("invalid path").
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "x", "crt", "key")}
    for path in paths.values():
        path.write_text("-----BEGIN CERTIFICATE-----\n")
    env = {k: v.format(**paths) for k, v in env.items()}
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    exporter = build_exporter(resolve_config())
    assert isinstance(exporter, HttpExporter)
    session = exporter._client._transport._session  # type: ignore[attr-defined]
    verify, cert = files
    assert session.verify == (verify if verify is True else verify.format(**paths))
    assert session.cert == (None if cert is None else tuple(c.format(**paths) for c in cert))
    exporter.shutdown()


def test_a_header_value_the_sdk_finds_malformed_is_never_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    # The SDK's header parser logged the whole variable while the exporter was
    # built, before anything took its loggers: the secret on stderr.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cr3t;tok")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", raising=False)
    config = resolve_config()
    assert dict(config.headers) == {"x-api-key": "s3cr3t;tok"}
    for protocol in ("http/protobuf", "grpc"):
        with caplog.at_level(logging.DEBUG):
            exporter = build_exporter(resolve_config(protocol=protocol))
        assert exporter is not None
        exporter.shutdown()
    assert "s3cr3t" not in caplog.text


def test_an_endpoint_password_is_never_printed() -> None:
    from agentrt_otel.config import redacted

    assert redacted("http://user:TOPSECRET@collector:4318/v1/traces") == (
        "http://user:***@collector:4318/v1/traces")
    assert redacted("http://token@collector:4318") == "http://token@collector:4318"
    assert redacted("http://collector:4318/a@b") == "http://collector:4318/a@b"
    with pytest.raises(ConfigError) as caught:
        resolve_config(endpoint="http://user:TOPSECRET@collector:99999/", environ={})
    assert "TOPSECRET" not in str(caught.value) and "user:***@" in str(caught.value)
    # A gRPC target without a scheme: the whole of it is echoed, its password not.
    assert redacted("user:TOPSECRET@collector:4317") == "user:***@collector:4317"
    with pytest.raises(ConfigError) as caught:
        resolve_config(protocol="grpc", endpoint="user:TOPSECRET@collector:4317", environ={})
    assert "TOPSECRET" not in str(caught.value) and 'host "user:***@collector"' in str(
        caught.value)


# -- header variables, read as the SDK exporters read them ----------------------

@pytest.mark.parametrize("raw", [
    "X-Tenant=blue%20team,Api-Key=k%3D1",
    "X%2DTenant=blue",  # a name percent-encoded: decoded, as its value would be
    "%41uthorization=Bearer%20t",  # decoded, then lowercased
    "A=1,a=2",  # a name given twice keeps its last value
    "X%2DA=1,x-a=2",  # ... the same name once decoded
    " key = value ,, k=a=b,",
    "a=%20x%20",  # stripped after decoding
    "%20x=1",
    "Authorization=Bearer abc%2F,x%2Dy=1",  # a raw space: that entry taken as written
])
def test_header_variables_read_as_the_sdk_reads_them(raw: str) -> None:
    # The SDK's HTTP exporter reads the variable itself and adds what it finds
    # to the headers it is given: a name decoded differently was sent twice
    # ("x%2dtenant" and "x-tenant"), and gRPC refused "x%2dtenant" outright.
    from opentelemetry.util.re import parse_env_headers

    sdk = dict(parse_env_headers(raw, liberal=True))
    for name in ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"):
        assert dict(resolve_config(environ={name: raw}).headers) == sdk


@pytest.mark.parametrize(("raw", "said"), [
    # The SDK sends "x y" (which no HTTP server takes), "" and U+FFFD.
    ("x%20y=1", 'header name "x%20y" decodes to "x y", which is not a header name (letters, '
     "digits and !#$%&'*+-.^_`|~, with no spaces); percent-encode values only"),
    ("%20=1", 'header name "%20" decodes to "", which is not a header name'),
    ("%FF=1", 'header name "%FF" has percent escapes that are not UTF-8; write the name as it '
     "is, in ASCII"),
    ("a%3Ab=1", 'header name "a%3Ab" decodes to "a:b", which is not a header name'),
])
def test_a_header_name_that_decodes_to_no_header_name_is_refused(raw: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_config(environ={"OTEL_EXPORTER_OTLP_HEADERS": raw})
    assert str(caught.value).startswith("otel: OTEL_EXPORTER_OTLP_HEADERS: " + said)


def test_a_header_flag_is_taken_as_written_not_percent_decoded() -> None:
    # Only the variables are percent-encoded (W3C Baggage's form); a flag's
    # value, such as a token holding "%2F", is sent as typed.
    config = resolve_config(headers={"Authorization": "Bearer a%2Fb"}, environ={})
    assert dict(config.headers) == {"authorization": "Bearer a%2Fb"}


# -- two exporters built at once (two followers in one process) ----------------


@pytest.mark.parametrize(("protocol", "hook"), [
    ("grpc", "grpc_proxy"), ("http/protobuf", "checked_http_session")])
def test_two_exporters_built_at_once_both_read_the_blank_variables_as_unset_and_log_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, protocol: str, hook: str,
) -> None:
    """A build hid the blank variables and silenced the SDK's header parser
    for the whole process, then put both back while a second build's SDK
    constructor still read them: a ValueError for the blank timeout over
    gRPC, the secret logged over HTTP. ``hook`` runs inside a build, between
    the hiding and the SDK's constructor; the first build waits there for the
    second to get as far (it cannot, once builds are serialised: then it
    waits out the pause), and the second builds after the first is done."""
    import threading

    import agentrt_otel.answers as answers

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cr3t;tok")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", raising=False)
    config = resolve_config(protocol=protocol, endpoint="http://127.0.0.1:4317")
    real = getattr(answers, hook)
    first_inside, second_inside, first_done = (threading.Event(), threading.Event(),
                                               threading.Event())

    def paused(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "first":
            first_inside.set()
            second_inside.wait(2)
        else:
            second_inside.set()
            first_done.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(answers, hook, paused)
    failed: dict[str, BaseException] = {}

    def build(name: str) -> None:
        try:
            exporter = build_exporter(config)
            assert exporter is not None
            exporter.shutdown()
        except BaseException as err:  # noqa: BLE001 - told to the test below
            failed[name] = err
        finally:
            if name == "first":
                first_done.set()

    with caplog.at_level(logging.DEBUG):
        first = threading.Thread(target=build, args=("first",), name="first")
        first.start()
        assert first_inside.wait(10)
        second = threading.Thread(target=build, args=("second",), name="second")
        second.start()
        first.join(30)
        second.join(30)
    assert failed == {}
    assert "s3cr3t" not in caplog.text
    assert [r for r in caplog.records if r.name.startswith("opentelemetry")] == []
    assert os.environ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"] == ""


def test_the_blank_variables_hidden_for_a_build_are_put_back_and_one_set_meanwhile_stays_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentrt_otel.config import _read_as_resolved

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", " ")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "")
    with _read_as_resolved():
        assert "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT" not in os.environ
        assert "OTEL_EXPORTER_OTLP_TIMEOUT" not in os.environ
        os.environ["OTEL_EXPORTER_OTLP_TIMEOUT"] = "5000"
    assert os.environ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"] == " "
    assert os.environ["OTEL_EXPORTER_OTLP_TIMEOUT"] == "5000"


# -- an environ argument holds text only ---------------------------------------


@pytest.mark.parametrize(("environ", "said"), [
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": 5000},
     'otel: environ variable "OTEL_EXPORTER_OTLP_TIMEOUT" is an int, not a str'),
    ({"OTEL_TRACES_EXPORTER": None}, 'otel: environ variable "OTEL_TRACES_EXPORTER" is None, '
     "not a str"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": b"x-api-key=s3cr3t"},
     'otel: environ variable "OTEL_EXPORTER_OTLP_HEADERS" is a bytes, not a str'),
    ({"OTEL_EXPORTER_OTLP_INSECURE": True, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     'otel: environ variable "OTEL_EXPORTER_OTLP_INSECURE" is a bool, not a str'),
    ({"UNRELATED": 1}, 'otel: environ variable "UNRELATED" is an int, not a str'),
    ({5: "x"}, "otel: environ has a variable name that is an int (5), not a str"),
    ({b"OTEL_SERVICE_NAME": "x"},
     "otel: environ has a variable name that is a bytes (b'OTEL_SERVICE_NAME'), not a str"),
])
def test_resolve_config_refuses_an_environ_entry_that_is_not_text_naming_the_type_alone(
    environ: dict[Any, Any], said: str,
) -> None:
    # They failed deep inside: "'int' object has no attribute 'encode'"; a
    # {5: "x"} was taken. The value is never shown: it may be a secret.
    with pytest.raises(ConfigError) as caught:
        resolve_config(environ=environ)
    assert str(caught.value) == said


# -- OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES, read by the SDK ------

_RETRYABLE = "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES"


@pytest.mark.parametrize(("value", "bad"), [
    ("UNAVAILABLE,SOMETIMES", "SOMETIMES"),
    ("unavailable, 14", "14"),
    ("UNAVAILABLE;ABORTED", "UNAVAILABLE;ABORTED"),
    ("STATUS_CODE.UNAVAILABLE", "STATUS_CODE.UNAVAILABLE"),
])
def test_a_grpc_retryable_error_code_that_is_no_status_code_is_refused_in_one_sentence(
    value: str, bad: str,
) -> None:
    """The SDK's gRPC exporter looked each name up itself when built: a
    KeyError traceback."""
    import grpc

    names = ", ".join(code.name for code in grpc.StatusCode)
    with pytest.raises(ConfigError) as caught:
        resolve_config(protocol="grpc", environ={_RETRYABLE: value})
    assert str(caught.value) == (
        f'otel: {_RETRYABLE} "{value}": "{bad}" is not a gRPC status code; give a '
        f"comma-separated list of the names {names}, or unset it")


@pytest.mark.parametrize("value", ["UNAVAILABLE", " unavailable , Deadline_Exceeded ,",
                                   "RESOURCE_EXHAUSTED,ABORTED", " ", ","])
def test_grpc_retryable_error_codes_the_sdk_reads_are_taken(value: str) -> None:
    config = resolve_config(protocol="grpc", endpoint="http://127.0.0.1:4317",
                            environ={_RETRYABLE: value})
    assert config.protocol == "grpc"


def test_grpc_retryable_error_codes_are_not_checked_where_no_grpc_exporter_reads_them() -> None:
    for kw in ({}, {"protocol": "http/protobuf"}, {"exporter": "console", "protocol": "grpc"}):
        resolve_config(**kw, environ={_RETRYABLE: "SOMETIMES"})


def test_a_bad_grpc_retryable_code_in_the_process_environment_is_refused_whatever_environ_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK reads this variable from os.environ when the exporter is built,
    not from the mapping given: a bad value there passed resolve_config and
    build_exporter raised KeyError (review of the check)."""
    monkeypatch.setenv(_RETRYABLE, "UNAVAILABLE,BOGUS")
    with pytest.raises(ConfigError, match='"BOGUS" is not a gRPC status code'):
        resolve_config(protocol="grpc", environ={})
