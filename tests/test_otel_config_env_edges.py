"""What the SDK's exporters read for themselves, raw, when they are built, is
read as ``agentrt-export otel`` reads it: a blank variable counts as unset, a
TLS file path is the stripped one that was checked, a header value is never
printed, and a boolean that is not true is false. And a collector's own words
for a refusal reach the outage line whole. As real processes against real
receivers on 127.0.0.1."""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
import pytest
from otlp_receivers import TLS_CA, GrpcReceiver, HttpReceiver
from test_otel_cli import RETRIED_ONCE, expected_keys, received_keys, run_otel, scenario_db
from test_otel_config_cli import outage_lines

from agentrt_otel.complaints import gist

# -- a blank variable counts as unset, whatever the SDK reads itself ------------


@pytest.mark.parametrize("blank", [
    {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": ""},
    {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": " "},
    {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "", "OTEL_EXPORTER_OTLP_TIMEOUT": "5000"},
    {"OTEL_EXPORTER_OTLP_TIMEOUT": " "},
    {"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": " ", "OTEL_EXPORTER_OTLP_COMPRESSION": ""},
    {"OTEL_EXPORTER_OTLP_TRACES_HEADERS": " ", "OTEL_EXPORTER_OTLP_HEADERS": ""},
    {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": " ", "OTEL_EXPORTER_OTLP_INSECURE": ""},
    {"OTEL_PYTHON_EXPORTER_OTLP_GRPC_CREDENTIAL_PROVIDER": " "},
])
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_an_empty_traces_timeout_counts_as_unset_over_grpc_too(tmp_path, protocol, blank):
    """The SDK's gRPC exporter did float() of OTEL_EXPORTER_OTLP_TRACES_TIMEOUT
    itself: "" ended the command in a ValueError traceback. Every OTLP
    variable the SDK reads in its constructors is here blank, over both."""
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    receiver_type = GrpcReceiver if protocol == "grpc" else HttpReceiver
    with receiver_type() as receiver:
        done = run_otel(db, "--protocol", protocol, "--endpoint", receiver.endpoint,
                        "--cursor-file", str(tmp_path / "cursor"), env=blank, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert received_keys(receiver) == expected_keys(events)


# -- the TLS files the SDK reads: the stripped ones checked ----------------------


@pytest.mark.parametrize("env", [
    {"OTEL_EXPORTER_OTLP_CERTIFICATE": TLS_CA + " "},
    {"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": " " + TLS_CA + "\t"},
    {"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": " ", "OTEL_EXPORTER_OTLP_CERTIFICATE": TLS_CA},
])
@pytest.mark.parametrize(("protocol", "receiver_type"), [
    ("http/protobuf", HttpReceiver), ("grpc", GrpcReceiver)])
def test_a_tls_file_path_with_white_space_around_it_is_the_file_sent(
        tmp_path, protocol, receiver_type, env):
    """The check stripped the path, the SDK's HTTP exporter read it raw: every
    HTTPS export failed for ever ("invalid path"). A blank traces-specific
    variable counts as unset (the generic CA is used) over both transports,
    and over gRPC the SDK no longer logs a FileNotFoundError traceback for it."""
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with receiver_type(tls=True) as receiver:
        done = run_otel(db, "--protocol", protocol, "--endpoint", receiver.endpoint,
                        "--cursor-file", str(tmp_path / "cursor"), timeout=20,
                        env={**env, **RETRIED_ONCE})
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert received_keys(receiver) == expected_keys(events)


@pytest.mark.parametrize("blank", [
    {"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": " "},
    {"OTEL_EXPORTER_OTLP_CERTIFICATE": ""},
    {"OTEL_PYTHON_EXPORTER_OTLP_GRPC_CREDENTIAL_PROVIDER": " "},
    {"OTEL_PYTHON_EXPORTER_OTLP_GRPC_TRACES_CREDENTIAL_PROVIDER": ""},
])
def test_a_blank_tls_variable_over_grpc_is_unset_not_a_file_or_plugin_the_sdk_looks_for(
        tmp_path, blank):
    """With no CA named (the system's CAs), the SDK's gRPC exporter took a
    blank certificate variable for a file (a FileNotFoundError traceback
    logged) and a blank credential provider for a plugin's name (a
    RuntimeError traceback). Here the test CA is not the system's: the
    command goes on to its outage line, and says nothing else."""
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with GrpcReceiver(tls=True) as receiver:
        lines = outage_lines(db, cursor, "--protocol", "grpc", "--endpoint", receiver.endpoint,
                             marker=b"failed (",
                             env={**blank, "OTEL_EXPORTER_OTLP_TIMEOUT": "1000"})
    assert lines[0].startswith(f"otel: exporting 20 spans failed ({receiver.endpoint}: "), lines
    assert not any("Failed to read file" in line or "Requested component" in line
                   for line in lines), lines


# -- a header value is never printed ------------------------------------------------


def test_a_header_value_the_sdk_finds_malformed_is_sent_as_parsed_and_never_printed(tmp_path):
    """The SDK's header parser logged the whole variable, the secret with it,
    while the HTTP exporter was built."""
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with HttpReceiver() as receiver:
        base = receiver.endpoint.removesuffix("/v1/traces")
        done = run_otel(db, "--cursor-file", str(tmp_path / "cursor"), timeout=20,
                        env={"OTEL_EXPORTER_OTLP_ENDPOINT": base,
                             "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s3cr3t;tok"})
    assert done.returncode == 0, done.stderr
    assert b"s3cr3t" not in done.stderr
    assert done.stderr == b""
    assert {h.get("x-api-key") for h in receiver.headers} == {"s3cr3t;tok"}
    assert received_keys(receiver) == expected_keys(events)


# -- the scheme decides plain text or TLS; the _INSECURE variables, without one ---


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_INSECURE",
                                      "OTEL_EXPORTER_OTLP_TRACES_INSECURE"])
def test_an_insecure_false_variable_leaves_an_http_grpc_endpoint_in_plain_text(
        tmp_path, variable):
    """INSECURE=false turned on TLS for http://: a plain-text collector's
    every attempt failed its handshake, for ever."""
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with GrpcReceiver() as receiver:
        done = run_otel(db, "--cursor-file", str(tmp_path / "cursor"), timeout=20,
                        env={"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                             "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                             variable: "false"})
    assert receiver.endpoint.startswith("http://")
    assert done.returncode == 0, done.stderr
    assert received_keys(receiver) == expected_keys(events)


def test_an_insecure_variable_neither_true_nor_false_is_false_with_one_warning(tmp_path):
    """The OpenTelemetry specification: any value but "true" is false, with a
    warning. It was refused (exit 2). Here it counts (a host:port endpoint),
    so TLS is asked of a plain-text collector: the outage line says so."""
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with GrpcReceiver() as receiver:
        lines = outage_lines(db, cursor, "--protocol", "grpc", "--endpoint",
                             f"127.0.0.1:{receiver.port}", marker=b"failed (",
                             env={"OTEL_EXPORTER_OTLP_INSECURE": "yes",
                                  "OTEL_EXPORTER_OTLP_TIMEOUT": "1000"})
    assert lines[0] == ('otel: OTEL_EXPORTER_OTLP_INSECURE "yes" is not true or false, so it '
                        "counts as false (TLS), as the OpenTelemetry specification says: "
                        "write true for plain text, or false")
    assert "TLS handshake failed" in lines[1]
    assert receiver.spans() == []


# -- a collector's details reach the outage line whole ----------------------------


@pytest.mark.parametrize(("details", "said"), [
    ("x-api-key header: not valid for tenant acme", "x-api-key header: not valid for tenant acme"),
    ("invalid token: signature expired", "invalid token: signature expired"),
    ("tenant acme: quota exceeded for traces", "tenant acme: quota exceeded for traces"),
    ("span name: " + "x" * 300, ("span name: " + "x" * 300)[:200 - len("StatusCode.X: ")]),
])
def test_a_collectors_details_are_kept_whole_up_to_200_characters(details, said):
    # Everything up to the last ": " was dropped, as if it were gRPC's preamble.
    message = ("Failed to export traces to c:4317, error code: StatusCode.X, error details: "
               + details)
    assert gist(message) == f"StatusCode.X: {said}"


@pytest.mark.parametrize(("details", "said"), [
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to "
     "connect to remote host: Connection refused", "Connection refused"),
    ("failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:4317: "
     "Socket closed", "Socket closed"),
    ("DNS resolution failed for collector.invalid:4317: C-ares status is not ARES_SUCCESS "
     "qtype=A name=collector.invalid is_balancer=0: Domain name not found",
     "Domain name not found"),
    ("errors resolving collector.invalid:4317: [field:hostname lookup error:address lookup "
     "failed for collector.invalid:4317: Domain name not found]", "Domain name not found"),
])
def test_grpcs_own_connection_failure_preambles_are_still_shortened(details, said):
    message = (f"Failed to export traces to c:4317, error code: StatusCode.UNAVAILABLE, "
               f"error details: {details}")
    assert gist(message) == f"StatusCode.UNAVAILABLE: {said}"


def test_a_grpc_refusal_names_the_collectors_whole_reason_in_the_outage_line(tmp_path):
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class Refusing(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - generated name
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "x-api-key header: not valid for tenant acme")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Refusing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        lines = outage_lines(db, cursor, "--protocol", "grpc", "--endpoint",
                             f"http://127.0.0.1:{port}", marker=b"failed (")
    finally:
        server.stop(grace=None).wait(5)
    assert lines[0].startswith(
        f"otel: exporting 20 spans failed (http://127.0.0.1:{port}: StatusCode.UNAUTHENTICATED: "
        "x-api-key header: not valid for tenant acme); retrying")


# -- OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES, read by the SDK itself --

_RETRYABLE = "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES"


def test_a_grpc_retryable_error_code_that_is_no_status_code_is_one_sentence_and_exit_2(
        tmp_path):
    """The SDK's gRPC exporter looked "SOMETIMES" up itself when built: exit 1
    with a KeyError traceback. Now it is refused as every unusable setting is,
    before anything is sent."""
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    before = (tmp_path / "runs.db").read_bytes()
    done = run_otel(db, "--protocol", "grpc", "--endpoint", "http://127.0.0.1:1",
                    "--cursor-file", str(tmp_path / "cursor"),
                    env={_RETRYABLE: "UNAVAILABLE,SOMETIMES"})
    err = done.stderr.decode()
    assert done.returncode == 2, err
    first = err.splitlines()[0]
    assert first.startswith(f'usage: otel: {_RETRYABLE} "UNAVAILABLE,SOMETIMES": "SOMETIMES" is '
                            "not a gRPC status code; give a comma-separated list of the names "
                            "OK, CANCELLED, UNKNOWN, "), err
    assert first.endswith(", UNAUTHENTICATED, or unset it"), err
    assert "Traceback" not in err and "KeyError" not in err
    assert done.stdout == b""
    assert not (tmp_path / "cursor").exists()
    assert (tmp_path / "runs.db").read_bytes() == before


def test_grpc_retryable_error_codes_the_sdk_takes_leave_the_export_as_it_was(tmp_path):
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with GrpcReceiver() as receiver:
        done = run_otel(db, "--protocol", "grpc", "--endpoint", receiver.endpoint,
                        "--cursor-file", str(tmp_path / "cursor"), timeout=20,
                        env={_RETRYABLE: " unavailable, Resource_Exhausted ,"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert received_keys(receiver) == expected_keys(events)
