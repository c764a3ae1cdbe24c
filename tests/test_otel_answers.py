"""What a collector answers beyond "accepted", and a collector that does not
answer, seen through `agentrt-export otel` as a real process."""

from __future__ import annotations

import re
import signal
import ssl
import sys
import threading
import time
from typing import Any

import pytest
from eventdb import child_env, child_process
from otlp_receivers import GrpcReceiver, HttpReceiver
from test_otel_cli import _stderr_until, expected_keys, received_keys, run_otel, scenario_db


def _lines(stderr: bytes) -> list[str]:
    return stderr.decode().splitlines()


def test_a_redirect_is_retried_as_a_failure_never_taken_for_delivery(tmp_path):
    """The SDK counts any status under 400 as success without following it:
    every span would be lost while the cursor moved on."""
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    events = scenario_db(db)
    with HttpReceiver() as receiver:
        receiver.redirect = (1, "https://collector.example/v1/traces")
        done = run_otel(db, "--endpoint", receiver.endpoint, "--cursor-file", cursor)
    assert done.returncode == 0, done.stderr
    lines = _lines(done.stderr)
    assert lines[0].startswith("otel: exporting ") and (
        "HTTP 307: the collector redirects to https://collector.example/v1/traces; give that "
        "URL as the endpoint (the exporter does not follow redirects)") in lines[0]
    assert lines[1].startswith("otel: the collector accepted spans again after 1 failed")
    assert received_keys(receiver) == expected_keys(events)


@pytest.mark.parametrize("receiver_type", [HttpReceiver, GrpcReceiver])
def test_spans_a_collector_rejects_are_said_once_per_answer_and_not_sent_again(
        tmp_path, receiver_type):
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    events = scenario_db(db)
    with receiver_type() as receiver:
        receiver.reject = (2, "attribute value too long")
        args = ["--protocol", "grpc", "--insecure"] if receiver_type is GrpcReceiver else []
        done = run_otel(db, "--endpoint", receiver.endpoint, "--cursor-file", str(cursor),
                        *args)
    assert done.returncode == 0, done.stderr
    assert _lines(done.stderr) == [
        "otel: the collector accepted a request but rejected 2 of its spans (attribute value "
        "too long); they are not sent again, as OTLP says"] * receiver.requests
    assert receiver.refused == 0 and received_keys(receiver) == expected_keys(events)
    assert cursor.read_text() == f"{len(events)}\n"


def test_a_stop_does_not_wait_for_a_collector_that_does_not_answer(tmp_path):
    """With the SDK's timeout at a minute, SIGTERM would wait that minute (up to
    a day, as configured): the attempt is given up STOP_GRACE after the stop,
    and the page is not counted as delivered. (STOP_GRACE, 5 s, is cut to a
    second here, which a collector that never answers runs out all the same;
    its default is pinned in test_stop_grace.)"""
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    scenario_db(db)
    env = {k: v for k, v in child_env().items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "60000"
    grace = 1.0
    env["AGENTRT_STOP_GRACE_S"] = f"{grace:g}"
    with HttpReceiver() as receiver:
        receiver.hang = 60.0
        with child_process([sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
                            "--follow", "--endpoint", receiver.endpoint, "--cursor-file",
                            str(cursor)], env) as proc:
            deadline = time.monotonic() + 30
            while receiver.arrived == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert receiver.arrived, "the exporter never sent a request"
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=grace + 20)
            took = time.monotonic() - stopped
    assert proc.returncode == 0, err
    assert took < grace + 5, took  # not the minute the SDK would wait
    assert _lines(err)[-1].startswith("stopped: otel: stopped before the collector accepted "
                                      "the page: ")
    assert f"the collector had not answered {grace:g} s after the stop" in _lines(err)[-1]
    assert not cursor.exists()  # nothing was acknowledged, so nothing is saved


