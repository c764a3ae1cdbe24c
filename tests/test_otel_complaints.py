"""The SDK exporter's complaints: taken from its loggers, reduced to their cause."""

from __future__ import annotations

import logging

import pytest

from agentrt_otel.complaints import SDK_EXPORTER_LOGGER, ExporterComplaints, gist

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
     "Failed to export span batch code: 503, reason: Service Unavailable"),
    ("x" * 500 + "\nsecond line", "x" * 200),
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
