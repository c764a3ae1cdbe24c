"""`agentrt-export otel`'s configuration, audited as a real process against
receivers on 127.0.0.1: what a user could plausibly get wrong is refused in
one sentence (exit 2, nothing sent, no cursor), said in a warning when the
OpenTelemetry specification defines it, or said in one outage line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from eventdb import REPO_ROOT, child_env
from otlp_receivers import GrpcReceiver, HttpReceiver
from test_otel_cli import (
    _stderr_until,
    expected_keys,
    received_keys,
    run_otel,
    scenario_db,
)


@contextmanager
def answering(status: int, body: bytes, content_type: str) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering every POST alike; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(status)
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


def outage_lines(db: str, cursor: str, *args: str, marker: bytes,
                 env: dict[str, str] | None = None) -> list[str]:
    """Run the command (no OTEL_* variables but ``env``) until ``marker`` is
    on stderr, stop it with SIGTERM, and return its stderr lines; it must
    have stopped cleanly without creating the cursor."""
    full = {k: v for k, v in child_env().items() if not k.startswith("OTEL_")}
    full.update(env or {})
    proc = subprocess.Popen([sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
                             *args, "--cursor-file", cursor], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=full, cwd=REPO_ROOT)
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
    # lowercase; the OTel spec's percent-decoding applies to values.
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    with GrpcReceiver() as receiver:
        done = run_otel(db, "--protocol", "grpc", "--endpoint", receiver.endpoint,
                        env={"OTEL_EXPORTER_OTLP_HEADERS": "X-Tenant=blue%20team,Api-Key=k%3D1"})
    assert done.returncode == 0, done.stderr
    assert receiver.headers and all(h.get("x-tenant") == "blue team" and h.get("api-key") == "k=1"
                                    for h in receiver.headers)
