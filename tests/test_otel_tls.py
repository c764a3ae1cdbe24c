"""OTLP over TLS, through `agentrt-export otel` as a real process: the
collector's certificate checked against the CA the operator names, a client
certificate sent when the collector asks for one, and a certificate this
host does not trust said in one line."""

from __future__ import annotations

import pytest
from otlp_receivers import TLS_CA, TLS_CLIENT_CERT, TLS_CLIENT_KEY, GrpcReceiver, HttpReceiver
from test_otel_cli import expected_keys, received_keys, run_otel, scenario_db
from test_otel_config_cli import QUICK, outage_lines

PROTOCOLS = pytest.mark.parametrize(("protocol", "receiver_type"), [
    ("http/protobuf", HttpReceiver), ("grpc", GrpcReceiver)])


@PROTOCOLS
@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_CERTIFICATE",
                                      "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"])
def test_spans_arrive_over_tls_at_a_collector_whose_ca_is_named(tmp_path, protocol,
                                                                 receiver_type, variable):
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    events = scenario_db(db)
    with receiver_type(tls=True) as receiver:
        done = run_otel(db, "--protocol", protocol, "--endpoint", receiver.endpoint,
                        "--cursor-file", str(cursor), env={variable: TLS_CA})
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert received_keys(receiver) == expected_keys(events)
    assert cursor.read_text() == f"{len(events)}\n"


@PROTOCOLS
def test_a_collector_asking_for_a_client_certificate_is_sent_the_one_named(
        tmp_path, protocol, receiver_type):
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    events = scenario_db(db)
    with receiver_type(client_auth=True) as receiver:
        done = run_otel(db, "--protocol", protocol, "--endpoint", receiver.endpoint,
                        "--cursor-file", str(cursor),
                        env={"OTEL_EXPORTER_OTLP_CERTIFICATE": TLS_CA,
                             "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": TLS_CLIENT_CERT,
                             "OTEL_EXPORTER_OTLP_CLIENT_KEY": TLS_CLIENT_KEY})
    assert done.returncode == 0, done.stderr
    assert received_keys(receiver) == expected_keys(events)


def test_the_named_ca_wins_over_requests_own_ca_variables(tmp_path):
    """requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE (set system-wide on
    many hosts and images) replace the CA file the SDK read from
    OTEL_EXPORTER_OTLP_CERTIFICATE: every attempt failed its certificate check."""
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    events = scenario_db(db)
    with HttpReceiver(tls=True) as receiver:
        done = run_otel(db, "--endpoint", receiver.endpoint, "--cursor-file", str(cursor),
                        env={"OTEL_EXPORTER_OTLP_CERTIFICATE": TLS_CA,
                             "REQUESTS_CA_BUNDLE": TLS_CLIENT_CERT,  # trusts no collector
                             "CURL_CA_BUNDLE": TLS_CLIENT_CERT})
    assert done.returncode == 0, done.stderr
    assert received_keys(receiver) == expected_keys(events)


@pytest.mark.parametrize(("protocol", "receiver_type", "said"), [
    ("http/protobuf", HttpReceiver,
     "TLS handshake failed (certificate verify failed): a plain-text collector needs an "
     "http:// endpoint, a TLS one a certificate this host trusts "
     "(OTEL_EXPORTER_OTLP_CERTIFICATE)"),
    ("grpc", GrpcReceiver,
     "StatusCode.UNAVAILABLE: TLS handshake failed (certificate verify failed): a plain-text "
     "collector needs --insecure, a TLS one a certificate this host trusts"),
])
def test_a_collector_certificate_not_trusted_is_one_outage_line_saying_so(
        tmp_path, protocol, receiver_type, said):
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with receiver_type(tls=True) as receiver:
        lines = outage_lines(db, cursor, "--protocol", protocol, "--endpoint", receiver.endpoint,
                             marker=b"failed (", env=QUICK)
    assert lines[0] == (f"otel: exporting 20 spans failed ({receiver.endpoint}: {said}); "
                        "retrying with backoff, the cursor stays before this page")


def test_a_collector_wanting_a_client_certificate_is_said_to_over_http(tmp_path):
    # The line said "TLS handshake failed" and pointed at the CA, which was right.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with HttpReceiver(client_auth=True) as receiver:
        lines = outage_lines(db, cursor, "--endpoint", receiver.endpoint, marker=b"failed (",
                             env={**QUICK, "OTEL_EXPORTER_OTLP_CERTIFICATE": TLS_CA})
    # TLS 1.3 refuses the client after the handshake: its alert is read, or the
    # connection is found closed first, depending on timing.
    assert lines[0].startswith(f"otel: exporting 20 spans failed ({receiver.endpoint}: ")
    assert ("client certificate: name one in OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, its key in "
            "OTEL_EXPORTER_OTLP_CLIENT_KEY); retrying") in lines[0]
