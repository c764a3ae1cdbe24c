"""What a collector answers beyond "accepted", and a collector that does not
answer, seen through `agentrt-export otel` as a real process."""

from __future__ import annotations

import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from typing import Any

import grpc
import pytest
from eventdb import REPO_ROOT, child_env, child_process
from otlp_receivers import GrpcReceiver, HttpReceiver
from test_otel_cli import (
    _stderr_until,
    expected_keys,
    received_keys,
    run_otel,
    scenario_db,
    stopped_once_refused,
)


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


def _outage_then_recovery(tmp_path, first_attempt_s: float):
    """A collector that does not answer the first request within the export
    timeout (``first_attempt_s``), then answers at once: returns the stderr
    and the wall time from the start of the first attempt to acceptance."""
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    env = child_env()
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = str(int(first_attempt_s * 1000))
    with HttpReceiver() as rx:
        rx.hang = first_attempt_s + 1.0
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
             "--endpoint", rx.endpoint],
            stderr=subprocess.PIPE, env=env, cwd=REPO_ROOT)
        try:
            while rx.arrived == 0:
                time.sleep(0.01)
            began = time.monotonic()
            seen = _stderr_until(proc, b"retrying with backoff", timeout=30.0)
            rx.hang = 0.0
            rest = proc.communicate(timeout=60)[1]
            took = time.monotonic() - began
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0
    return (seen + rest).decode(), took


def test_the_recovery_line_counts_the_outage_from_its_first_attempts_start(
        tmp_path):
    """docs/exporting.md: "An outage is one line on stderr when it begins ...
    and one when the collector accepts spans again ... after 5 failed attempts
    over 31.4 s". The clock starts only when the first attempt has failed
    (transport.py sets _outage_began after it), so the time that attempt took
    (up to the export timeout, 10 s by default; about 7 s of the SDK's own
    retries against a refused connection) is left out: an outage of 4 s is
    reported as about 1 s."""
    stderr, took = _outage_then_recovery(tmp_path, first_attempt_s=3.0)
    said = re.search(r"accepted spans again after \d+ failed attempts? over ([0-9.]+) s", stderr)
    assert said, stderr
    assert took >= 3.0
    assert float(said.group(1)) >= 3.0, (
        f"the outage lasted {took:.1f} s from its first attempt, but the line says "
        f"{said.group(1)} s: {stderr}")


def test_the_recovery_line_after_one_failed_attempt_is_singular(tmp_path):
    """The stop line says "after 1 attempt" (transport.py pluralises it); the
    recovery line says "after 1 failed attempts" (docs/exporting.md's example
    shows the plural with 5)."""
    stderr, _ = _outage_then_recovery(tmp_path, first_attempt_s=1.0)
    assert "accepted spans again after 1 failed attempt over" in stderr, stderr


@pytest.mark.parametrize("receiver_type", [HttpReceiver, GrpcReceiver])
def test_a_stop_while_the_collector_refuses_says_its_refusal_not_that_it_had_not_answered(
        tmp_path, receiver_type):
    """A collector answering every request at once with HTTP 503. A SIGTERM
    comes while the SDK exporter sleeps between its own retries (1, 2, 4 s
    within its 10 s timeout): the attempt is given up after the stop grace
    and the sentence says "the collector had not answered N s after the
    stop" (transport.py, _export_unless_stopped), which is false: it
    answered every request within milliseconds, with a refusal the operator
    is never told about (no outage line is printed before the stop)."""
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    scenario_db(db)
    env = child_env()
    env["AGENTRT_STOP_GRACE_S"] = "2"  # documented private shortening, for speed
    with receiver_type() as rx:
        rx.fail_next(10**6)  # 503 (gRPC UNAVAILABLE) to everything, at once
        proto = "grpc" if receiver_type is GrpcReceiver else "http/protobuf"
        code, err = stopped_once_refused(
            [sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
             "--endpoint", rx.endpoint, "--protocol", proto, "--cursor-file", str(cursor)],
            rx, env)
        refused = rx.refused
    assert code == 0
    assert not cursor.exists()
    assert refused >= 2, (refused, err)  # the collector answered, more than once
    assert "had not answered" not in err, err
    assert "the exporter was still retrying after " in err, err
    # the cause the collector gave is said
    assert ("503" in err) if receiver_type is HttpReceiver else ("UNAVAILABLE" in err), err


# -- a collector's own words are printed as one safe line --------------------------------

#: A collector's message with a line break, a terminal escape (red text) and a lot of it.
_HOSTILE = "line one\nline two \x1b[31mred\x1b[0m " + "x" * 400


@pytest.mark.parametrize("receiver_type", [HttpReceiver, GrpcReceiver])
def test_a_partial_success_message_is_one_line_without_terminal_escapes(tmp_path,
                                                                       receiver_type):
    """It was logged as the collector sent it: two lines, its escapes sent to the
    operator's terminal, no length cap."""
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    with receiver_type() as rx:
        rx.reject = (2, _HOSTILE)
        proto = "grpc" if receiver_type is GrpcReceiver else "http/protobuf"
        done = subprocess.run([sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
                               "--endpoint", rx.endpoint, "--protocol", proto],
                              capture_output=True, env=child_env(), cwd=REPO_ROOT, timeout=60)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    said = [line for line in err.splitlines() if "rejected 2 of its spans" in line]
    assert len(said) == 1 and all(line.startswith("otel: ") for line in err.splitlines()), err
    assert "\x1b" not in err
    assert "line one line two \\x1b[31mred\\x1b[0m xxx" in said[0]
    message = said[0].split("of its spans (", 1)[1].rsplit("); they are not sent again", 1)[0]
    assert len(message) == 200


def test_a_grpc_refusals_details_are_printed_without_terminal_escapes(tmp_path, monkeypatch):
    """The outage line keeps a collector's details whole (up to 200 characters), and
    now safe: its escape sequences went to the operator's terminal."""
    import otlp_receivers

    db = str(tmp_path / "runs.db")
    scenario_db(db)

    def export(self, request, context):  # a collector refusing in its own words
        self._collected.requests += 1
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "tenant acme \x1b[31mis red\x1b[0m")

    monkeypatch.setattr(otlp_receivers._TraceService, "Export", export)
    env = child_env()
    env["AGENTRT_STOP_GRACE_S"] = "1"
    with GrpcReceiver() as rx:
        proc = subprocess.Popen([sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
                                 "--endpoint", rx.endpoint, "--protocol", "grpc"],
                                stderr=subprocess.PIPE, env=env, cwd=REPO_ROOT)
        try:
            err = _stderr_until(proc, b"tenant acme").decode()
            proc.send_signal(signal.SIGTERM)
            err += proc.communicate(timeout=60)[1].decode()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    assert "PERMISSION_DENIED: tenant acme \\x1b[31mis red\\x1b[0m" in err
    assert "\x1b" not in err
