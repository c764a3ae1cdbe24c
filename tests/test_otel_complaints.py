"""The SDK exporter's complaints: taken from its loggers, reduced to their cause."""

from __future__ import annotations

import logging

import pytest

from agentrt_otel.complaints import (
    ATTEMPTS_LOGGER,
    SDK_EXPORTER_LOGGER,
    ExporterComplaints,
    gist,
    says_too_large,
)

HTTP_TRANSIENT = (
    "Transient error HTTPConnectionPool(host='127.0.0.1', port=1): Max retries exceeded with "
    "url: /v1/traces (Caused by NewConnectionError(\"HTTPConnection(host='127.0.0.1', port=1): "
    "Failed to establish a new connection: [Errno 111] Connection refused\")) encountered while "
    "exporting span batch, retrying in 0.81s.")
GRPC_FAILED = (
    "Failed to export traces to 127.0.0.1:1, error code: StatusCode.UNAVAILABLE, error details: "
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to "
    "connect to remote host: Connection refused")


@pytest.mark.parametrize(("message", "cause"), [
    (HTTP_TRANSIENT, "Connection refused"),
    ("... [Errno -2] Name or service not known')) encountered", "Name or service not known"),
    (GRPC_FAILED, "StatusCode.UNAVAILABLE: Connection refused"),
    ("Failed to export span batch code: 503, reason: Service Unavailable",
     "HTTP 503 Service Unavailable"),
    ("Failed to export spans batch code: None, reason: HTTP 307: the collector redirects to "
     "https://c/v1/traces; give that URL as the endpoint (the exporter does not follow "
     "redirects)", "HTTP 307: the collector redirects to https://c/v1/traces; give that URL "
     "as the endpoint (the exporter does not follow redirects)"),
    ("Transient error Service Unavailable encountered while exporting spans batch, retrying "
     "in 3.30s.", "Service Unavailable"),
    ("Failed to export spans batch due to timeout, max retries or shutdown.",
     "no answer within the export timeout (OTEL_EXPORTER_OTLP_TIMEOUT)"),
    ("Failed to export traces to 127.0.0.1:1, error code: StatusCode.UNAVAILABLE, error "
     "details: failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Tls "
     "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL routines:"
     "OPENSSL_internal:WRONG_VERSION_NUMBER: Invalid certificate verification context: OK",
     "StatusCode.UNAVAILABLE: TLS handshake failed (wrong version number): a plain-text "
     "collector needs --insecure, a TLS one a certificate this host trusts"),
    ("x" * 500 + "\nsecond line", "x" * 200),
    # The checked HTTP session puts the status in the reason: not said twice.
    ("Failed to export spans batch code: 401, reason: HTTP 401 Unauthorized",
     "HTTP 401 Unauthorized"),
    ("Transient error HTTP 503 Service Unavailable encountered while exporting spans batch, "
     "retrying in 1.00s.", "HTTP 503 Service Unavailable"),
    # gRPC against an HTTP/1.1 server, in grpc-core's two wordings.
    ("Failed to export traces to c:4318, error code: StatusCode.UNAVAILABLE, error details: "
     "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.1:4318: Trying to "
     "connect an http1.x server (HTTP status 400)",
     "StatusCode.UNAVAILABLE: the endpoint did not answer in HTTP/2, as gRPC does: if it is an "
     "OTLP/HTTP port (a collector's is usually 4318), use --protocol http/protobuf"),
    ("Failed to export traces to c:4318, error code: StatusCode.UNAVAILABLE, error details: "
     "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.1:4318: Failed "
     "parsing HTTP/2 (Expected SETTINGS frame as the first frame, got frame type 79)",
     "StatusCode.UNAVAILABLE: the endpoint did not answer in HTTP/2, as gRPC does: if it is an "
     "OTLP/HTTP port (a collector's is usually 4318), use --protocol http/protobuf"),
    ("Failed to export traces to c:4317, error code: StatusCode.DEADLINE_EXCEEDED, error "
     "details: Deadline Exceeded",
     "StatusCode.DEADLINE_EXCEEDED: no answer within the export timeout "
     "(OTEL_EXPORTER_OTLP_TIMEOUT)"),
    ("Failed to export traces to c:4317, error code: StatusCode.INTERNAL, error details: None",
     "StatusCode.INTERNAL"),
    # The line for a failure gRPC retries: its details were left out (a stop
    # during the SDK's backoff leaves it the last line with a cause).
    ("Transient error StatusCode.UNAVAILABLE encountered while exporting traces to "
     "127.0.0.1:1, retrying in 0.93s. Error details: failed to connect to all addresses; last "
     "error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused",
     "StatusCode.UNAVAILABLE: Connection refused"),
])
def test_gist_keeps_the_cause(message: str, cause: str) -> None:
    assert gist(message) == cause


