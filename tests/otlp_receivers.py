"""Real OTLP receivers on 127.0.0.1 for tests: gRPC and HTTP (protobuf).

Each receiver listens on a free port, decodes every
``ExportTraceServiceRequest`` it is sent, and keeps the spans as
:class:`ReceivedSpan` values that compare across transports. ``fail_next(n)``
makes the next ``n`` requests fail as a collector that is down does (gRPC
UNAVAILABLE, HTTP 503), without keeping their spans; ``retry_after`` adds an
HTTP ``Retry-After`` to those 503s (``"0"``: the SDK retries at once instead
of after its 1, 2, 4 s backoff). ``tls=True`` serves
TLS with ``tests/tls/server.pem`` (signed by ``TLS_CA``) on an ``https://``
endpoint; ``client_auth=True`` also requires a client certificate that CA
signed. Both are context managers that stop cleanly on exit::

    with GrpcReceiver() as rx:
        exporter = OTLPSpanExporter(endpoint=rx.endpoint, insecure=True)
        ...
        assert rx.spans()
"""

from __future__ import annotations

import gzip
import ssl
import threading
import time
import zlib
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = ["TLS_CA", "TLS_CLIENT_CERT", "TLS_CLIENT_KEY", "GrpcReceiver", "HttpReceiver",
           "ReceivedSpan"]

_TLS = Path(__file__).parent / "tls"
#: The test CA, and the client certificate and key it signed (see tests/tls/README.md).
TLS_CA, TLS_CLIENT_CERT, TLS_CLIENT_KEY = (str(_TLS / name)
                                           for name in ("ca.pem", "client.pem", "client.key"))
_SERVER_CERT, _SERVER_KEY = _TLS / "server.pem", _TLS / "server.key"


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    if which == "kvlist_value":
        return _attrs(v.kvlist_value.values)
    return getattr(v, which) if which else None


def _attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        assert isinstance(kv, KeyValue)
        out[kv.key] = _value(kv.value)
    return out


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived, with ids as lowercase hex."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[tuple[str, int, dict[str, Any]], ...]
    status_code: int
    status_message: str
    scope: str
    resource: dict[str, Any]

    def key(self) -> tuple[Any, ...]:
        """Everything but the resource, hashable, for set comparisons."""
        return (
            self.trace_id, self.span_id, self.parent_span_id, self.name, self.kind,
            self.start_ns, self.end_ns, tuple(sorted(self.attributes.items())),
            tuple((n, t, tuple(sorted(a.items()))) for n, t, a in self.events),
            self.status_code, self.status_message, self.scope,
        )


def decode_request(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans = []
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append(ReceivedSpan(
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(),
                    name=s.name,
                    kind=s.kind,
                    start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano,
                    attributes=_attrs(s.attributes),
                    events=tuple((e.name, e.time_unix_nano, _attrs(e.attributes))
                                 for e in s.events),
                    status_code=s.status.code,
                    status_message=s.status.message,
                    scope=ss.scope.name,
                    resource=resource,
                ))
    return spans


class _Collected:
    """Spans and request counts, shared by a receiver's handler threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._fail = 0
        self.requests = 0
        self.refused = 0
        self.headers: list[dict[str, str]] = []
        #: Answer every request with a partial success rejecting (spans, message).
        self.reject: tuple[int, str] | None = None
        #: HTTP: answer the next requests with a 307 to this URL, then as usual.
        self.redirect: tuple[int, str] = (0, "")
        #: Hold every answer this long (a collector that does not answer, or a slow one).
        self.hang = 0.0
        #: HTTP: requests whose body arrived, answered or not.
        self.arrived = 0
        #: HTTP: the Retry-After header of a refusal fail_next asked for (None: none).
        self.retry_after: str | None = None

    def answer(self) -> trace_service_pb2.ExportTraceServiceResponse:
        reply = trace_service_pb2.ExportTraceServiceResponse()
        if self.reject is not None:
            reply.partial_success.rejected_spans, reply.partial_success.error_message = (
                self.reject)
        return reply

    def redirecting(self) -> str:
        """Where the next request is sent instead, counted down; '' for none."""
        with self._lock:
            left, where = self.redirect
            if left <= 0:
                return ""
            self.redirect = (left - 1, where)
            self.requests += 1
            return where

    def fail_next(self, n: int) -> None:
        with self._lock:
            self._fail = n

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest,
             headers: dict[str, str]) -> bool:
        """Keep the request's spans; False when told to refuse it."""
        with self._lock:
            self.requests += 1
            self.headers.append(headers)
            if self._fail > 0:
                self._fail -= 1
                self.refused += 1
                return False
            self._spans.extend(decode_request(request))
            return True

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, collected: _Collected) -> None:
        self._collected = collected

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - generated name
        headers = {k: v for k, v in context.invocation_metadata()}
        if self._collected.hang:
            time.sleep(self._collected.hang)
        if not self._collected.take(request, headers):
            context.abort(grpc.StatusCode.UNAVAILABLE, "receiver told to fail")
        return self._collected.answer()


