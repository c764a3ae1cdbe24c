"""OTLP over gRPC meets the host's environment as OTLP over HTTP does, and as
the reference's grpc-go does: the proxy variables it reads (HTTPS_PROXY as
well as gRPC's lowercase ones), a failure through a proxy named, and a
collector that wants a client certificate said to want one. As a real
process, through a real HTTP CONNECT proxy, against real receivers on
127.0.0.1."""

from __future__ import annotations

import base64
import selectors
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from eventdb import child_process
from otlp_receivers import TLS_CA, TLS_CLIENT_CERT, TLS_CLIENT_KEY, GrpcReceiver
from test_otel_cli import expected_keys, received_keys, scenario_db
from test_otel_config_cli import QUICK, outage_lines
from test_otel_environment import clean_env

from agentrt_otel.answers import grpc_proxy
from agentrt_otel.complaints import gist

#: A collector name no resolver knows: reached through the proxy, or not at all.
COLLECTOR = "collector.invalid"


@contextmanager
def connect_proxy(refusal: bytes | None = None) -> Iterator[tuple[int, list[str]]]:
    """An HTTP CONNECT proxy on 127.0.0.1 whose every tunnel leads to
    127.0.0.1 at the port asked for, whatever the host (so a collector named
    ``collector.invalid`` is reached through it, and only through it). Yields
    its port and the head of each request it took; with ``refusal``, answers
    each with those bytes and closes instead."""
    heads: list[str] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    done = threading.Event()
    tunnels: list[threading.Thread] = []

    def pump(a: socket.socket, b: socket.socket) -> None:
        ends = {a.fileno(): (a, b), b.fileno(): (b, a)}
        with selectors.DefaultSelector() as selector:
            for end, _ in ends.values():
                selector.register(end, selectors.EVENT_READ)
            while not done.is_set():
                for key, _ in selector.select(0.05):
                    source, sink = ends[key.fd]
                    data = source.recv(65536)
                    if not data:
                        return
                    sink.sendall(data)

    def tunnel(conn: socket.socket) -> None:
        with conn, suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, early = data.partition(b"\r\n\r\n")
            heads.append(head.decode("latin-1"))
            if refusal is not None:
                conn.sendall(refusal)
                return
            port = int(head.split()[1].rpartition(b":")[2])
            with socket.create_connection(("127.0.0.1", port)) as upstream:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                upstream.sendall(early)
                pump(conn, upstream)

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            thread = threading.Thread(target=tunnel, args=(conn,), daemon=True)
            tunnels.append(thread)
            thread.start()

    acceptor = threading.Thread(target=serve, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1], heads
    finally:
        done.set()
        for thread in [acceptor, *tunnels]:
            thread.join(5)
        listener.close()


def export(db: str, cursor: Path, endpoint: str, env: dict[str, str]) -> tuple[int | None, str]:
    """Run the gRPC export to ``endpoint`` in ``env`` until it ends (all sent),
    or for 20 s (it is retrying); its exit code (None if it was still
    running) and stderr."""
    with child_process([sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
                        "--protocol", "grpc", "--endpoint", endpoint,
                        "--cursor-file", str(cursor)], env) as proc:
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            return None, err.decode()
    return proc.returncode, err.decode()


def began(lines: list[str]) -> str:
    """The one line saying an outage began."""
    said = [line for line in lines if "failed (" in line]
    assert len(said) == 1, lines
    return said[0]


# -- which proxy ---------------------------------------------------------------