def test_installed_it_takes_the_sdk_lines_and_keeps_the_cause_over_the_closing_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sdk = logging.getLogger(SDK_EXPORTER_LOGGER + ".proto.http.trace_exporter")
    complaints = ExporterComplaints().install()
    try:
        assert complaints.reason() == ""
        sdk.warning(HTTP_TRANSIENT)
        sdk.error("Failed to export span batch due to timeout, max retries or shutdown.")
        assert complaints.reason() == "Connection refused"
        sdk.error(GRPC_FAILED)  # a new cause replaces the old one
        assert complaints.reason() == "StatusCode.UNAVAILABLE: Connection refused"
        sdk.info("not a complaint")
        assert complaints.reason() == "StatusCode.UNAVAILABLE: Connection refused"
    finally:
        complaints.uninstall()
    assert not [r for r in caplog.records if r.name.startswith(SDK_EXPORTER_LOGGER)]
    sdk.warning("after uninstall")  # printed again as before
    assert [r.getMessage() for r in caplog.records] == ["after uninstall"]


@pytest.mark.parametrize(("message", "too_large"), [
    ("Failed to export span batch code: 413, reason: Request Entity Too Large", True),
    ("Failed to export traces to c:4317, error code: StatusCode.RESOURCE_EXHAUSTED, error "
     "details: SERVER: Received message larger than max (13079 vs. 4359)", True),
    ("Failed to export traces to c:4317, error code: StatusCode.RESOURCE_EXHAUSTED, error "
     "details: grpc: received message larger than max (5000000 vs. 4194304)", True),
    ("Dropping span batch: serialized size 9 bytes exceeds max_request_size 8 bytes.", True),
    # RESOURCE_EXHAUSTED alone also means "overloaded": smaller requests would not help.
    ("Failed to export traces to c:4317, error code: StatusCode.RESOURCE_EXHAUSTED, error "
     "details: rate limited", False),
    ("Failed to export span batch code: 503, reason: Service Unavailable", False),
    ("Failed to export span batch code: 4130, reason: ?", False),
    (HTTP_TRANSIENT, False),
])
def test_says_too_large_only_for_a_request_refused_for_its_size(
        message: str, too_large: bool) -> None:
    assert says_too_large(message) is too_large


def test_the_reason_names_the_endpoint_and_clear_forgets_the_last_complaint() -> None:
    sdk = logging.getLogger(SDK_EXPORTER_LOGGER + ".proto.grpc.exporter")
    complaints = ExporterComplaints("http://collector:4317").install()
    try:
        assert complaints.reason() == "http://collector:4317 refused them"
        sdk.error(GRPC_FAILED)
        assert complaints.reason() == (
            "http://collector:4317: StatusCode.UNAVAILABLE: Connection refused")
        assert not complaints.too_large()
        sdk.error("Failed to export span batch code: 413, reason: Request Entity Too Large")
        assert complaints.too_large()
        complaints.clear()
        assert not complaints.too_large()
        assert complaints.reason() == "http://collector:4317 refused them"
    finally:
        complaints.uninstall()


def test_while_installed_a_repeated_sdk_line_is_not_dropped_by_its_duplicate_filter() -> None:
    import opentelemetry.exporter.otlp.proto.grpc.exporter as grpc_exporter

    sdk = grpc_exporter.logger
    before = list(sdk.filters)
    assert any(type(f).__name__ == "DuplicateFilter" for f in before)
    complaints = ExporterComplaints().install()
    try:
        sdk.error(GRPC_FAILED)
        complaints.clear()
        sdk.error(GRPC_FAILED)  # the same line again, at once: the SDK would drop it
        assert complaints.reason() == "StatusCode.UNAVAILABLE: Connection refused"
    finally:
        complaints.uninstall()
    assert sdk.filters == before