class GrpcReceiver(_Collected):
    """``TraceService/Export`` over gRPC (grpcio) on 127.0.0.1. A request over
    ``max_bytes`` is refused by grpc itself (RESOURCE_EXHAUSTED, "Received
    message larger than max"), as a collector's ``max_recv_msg_size_mib`` does."""

    def __init__(self, port: int = 0, max_bytes: int | None = None, tls: bool = False,
                 client_auth: bool = False) -> None:
        super().__init__()
        options = [("grpc.max_receive_message_length", max_bytes)] if max_bytes else []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=options)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self),
                                                                  self._server)
        address = f"127.0.0.1:{port}"
        if tls or client_auth:
            credentials = grpc.ssl_server_credentials(
                [(_SERVER_KEY.read_bytes(), _SERVER_CERT.read_bytes())],
                root_certificates=Path(TLS_CA).read_bytes() if client_auth else None,
                require_client_auth=client_auth)
            self.port = self._server.add_secure_port(address, credentials)
            self.endpoint = f"https://127.0.0.1:{self.port}"
        else:
            self.port = self._server.add_insecure_port(address)
            self.endpoint = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GrpcReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait(5)


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        self.server.collected.arrived += 1  # read by the test thread only
        if self.server.collected.hang:
            time.sleep(self.server.collected.hang)
        where = self.server.collected.redirecting()
        if where:
            self.send_response(307)
            self.send_header("Location", where)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        limit = self.server.max_bytes
        if self.path != "/v1/traces" or (limit is not None and length > limit):
            self.send_response(404 if self.path != "/v1/traces" else 413)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        encoding = self.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        headers = {k.lower(): v for k, v in self.headers.items()}
        if not self.server.collected.take(request, headers):
            self.send_response(503)
            if self.server.collected.retry_after is not None:
                self.send_header("Retry-After", self.server.collected.retry_after)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        reply = self.server.collected.answer().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        return None


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    collected: _Collected
    max_bytes: int | None = None


class HttpReceiver(_Collected):
    """``POST /v1/traces`` (OTLP/HTTP, protobuf) on 127.0.0.1. A body over
    ``max_bytes`` gets 413, as a collector's ``max_request_body_size`` does."""

    def __init__(self, port: int = 0, max_bytes: int | None = None, tls: bool = False,
                 client_auth: bool = False) -> None:
        super().__init__()
        self._server = _HttpServer(("127.0.0.1", port), _Handler)
        self._server.collected = self
        self._server.max_bytes = max_bytes
        self.port = self._server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        if tls or client_auth:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(_SERVER_CERT, _SERVER_KEY)
            if client_auth:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(TLS_CA)
            # The handshake is made by accept(): one that fails is dropped there.
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self.base = f"https://127.0.0.1:{self.port}"
        self.endpoint = self.base + "/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> HttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