@pytest.mark.parametrize(("environ", "host", "port", "expected"), [
    ({}, COLLECTOR, "4317", None),
    # grpc-go asks for an https:// URL's proxy whatever the channel's security.
    ({"HTTPS_PROXY": "proxy:3128"}, COLLECTOR, "4317", ("http://proxy:3128", "HTTPS_PROXY")),
    ({"HTTP_PROXY": "http://proxy:3128", "http_proxy": "http://proxy:3128"}, COLLECTOR, "4317",
     None),
    ({"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:2"}, COLLECTOR, "4317",
     ("http://upper:1", "HTTPS_PROXY")),
    ({"HTTPS_PROXY": "", "https_proxy": "http://lower:2"}, COLLECTOR, "4317",
     ("http://lower:2", "https_proxy")),
    ({"grpc_proxy": "http://grpc:3", "HTTPS_PROXY": "http://upper:1"}, COLLECTOR, "4317",
     ("http://grpc:3", "grpc_proxy")),
    # grpc-go speaks HTTP CONNECT to any proxy; gRPC's C core only to an http:// one.
    ({"HTTPS_PROXY": "https://agent:pw@proxy:3128"}, COLLECTOR, "4317",
     ("http://agent:pw@proxy:3128", "HTTPS_PROXY")),
    # A value that is no proxy's URL is no proxy to either.
    ({"HTTPS_PROXY": "not a proxy"}, COLLECTOR, "4317", None),
    ({"HTTPS_PROXY": "http://proxy:port"}, COLLECTOR, "4317", None),
    ({"HTTPS_PROXY": "http://proxy:1"}, "localhost", "4317", None),
    ({"HTTPS_PROXY": "http://proxy:1"}, "127.0.0.7", "4317", None),
    ({"HTTPS_PROXY": "http://proxy:1"}, "::1", "4317", None),
    ({"HTTPS_PROXY": "http://proxy:1"}, "", "", None),  # a unix: socket
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "*"}, COLLECTOR, "4317", None),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "a.b, example.com"}, "example.com", "4317",
     None),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "example.com"}, "x.example.com", "4317",
     None),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "example.com"}, "badexample.com", "4317",
     ("http://proxy:1", "HTTPS_PROXY")),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": ".example.com"}, "example.com", "4317",
     ("http://proxy:1", "HTTPS_PROXY")),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "*.example.com"}, "x.example.com", "4317",
     None),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "example.com:4317"}, "example.com", "443",
     ("http://proxy:1", "HTTPS_PROXY")),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "example.com:4317"}, "example.com", "4317",
     None),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "10.0.0.0/8"}, "10.1.2.3", "4317", None),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "10.0.0.0/8"}, "11.1.2.3", "4317",
     ("http://proxy:1", "HTTPS_PROXY")),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "[2001:db8::1]:4317"}, "2001:db8::1", "4317",
     None),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "", "no_proxy": "example.com"},
     "example.com", "4317", None),
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "example.com", "no_proxy": "other.com"},
     "example.com", "4317", None),
    ({"HTTPS_PROXY": "http://proxy:1", "no_grpc_proxy": "other.com", "NO_PROXY": "example.com"},
     "example.com", "4317", ("http://proxy:1", "HTTPS_PROXY")),
    # gRPC's C core, handed a proxy, still goes direct to a host its own
    # variables exempt: no proxy is said for it.
    ({"HTTPS_PROXY": "http://proxy:1", "NO_PROXY": "other.com", "no_proxy": "example.com"},
     "example.com", "4317", None),
    ({"HTTPS_PROXY": "http://proxy:1", "no_proxy": ".example.com"}, "example.com", "4317", None),
    ({"HTTPS_PROXY": "http://proxy:1", "no_grpc_proxy": "10.0.0.0/8"}, "10.1.2.3", "4317", None),
])
def test_the_grpc_proxy_is_the_one_grpc_go_takes_from_the_environment(environ, host, port,
                                                                       expected):
    assert grpc_proxy(host, port, environ) == expected


# -- through a real proxy ------------------------------------------------------


def test_spans_go_through_the_proxy_HTTPS_PROXY_names_over_grpc(tmp_path):
    # gRPC's C core reads only the lowercase variables: with HTTPS_PROXY set,
    # as requests and grpc-go read it, HTTP went through the proxy and gRPC
    # tried the collector directly, which only the proxy can reach.
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    events = scenario_db(db)
    with GrpcReceiver() as receiver, connect_proxy() as (proxy_port, heads):
        code, err = export(db, cursor, f"http://{COLLECTOR}:{receiver.port}",
                           clean_env(HTTPS_PROXY=f"http://127.0.0.1:{proxy_port}"))
    assert (code, err) == (0, "")
    assert received_keys(receiver) == expected_keys(events)
    assert heads and all(h.startswith(f"CONNECT {COLLECTOR}:{receiver.port} ") for h in heads)
    assert cursor.read_text() == f"{events[-1].seq}\n"


def test_the_uppercase_HTTPS_PROXY_wins_over_the_lowercase_one_as_in_grpc_go(tmp_path):
    # x/net's httpproxy reads HTTPS_PROXY before https_proxy; gRPC's C core
    # took https_proxy, a proxy the reference would not have used.
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    events = scenario_db(db)
    with (GrpcReceiver() as receiver, connect_proxy() as (upper, upper_heads),
          connect_proxy(b"HTTP/1.1 403 Forbidden\r\n\r\n") as (lower, lower_heads)):
        code, err = export(db, cursor, f"http://{COLLECTOR}:{receiver.port}",
                           clean_env(HTTPS_PROXY=f"http://127.0.0.1:{upper}",
                                     https_proxy=f"http://127.0.0.1:{lower}"))
    assert (code, err) == (0, "")
    assert received_keys(receiver) == expected_keys(events)
    assert upper_heads and lower_heads == []


def test_http_proxy_is_not_a_grpc_proxy_as_in_grpc_go(tmp_path):
    # grpc-go asks for the proxy of an https:// URL, TLS or not: HTTP_PROXY
    # and http_proxy never apply. gRPC's C core sent through http_proxy.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with connect_proxy() as (port, heads):
        proxy = f"http://127.0.0.1:{port}"
        lines = outage_lines(db, cursor, "--protocol", "grpc", "--endpoint",
                             f"http://{COLLECTOR}:4317", marker=b"failed (",
                             whole_env=clean_env(HTTP_PROXY=proxy, http_proxy=proxy, **QUICK))
    assert began(lines).startswith(f"otel: exporting 20 spans failed (http://{COLLECTOR}:4317: ")
    assert "proxy" not in began(lines)
    assert heads == []