def test_a_tls_mismatch_over_grpc_is_one_line_naming_it(tmp_path):
    """gRPC's C core logs every failed handshake itself, once per reconnect; the
    outage line says what failed and what to check instead."""
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    env = {k: v for k, v in child_env().items() if not k.startswith(("OTEL_", "GRPC_"))}
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1000"
    with GrpcReceiver() as receiver, child_process(  # plain text, asked for TLS
            [sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db, "--protocol",
             "grpc", "--endpoint", f"https://127.0.0.1:{receiver.port}"], env) as proc:
        seen = _stderr_until(proc, b"failed (")  # the first attempt and the SDK's retries
        time.sleep(2.5)  # the sink's wait (at most 1.2 s) and its second attempt (1 s)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    err = seen + rest
    lines = _lines(err)
    assert proc.returncode == 0, err
    assert not [line for line in lines if re.match(r"[IWE]\d{4} ", line)], lines
    assert len(lines) == 2, lines
    assert ("StatusCode.UNAVAILABLE: TLS handshake failed (wrong version number): a plain-text "
            "collector needs --insecure, a TLS one a certificate this host trusts") in lines[0]


@pytest.mark.parametrize(("scheme", "answer", "kind", "said"), [
    ("http", b"", "ConnectionError", "the endpoint closed"),  # as a gRPC or TLS port may
    ("http", b"\x00\x00\x06\x04\x00\x00\x00\x00\x00", "ConnectionError",
     "the endpoint answered in HTTP/2"),  # a SETTINGS frame
    ("https", b"HTTP/1.1 400 Bad Request\r\n\r\n", "SSLError", "TLS handshake failed"),
])
def test_a_request_that_met_no_http1_server_fails_as_the_same_class(scheme, answer, kind, said):
    """The sentence replaces requests' text, not its class: the SDK still takes
    it for a connection error, which it retries within its timeout."""
    from test_otel_config_cli import raw_server

    from agentrt_otel.answers import checked_http_session

    with raw_server(answer) as port, pytest.raises(Exception) as err:
        checked_http_session().post(f"{scheme}://127.0.0.1:{port}/v1/traces", data=b"x",
                                    timeout=5)
    assert type(err.value).__module__ == "requests.exceptions"
    assert type(err.value).__name__ == kind
    assert str(err.value).startswith(said), str(err.value)


@pytest.mark.parametrize(("status", "reason", "said"), [
    (503, None, "HTTP 503 Service Unavailable"),
    (503, "", "HTTP 503"),
    (401, None, "HTTP 401 Unauthorized"),
])
def test_a_refusal_reaches_the_sdk_with_its_status_in_its_reason(status, reason, said):
    """The SDK's own lines name a status it retries by its reason alone
    ("Transient error Service Unavailable"), or "None" when there is none."""
    from test_otel_config_cli import answering

    from agentrt_otel.answers import checked_http_session

    with answering(status, b"", "text/plain", reason) as base:
        response = checked_http_session().post(base + "/v1/traces", data=b"x", timeout=5)
    assert (response.status_code, response.reason) == (status, said)


@pytest.mark.parametrize("timeout", [0.0, -0.25, (0.0, 5.0), (5.0, 0)])
def test_an_attempt_with_no_time_left_is_a_timeout_and_is_not_sent(timeout):
    """requests refuses a timeout of zero with a ValueError, which the SDK
    would log as the failure's cause."""
    import requests
    from test_otel_config_cli import answering

    from agentrt_otel.answers import checked_http_session

    with answering(502, b"", "text/plain") as base, pytest.raises(
            requests.exceptions.Timeout, match="no time left of the export timeout"):
        checked_http_session().post(base + "/v1/traces", data=b"x", timeout=timeout)


