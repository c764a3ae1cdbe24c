"""`agentrt-export otel` where it meets the host's environment, as a real
process against real receivers on 127.0.0.1: proxy variables set
system-wide, as they are on many hosts and images."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from eventdb import child_env, child_process
from otlp_receivers import GrpcReceiver, HttpReceiver
from test_otel_cli import RETRIED_ONCE, expected_keys, received_keys, scenario_db
from test_otel_config_cli import outage_lines as stopped_at_outage
from test_otel_config_cli import raw_server

#: Every variable requests or gRPC reads a proxy from, and those that exempt a host.
_PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                    "ALL_PROXY", "grpc_proxy")
_NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY", "no_grpc_proxy")


def clean_env(**variables: str) -> dict[str, str]:
    """The child's environment with no OTEL_* and no proxy variables but ``variables``."""
    env = {k: v for k, v in child_env().items()
           if not k.startswith("OTEL_") and k not in _PROXY_VARIABLES + _NO_PROXY_VARIABLES}
    env.update(variables)
    return env


def outage_lines(db: str, cursor: str, endpoint: str, env: dict[str, str]) -> list[str]:
    """The command's stderr lines up to its outage line, run in ``env`` (with an
    export timeout that lets the SDK retry a connection error once, as its
    default does, but say the outage in a second, not seven)."""
    return stopped_at_outage(db, cursor, "--endpoint", endpoint, marker=b"failed (",
                             whole_env={**env, **RETRIED_ONCE})


@contextmanager
def counting_proxy() -> Iterator[tuple[int, list[int]]]:
    """A TCP listener on 127.0.0.1 standing for a proxy that cannot reach this
    machine's loopback: it closes each connection. Yields its port and a list
    holding one item per connection it took."""
    taken: list[int] = []
    with raw_server(b"", taken) as port:
        yield port, taken


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_collector_on_the_loopback_is_reached_directly_whatever_the_proxy_variables(
        tmp_path, protocol, host):
    # With HTTP_PROXY (HTTP) or http_proxy (gRPC) set system-wide, spans for
    # the sidecar's local collector went to the proxy, which cannot reach
    # this machine's loopback: every attempt failed, the outage line blamed
    # the collector. The reference's Go exporters never proxy the loopback.
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    events = scenario_db(db)
    receiver_type = GrpcReceiver if protocol == "grpc" else HttpReceiver
    with counting_proxy() as (proxy_port, taken), receiver_type() as receiver:
        env = clean_env(**dict.fromkeys(_PROXY_VARIABLES, f"http://127.0.0.1:{proxy_port}"))
        extra = ["--insecure"] if protocol == "grpc" else []
        with child_process([sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
                            "--protocol", protocol, "--endpoint",
                            f"http://{host}:{receiver.port}", "--cursor-file", str(cursor),
                            *extra], env) as proc:
            try:
                _, err = proc.communicate(timeout=40)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=30)
                pytest.fail(f"spans never reached the local collector: {err.decode()}")
        assert proc.returncode == 0, err
        assert err == b""
        assert received_keys(receiver) == expected_keys(events)
        assert taken == []  # the proxy saw nothing
    assert cursor.read_text() == f"{events[-1].seq}\n"


@pytest.mark.parametrize(("scheme", "variable", "answer", "said"), [
    ("http", "HTTP_PROXY", None, "Connection refused"),
    ("http", "HTTP_PROXY",
     b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
     "HTTP 403 Forbidden"),
    ("https", "HTTPS_PROXY",
     b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
     "CONNECT refused: HTTP 407 Proxy Authentication Required"),
])
def test_a_failure_through_a_proxy_names_the_proxy_and_hides_its_password(
        tmp_path, scheme, variable, answer, said):
    # The outage line named only the collector ("Connection refused"), while
    # the collector was never contacted: the proxy HTTP_PROXY named refused.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)

    def run(port: int) -> list[str]:
        return outage_lines(db, cursor, f"{scheme}://collector.invalid:4318",
                            clean_env(**{variable: f"http://agent:s3cret@127.0.0.1:{port}"}))

    if answer is None:
        with socket.create_server(("127.0.0.1", 0)) as closed:
            port = closed.getsockname()[1]
        lines = run(port)
    else:
        with raw_server(answer) as port:
            lines = run(port)
    began = [line for line in lines if "failed (" in line]
    assert began == [
        f"otel: exporting 20 spans failed ({scheme}://collector.invalid:4318/v1/traces: "
        f"{said} (through the proxy http://agent:***@127.0.0.1:{port} from {variable}; list "
        "the collector's host in NO_PROXY to send directly)); retrying with backoff, the "
        "cursor stays before this page"], lines
    assert not any("s3cret" in line for line in lines)


def test_a_proxy_the_no_proxy_variable_exempts_the_collector_from_is_not_named(tmp_path):
    # NO_PROXY keeps its meaning: a collector it names is sent to directly,
    # and its failure is the collector's own.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    lines = outage_lines(db, cursor, "http://collector.invalid:4318",
                         clean_env(HTTP_PROXY="http://127.0.0.1:9", NO_PROXY="collector.invalid"))
    began = [line for line in lines if "failed (" in line]
    assert len(began) == 1 and "proxy" not in began[0], lines


def test_a_socks_proxy_requests_cannot_use_is_named_with_the_proxy(tmp_path):
    # Without PySocks, requests says only "Missing dependencies for SOCKS support."
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    lines = outage_lines(db, cursor, "http://collector.invalid:4318",
                         clean_env(ALL_PROXY="socks5://127.0.0.1:9"))
    began = [line for line in lines if "failed (" in line]
    assert began == [
        "otel: exporting 20 spans failed (http://collector.invalid:4318/v1/traces: Missing "
        "dependencies for SOCKS support. (through the proxy socks5://127.0.0.1:9 from ALL_PROXY; "
        "list the collector's host in NO_PROXY to send directly)); retrying with backoff, the "
        "cursor stays before this page"], lines