def test_a_grpc_collector_name_that_does_not_resolve_is_said_without_a_stray_bracket():
    # The line ended "Domain name not found]": the end of gRPC's list of causes.
    assert gist("Failed to export spans to collector.invalid:4317, error code: "
                "StatusCode.UNAVAILABLE, error details: errors resolving collector.invalid:4317: "
                "[field:hostname lookup error:address lookup failed for collector.invalid:4317: "
                "Domain name not found]") == "StatusCode.UNAVAILABLE: Domain name not found"


def test_NO_PROXY_exempts_a_collector_from_the_grpc_proxy(tmp_path):
    # gRPC's C core reads only no_grpc_proxy and no_proxy: a collector listed
    # in NO_PROXY was sent through https_proxy all the same.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with connect_proxy() as (port, heads):
        lines = outage_lines(db, cursor, "--protocol", "grpc", "--endpoint",
                             f"http://{COLLECTOR}:4317", marker=b"failed (",
                             whole_env=clean_env(https_proxy=f"http://127.0.0.1:{port}",
                                                 NO_PROXY=f"example.com,{COLLECTOR}", **QUICK))
    assert "proxy" not in began(lines)
    assert heads == []


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_failure_through_the_grpc_proxy_names_the_proxy_and_hides_its_password(
        tmp_path, scheme):
    # The line blamed the collector, which was never contacted: the proxy
    # refused. Over TLS and plain text alike, as HTTPS_PROXY serves both.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    endpoint = f"{scheme}://{COLLECTOR}:4317"
    with connect_proxy(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                       b"Content-Length: 0\r\n\r\n") as (port, heads):
        lines = outage_lines(db, cursor, "--protocol", "grpc", "--endpoint", endpoint,
                             marker=b"failed (", whole_env=clean_env(
                                 HTTPS_PROXY=f"http://agent:s3cret@127.0.0.1:{port}", **QUICK))
    line = began(lines)
    assert lines[0] == line  # and no log line of gRPC's own about the proxy before it
    assert line.startswith(f"otel: exporting 20 spans failed ({endpoint}: StatusCode.UNAVAILABLE: ")
    assert line.endswith(
        f" (through the proxy http://agent:***@127.0.0.1:{port} from HTTPS_PROXY; list the "
        "collector's host in NO_PROXY to send directly)); retrying with backoff, the cursor "
        "stays before this page")
    assert "407" in line
    assert not any("s3cret" in line for line in lines)
    auth = base64.b64encode(b"agent:s3cret").decode()
    assert f"Proxy-Authorization: Basic {auth}" in heads[0]


# -- a collector that wants a client certificate ------------------------------


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_CERTIFICATE",
                                      "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"])
def test_a_collector_wanting_a_client_certificate_is_said_to_over_grpc(tmp_path, variable):
    # gRPC says only "Socket closed" of a TLS 1.3 collector that refuses a
    # client without a certificate; over HTTP the line already said what to set.
    db, cursor = str(tmp_path / "runs.db"), str(tmp_path / "cursor")
    scenario_db(db)
    with GrpcReceiver(client_auth=True) as receiver:
        lines = outage_lines(db, cursor, "--protocol", "grpc", "--endpoint", receiver.endpoint,
                             marker=b"failed (", env={**QUICK, variable: TLS_CA})
    assert began(lines) == (
        f"otel: exporting 20 spans failed ({receiver.endpoint}: StatusCode.UNAVAILABLE: the "
        "collector closed the TLS connection, as one that wants a client certificate does: "
        "name one in OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, its key in "
        "OTEL_EXPORTER_OTLP_CLIENT_KEY); retrying with backoff, the cursor stays before this "
        "page")


@pytest.mark.parametrize("case", ["beside a traces CA", "with no CA variable", "key inside"])
def test_the_client_certificate_the_sentence_names_is_the_one_sent_over_grpc(tmp_path, case):
    # The SDK's gRPC exporter read a client certificate only beside a CA file
    # of its own kind: none was sent beside OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE,
    # or with no CA variable (a collector the host trusts already, here by
    # gRPC's own roots file), so naming one as the line says changed nothing;
    # and one without a key variable killed the process in gRPC's C core.
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    events = scenario_db(db)
    env = {"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": TLS_CLIENT_CERT,
           "OTEL_EXPORTER_OTLP_CLIENT_KEY": TLS_CLIENT_KEY}
    if case == "beside a traces CA":
        env["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"] = TLS_CA
    elif case == "with no CA variable":
        env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = TLS_CA
    else:
        both = tmp_path / "client-and-key.pem"
        both.write_bytes(Path(TLS_CLIENT_CERT).read_bytes() + Path(TLS_CLIENT_KEY).read_bytes())
        env = {"OTEL_EXPORTER_OTLP_CERTIFICATE": TLS_CA,
               "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(both)}
    with GrpcReceiver(client_auth=True) as receiver:
        code, err = export(db, cursor, receiver.endpoint, clean_env(**env))
    assert (code, err) == (0, "")
    assert received_keys(receiver) == expected_keys(events)