def test_the_sessions_cause_of_an_attempt_outlives_the_sdks_bare_timeout_line() -> None:
    # The SDK says only "due to timeout, ..." when its next retry would not
    # fit in the export timeout; the checked HTTP session said the cause.
    import agentrt_otel.answers  # noqa: F401 - sets the attempts logger up

    attempts = logging.getLogger(ATTEMPTS_LOGGER)
    sdk = logging.getLogger(SDK_EXPORTER_LOGGER + ".proto.http.trace_exporter")
    complaints = ExporterComplaints("http://c:4318/v1/traces").install()
    try:
        attempts.warning("HTTP 503 Service Unavailable")
        sdk.error("Failed to export spans batch due to timeout, max retries or shutdown.")
        assert complaints.reason() == "http://c:4318/v1/traces: HTTP 503 Service Unavailable"
    finally:
        complaints.uninstall()
    # Heard by no one else: not passed up to the root logger, nor printed by
    # logging's last resort (the SDK's own lines say it to other listeners).
    assert attempts.propagate is False
    assert any(isinstance(h, logging.NullHandler) for h in attempts.handlers)


@pytest.mark.parametrize("message", [
    "Failed to export traces to localhost:4317, error code: StatusCode.UNAUTHENTICATED, "
    "error details: " + "\x1b[31m" * 60,
    "Failed to export span batch code: 502, reason: " + "\x1b]0;title\x07" * 40,
    "Transient error " + "\x1b[2J" * 60 + " encountered while exporting span batch",
    "line one \x1b[31m" + "x" * 300 + "\nline two",
])
def test_a_collectors_words_are_made_safe_then_cut_to_200_characters(message: str) -> None:
    """Made safe first (each control character becomes four), then cut: cut first,
    the line could grow past 200 again."""
    said = gist(message)
    assert "\x1b" not in said and "\x07" not in said and "\n" not in said
    assert len(said) <= 200


def test_os_error_words_inside_a_collectors_reason_are_made_safe_and_cut() -> None:
    """The errno pattern is searched in the whole line, a collector's reason phrase
    included, so what it finds is treated as the collector's words."""
    said = gist("HTTP 502 Bad Gateway [Errno 5] \x1b[2J\x1b[31mgotcha" + "x" * 300)
    assert "\x1b" not in said and len(said) <= 200


def test_grpc_details_shaped_like_the_proxy_note_are_made_safe() -> None:
    said = gist("Failed to export traces to collector:4317, error code: "
                "StatusCode.UNAUTHENTICATED, error details: denied "
                "(through the proxy \x1b]0;pwned\x07\x1b[2J)")
    assert "\x1b" not in said and "\x07" not in said


def test_the_proxy_note_of_an_http_refusal_is_kept_whole_after_the_cut_words() -> None:
    """Our note and its fix, as over gRPC: only the collector's words are cut."""
    from agentrt_otel.answers import _through_proxy

    note = _through_proxy(
        "http://svc-otel:s3cret@egress-proxy.platform.eu-west-1.internal.example.com:3128",
        "HTTPS_PROXY")
    said = gist(f"HTTP 407 Proxy Authentication Required{' x' * 150} ({note})")
    assert said.endswith(f" ({note})") and "s3cret" not in said
    assert len(said) == 200 + len(f" ({note})")


def test_the_proxy_note_of_a_retried_http_refusal_is_kept_whole_after_the_cut_words() -> None:
    """A 429, 502, 503 or 504 is retried: the line kept is the SDK's 'Transient
    error <reason> encountered ...', our note ending the reason inside it."""
    from agentrt_otel.answers import _through_proxy

    note = _through_proxy(
        "http://svc-otel:s3cret@egress-proxy.platform.eu-west-1.internal.example.com:3128",
        "HTTPS_PROXY")
    line = (f"Transient error HTTP 503 Service Temporarily Unavailable{' x' * 120} ({note}) "
            "encountered while exporting spans batch, retrying in 1.00s.")
    said = gist(line)
    assert said.endswith(f" ({note})") and len(said) == 200 + len(f" ({note})")