def test_a_retry_woken_after_the_deadline_keeps_the_previous_answer_as_the_cause(monkeypatch):
    """On a loaded host the SDK's backoff wait can end after its deadline: it
    then asks for an attempt with no time left. The outage line said
    "Attempted to set connect timeout to 0.0, ..." of a collector answering 502."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from test_otel_config_cli import answering

    from agentrt_otel.answers import checked_http_session

    with answering(502, b"", "text/plain") as base:
        exporter = OTLPSpanExporter(endpoint=base + "/v1/traces", timeout=0.6,
                                    session=checked_http_session())
        monkeypatch.setattr(exporter._client, "_compute_backoff", lambda retry: 0.3)
        said = _cause_after_waking_late(monkeypatch, exporter, exporter._client._shutdown_event)
    assert said == "HTTP 502 Bad Gateway"


def _cause_after_waking_late(monkeypatch: pytest.MonkeyPatch, exporter: Any,
                             backoff: threading.Event) -> str:
    """The cause said of a failed export whose backoff waits (on ``backoff``)
    end half a second late, as on a loaded host."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    from agentrt_otel.complaints import ExporterComplaints

    monkeypatch.setattr(backoff, "wait", lambda seconds: time.sleep(seconds + 0.5) or False)
    complaints = ExporterComplaints().install()
    try:
        assert exporter.export([]) is SpanExportResult.FAILURE
    finally:
        complaints.uninstall()
    return complaints.reason()


def test_a_grpc_retry_woken_after_the_deadline_keeps_the_previous_failure_as_the_cause(
        monkeypatch):
    """gRPC fails an attempt with no time left as DEADLINE_EXCEEDED, which was
    said as "no answer within the export timeout" of a port that refused."""
    import socket

    from opentelemetry.exporter.otlp.proto.grpc import exporter as sdk_grpc

    from agentrt_otel.answers import checked_grpc_exporter

    monkeypatch.setattr(sdk_grpc.random, "uniform", lambda low, high: 0.3)  # a backoff of 0.3 s
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        exporter = checked_grpc_exporter(endpoint=f"127.0.0.1:{unused.getsockname()[1]}",
                                         insecure=True, timeout=0.6)
        try:
            said = _cause_after_waking_late(monkeypatch, exporter,
                                            exporter._shutdown_in_progress)
        finally:
            exporter.shutdown()
    assert said == "StatusCode.UNAVAILABLE: Connection refused"


@pytest.mark.parametrize(("error", "said"), [
    (ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate "
                     "required (_ssl.c:2580)"),
     "the collector asks for a client certificate: name one in "
     "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, its key in OTEL_EXPORTER_OTLP_CLIENT_KEY"),
    (ssl.SSLEOFError(8, "EOF occurred in violation of protocol (_ssl.c:2427)"),
     "the endpoint closed the TLS connection, as a collector may if it needs a client "
     "certificate: name one in OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, its key in "
     "OTEL_EXPORTER_OTLP_CLIENT_KEY"),
    # Cut short during the handshake: what a plain-text server does.
    (ssl.SSLEOFError(8, "[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred in violation of "
                        "protocol (_ssl.c:1006)"),
     "TLS handshake failed (unexpected eof while reading): a plain-text collector needs an "
     "http:// endpoint, a TLS one a certificate this host trusts "
     "(OTEL_EXPORTER_OTLP_CERTIFICATE)"),
    (ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
                                     "failed: self-signed certificate in certificate chain"),
     "TLS handshake failed (certificate verify failed): a plain-text collector needs an "
     "http:// endpoint, a TLS one a certificate this host trusts "
     "(OTEL_EXPORTER_OTLP_CERTIFICATE)"),
])
def test_a_tls_failure_says_what_the_collector_wants(error, said):
    """TLS 1.3 refuses a client without a certificate after the handshake: the
    alert is read, or the connection found closed first, depending on timing."""
    import requests

    from agentrt_otel.http_failures import sentence

    wrapped = requests.exceptions.SSLError(f"HTTPSConnectionPool(...): ({error!r})")
    wrapped.__context__ = error
    assert sentence(wrapped) == said
