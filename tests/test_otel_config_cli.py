"""`agentrt-export otel`'s configuration, audited as a real process against
receivers on 127.0.0.1: what a user could plausibly get wrong is refused in
one sentence (exit 2, nothing sent, no cursor), said in a warning when the
OpenTelemetry specification defines it, or said in one outage line."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from eventdb import child_env, child_process
from otlp_receivers import GrpcReceiver, HttpReceiver
from test_otel_cli import (
    RETRIED_ONCE,
    _stderr_until,
    expected_keys,
    received_keys,
    run_otel,
    scenario_db,
)


@contextmanager
def answering(status: int, body: bytes, content_type: str,
              reason: str | None = None) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering every POST alike (with the
    status's usual reason unless ``reason`` is given); yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(status, reason)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _read_request(conn: socket.socket) -> None:
    """Read an HTTP request whole (closing on unread bytes would reset the
    connection instead of closing it); anything else until a pause."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while found and len(body) < int(found.group(1)):
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


@contextmanager
def raw_server(answer: bytes, taken: list[int] | None = None) -> Iterator[int]:
    """A TCP server on 127.0.0.1 that reads what a client sends, writes
    ``answer`` (perhaps nothing) and closes, on every connection; yields its
    port. ``taken`` gets one item per connection it took."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            if taken is not None:
                taken.append(1)
            with conn:
                conn.settimeout(1)
                with suppress(OSError):
                    _read_request(conn)
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        listener.close()


def outage_lines(db: str, cursor: str, *args: str, marker: bytes,
                 env: dict[str, str] | None = None,
                 whole_env: dict[str, str] | None = None) -> list[str]:
    """Run the command (no OTEL_* variables but ``env``; or in ``whole_env``)
    until ``marker`` is on stderr, stop it with SIGTERM, and return its stderr
    lines; it must have stopped cleanly without creating the cursor."""
    full = {k: v for k, v in child_env().items() if not k.startswith("OTEL_")}
    full.update(env or {})
    if whole_env is not None:
        full = whole_env
    with child_process([sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
                        *args, "--cursor-file", cursor], full) as proc:
        seen = _stderr_until(proc, marker)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    err = (seen + rest).decode()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert not os.path.exists(cursor)
    return err.splitlines()


# -- a collector's answer -------------------------------------------------------

def test_an_http_200_whose_body_is_not_otlp_is_a_failure_not_a_delivery(tmp_path):
    # A web server that is not a collector (a wrong port, an ingress's default
    # page) answering 200 was taken for one: the cursor moved, every span lost.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with answering(200, b"<html>It works!</html>", "text/html") as base:
        lines = outage_lines(db, cursor, "--endpoint", base, marker=b"failed (")
    assert lines[0] == (
        f"otel: exporting 20 spans failed ({base}/v1/traces: HTTP 200 with an answer that is "
        "not OTLP (Content-Type text/html): this URL is not a collector's OTLP/HTTP receiver; "
        "give the collector's, such as http://collector:4318/v1/traces); retrying with "
        "backoff, the cursor stays before this page")


def test_an_otlp_answer_in_json_is_still_an_acceptance(tmp_path):
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    events = scenario_db(db)
    with answering(200, b"{}", "application/json") as base:
        done = run_otel(db, "--endpoint", base, "--cursor-file", str(cursor))
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert cursor.read_text() == f"{events[-1].seq}\n"


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_an_auth_failure_is_one_outage_line_naming_the_endpoint_and_the_cause(tmp_path, protocol):
    # Already so before this audit: pinned. A permanent refusal is retried
    # (the issue: never skipped), and said once, not per attempt.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    if protocol == "http/protobuf":
        with answering(401, b"", "text/plain") as base:
            lines = outage_lines(db, cursor, "--endpoint", base, marker=b"failed (")
        assert lines[0].startswith(f"otel: exporting 20 spans failed ({base}/v1/traces: HTTP 401 "
                                   "Unauthorized); retrying")
        return
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class Refusing(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - generated name
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing api key")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Refusing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        lines = outage_lines(db, cursor, "--protocol", "grpc", "--endpoint",
                             f"http://127.0.0.1:{port}", marker=b"failed (")
    finally:
        server.stop(grace=None).wait(5)
    assert lines[0].startswith(f"otel: exporting 20 spans failed (http://127.0.0.1:{port}: "
                               "StatusCode.UNAUTHENTICATED: missing api key); retrying")
    assert sum("failed (" in line for line in lines) == 1


#: The SDK retries a failure it takes for transient within the export
#: timeout before reporting it: a short one makes the outage line come sooner.
QUICK = {"OTEL_EXPORTER_OTLP_TIMEOUT": "1000"}


@pytest.mark.parametrize(("status", "reason", "said", "env"), [
    # Statuses the SDK retries itself: it logged the bare reason, no status...
    (503, None, "HTTP 503 Service Unavailable", RETRIED_ONCE),
    # ... or, with no time left for its next retry, no cause at all: the line
    # said "no answer within the export timeout" of a collector that answered.
    (503, None, "HTTP 503 Service Unavailable", QUICK),
    (429, None, "HTTP 429 Too Many Requests", QUICK),
    (502, None, "HTTP 502 Bad Gateway", QUICK),
    (504, None, "HTTP 504 Gateway Timeout", QUICK),
    (503, "", "HTTP 503", QUICK),  # no reason at all: the SDK said "None"
    (500, "Overloaded", "HTTP 500 Overloaded", QUICK),  # one it does not retry: already so
])
def test_an_http_refusal_is_said_with_its_status_code(tmp_path, status, reason, said, env):
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with answering(status, b"", "text/plain", reason) as base:
        lines = outage_lines(db, cursor, "--endpoint", base, marker=b"failed (", env=env)
    assert lines[0] == (f"otel: exporting 20 spans failed ({base}/v1/traces: {said}); retrying "
                        "with backoff, the cursor stays before this page")


def test_a_refused_connection_is_said_whatever_the_export_timeout(tmp_path):
    # With no time left for the SDK's next retry, the line said "no answer
    # within the export timeout" of a port that refused at once.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{unused.getsockname()[1]}"
        lines = outage_lines(db, cursor, "--endpoint", endpoint, marker=b"failed (", env=QUICK)
    assert lines[0] == (f"otel: exporting 20 spans failed ({endpoint}/v1/traces: Connection "
                        "refused); retrying with backoff, the cursor stays before this page")


def test_http_protobuf_against_a_grpc_port_says_the_endpoint_speaks_http2(tmp_path):
    # Python's own words were printed: ('Connection aborted.', BadStatusLine('\x00\x00...')).
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with GrpcReceiver() as receiver:
        lines = outage_lines(db, cursor, "--endpoint", receiver.endpoint, marker=b"failed (",
                             env=QUICK)
    assert lines[0] == (
        f"otel: exporting 20 spans failed ({receiver.endpoint}/v1/traces: the endpoint answered "
        "in HTTP/2 frames, not HTTP/1.1, as a gRPC server does: use --protocol grpc, or the "
        "collector's OTLP/HTTP port (usually 4318)); retrying with backoff, the cursor stays "
        "before this page")
    assert receiver.requests == 0


@pytest.mark.parametrize(("answer", "said"), [
    (b"", "the endpoint closed the connection without an HTTP/1.1 answer, as a TLS or gRPC "
     "port may: a TLS one needs an https:// endpoint, a gRPC one --protocol grpc"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "the endpoint did not answer HTTP/1.1 (its answer began "
     "'SSH-2.0-OpenSSH_'): this URL is not a collector's OTLP/HTTP receiver (usually port "
     "4318)"),
])
def test_an_endpoint_that_does_not_answer_http1_is_said_in_one_sentence(tmp_path, answer, said):
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with raw_server(answer) as port:
        lines = outage_lines(db, cursor, "--endpoint", f"http://127.0.0.1:{port}",
                             marker=b"failed (", env=QUICK)
    assert lines[0] == (f"otel: exporting 20 spans failed (http://127.0.0.1:{port}/v1/traces: "
                        f"{said}); retrying with backoff, the cursor stays before this page")


def test_an_https_endpoint_that_is_plain_text_is_said_to_be(tmp_path):
    # requests' own words were printed: HTTPSConnectionPool(...): Max retries exceeded ...
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with HttpReceiver() as receiver:
        endpoint = f"https://127.0.0.1:{receiver.port}"
        lines = outage_lines(db, cursor, "--endpoint", endpoint, marker=b"failed (", env=QUICK)
    assert lines[0] == (
        f"otel: exporting 20 spans failed ({endpoint}/v1/traces: TLS handshake failed (wrong "
        "version number): a plain-text collector needs an http:// endpoint, a TLS one a "
        "certificate this host trusts (OTEL_EXPORTER_OTLP_CERTIFICATE)); retrying with "
        "backoff, the cursor stays before this page")


def test_grpc_against_an_http1_port_says_the_endpoint_is_not_grpc(tmp_path):
    # gRPC's own words were printed: "Failed parsing HTTP/2 (Expected SETTINGS frame ...)".
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with HttpReceiver() as receiver:
        lines = outage_lines(db, cursor, "--protocol", "grpc", "--endpoint", receiver.base,
                             marker=b"failed (", env=QUICK)
    assert lines[0] == (
        f"otel: exporting 20 spans failed ({receiver.base}: StatusCode.UNAVAILABLE: the "
        "endpoint did not answer in HTTP/2, as gRPC does: if it is an OTLP/HTTP port (a "
        "collector's is usually 4318), use --protocol http/protobuf); retrying with backoff, "
        "the cursor stays before this page")
    assert receiver.arrived == 0


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_collector_that_does_not_answer_in_time_is_said_to_be(tmp_path, protocol):
    # gRPC printed its bare "StatusCode.DEADLINE_EXCEEDED: Deadline Exceeded"; HTTP
    # already said so (pinned).
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        lines = outage_lines(db, cursor, "--protocol", protocol, "--endpoint", endpoint,
                             env={"OTEL_EXPORTER_OTLP_TIMEOUT": "300"}, marker=b"failed (")
    finally:
        silent.close()
    code = "StatusCode.DEADLINE_EXCEEDED: " if protocol == "grpc" else ""
    path = "/v1/traces" if protocol == "http/protobuf" else ""
    assert lines[0] == (
        f"otel: exporting 20 spans failed ({endpoint}{path}: {code}no answer within the export "
        "timeout (OTEL_EXPORTER_OTLP_TIMEOUT)); retrying with backoff, the cursor stays before "
        "this page")


# -- refused before anything is sent ------------------------------------------------

@pytest.mark.parametrize(("args", "env", "said"), [
    # gRPC took the user info for the host name: "Misformatted domain name", for ever.
    (["--protocol", "grpc", "--endpoint", "http://user:TOPSECRET@127.0.0.1:9"], {},
     'otel: --endpoint "http://user:***@127.0.0.1:9": a gRPC endpoint takes no user:password@; '
     "send credentials as a header"),
    # gRPC's resolver has no IDNA: the same, for ever.
    (["--protocol", "grpc", "--endpoint", "http://bücher.example:4317"], {},
     'otel: --endpoint "http://bücher.example:4317": gRPC takes a host name in ASCII only; '
     "give its ASCII form (xn--bcher-kva.example)"),
    (["--protocol", "grpc"], {"OTEL_EXPORTER_OTLP_ENDPOINT": "bücher.example:4317"},
     'otel: OTEL_EXPORTER_OTLP_ENDPOINT "bücher.example:4317": gRPC takes a host name in ASCII'),
    # --insecure was dropped without a word: TLS was spoken to an https URL anyway.
    (["--endpoint", "https://127.0.0.1:9", "--insecure"], {},
     'otel: --insecure asks for plain text, but the endpoint "https://127.0.0.1:9/v1/traces" '
     "asks for TLS: give an http:// endpoint, or leave --insecure out"),
    (["--protocol", "grpc", "--insecure"], {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c:1"},
     'otel: --insecure asks for plain text, but the endpoint "https://c:1" asks for TLS'),
    # The header's value was sent with U+FFFD in it, or refused naming a character never typed.
    ([], {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=%FF%FE"},
     'otel: OTEL_EXPORTER_OTLP_HEADERS: the value of header "api-key" has percent escapes that '
     "are not UTF-8; percent-encode its text as UTF-8"),
    # A header name that decodes to no header name: the SDK sent "x y" alongside.
    ([], {"OTEL_EXPORTER_OTLP_HEADERS": "x%20y=TOPSECRET"},
     'otel: OTEL_EXPORTER_OTLP_HEADERS: header name "x%20y" decodes to "x y", which is not a '
     "header name"),
    ([], {"OTEL_TRACES_EXPORTER": "otlp,console"},
     'otel: OTEL_TRACES_EXPORTER "otlp,console": this command sends to one exporter at a time; '
     "give one of otlp, console, or none"),
])
def test_a_setting_the_exporter_could_never_use_is_refused_before_anything_is_sent(
    tmp_path, args, env, said,
):
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    done = run_otel(db, "--cursor-file", str(tmp_path / "cursor"), *args, env=env)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    first = err.splitlines()[0]
    assert first.startswith("usage: " + said), err
    assert "TOPSECRET" not in err and "Traceback" not in err and "\ufffd" not in err
    assert done.stdout == b""
    assert not (tmp_path / "cursor").exists()


# -- what the specification defines, kept, and said -------------------------------

def test_a_path_on_a_grpc_endpoint_is_said_to_be_ignored(tmp_path):
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with GrpcReceiver() as receiver:
        done = run_otel(db, "--protocol", "grpc", "--endpoint", receiver.endpoint + "/v1/traces")
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode().splitlines() == [
        f'otel: --endpoint "{receiver.endpoint}/v1/traces": gRPC uses the host and port alone, '
        'so the path "/v1/traces" is ignored (a URL with a path is OTLP/HTTP\'s: --protocol '
        "http/protobuf)"]
    assert received_keys(receiver) == expected_keys(events)


@pytest.mark.parametrize(("name", "suffix", "posted", "warning"), [
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "/v1/traces", "/v1/traces/v1/traces",
     "already ends in /v1/traces, and the specification adds it again: spans go to"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "", "",
     "has no path, and is used as it is, as the specification says: spans are posted to its "
     "root, where a collector refuses them"),
])
def test_an_endpoint_variable_the_specification_takes_literally_is_warned_about(
    tmp_path, name, suffix, posted, warning,
):
    # The specification's rules (the generic variable always gets /v1/traces,
    # the traces one is used as it is) are kept; the 404s that follow were the
    # only sign of the mistake.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with HttpReceiver() as receiver:
        lines = outage_lines(db, cursor, env={name: receiver.base + suffix},
                             marker=b"HTTP 404")
    assert lines[0].startswith(f'otel: {name} "{receiver.base}{suffix}" {warning}'), lines
    assert lines[1].startswith(f"otel: exporting 20 spans failed ({receiver.base}{posted}: "
                               "HTTP 404 Not Found)"), lines


def test_the_protocol_flag_takes_any_case_as_the_variables_do(tmp_path):
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with GrpcReceiver() as receiver:
        done = run_otel(db, "--protocol", "GRPC", "--endpoint", receiver.endpoint)
    assert done.returncode == 0, done.stderr
    assert received_keys(receiver) == expected_keys(events)


def test_headers_from_the_variable_reach_a_grpc_collector_decoded_and_lowercased(tmp_path):
    # Already so before this audit: pinned. gRPC metadata names must be
    # lowercase; names are percent-decoded too, as the SDK decodes them
    # (test_a_percent_encoded_header_name_is_decoded_as_the_sdk_decodes_it).
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    with GrpcReceiver() as receiver:
        done = run_otel(db, "--protocol", "grpc", "--endpoint", receiver.endpoint,
                        env={"OTEL_EXPORTER_OTLP_HEADERS": "X-Tenant=blue%20team,Api-Key=k%3D1"})
    assert done.returncode == 0, done.stderr
    assert receiver.headers and all(h.get("x-tenant") == "blue team" and h.get("api-key") == "k=1"
                                    for h in receiver.headers)


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_HEADERS",
                                      "OTEL_EXPORTER_OTLP_TRACES_HEADERS"])
@pytest.mark.parametrize("receiver_type", [HttpReceiver, GrpcReceiver])
def test_a_header_flag_replaces_the_variable_over_both_transports(tmp_path, receiver_type,
                                                                  variable):
    # Before, the SDK's HTTP exporter read the variable itself and added its
    # headers to the flag's: api-key reached an HTTP collector, not a gRPC one.
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    grpc_args = ["--protocol", "grpc"] if receiver_type is GrpcReceiver else []
    with receiver_type() as receiver:
        done = run_otel(db, *grpc_args, "--endpoint", receiver.endpoint,
                        "--header", "x-a=flag",
                        env={variable: "api-key=from-env,X-A=env"})
    assert done.returncode == 0, done.stderr
    assert received_keys(receiver) == expected_keys(events)
    for headers in receiver.headers:
        assert headers.get("x-a") == "flag", headers
        assert "api-key" not in headers, headers


@pytest.mark.parametrize("receiver_type", [HttpReceiver, GrpcReceiver])
def test_a_percent_encoded_header_name_is_decoded_as_the_sdk_decodes_it(tmp_path, receiver_type):
    # Names were kept encoded: HTTP sent both "x%2dtenant" and the SDK's own
    # "x-tenant" (it reads the variable too), gRPC refused the name outright.
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    grpc_args = ["--protocol", "grpc"] if receiver_type is GrpcReceiver else []
    with receiver_type() as receiver:
        done = run_otel(db, *grpc_args, "--endpoint", receiver.endpoint,
                        env={"OTEL_EXPORTER_OTLP_HEADERS": "X%2DTenant=blue%20team,A=1,a=2"})
    assert done.returncode == 0, done.stderr
    assert received_keys(receiver) == expected_keys(events)
    for headers in receiver.headers:
        assert headers.get("x-tenant") == "blue team" and headers.get("a") == "2"
        assert not [name for name in headers if "%" in name], headers
