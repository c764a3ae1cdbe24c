"""A local OTLP/HTTP receiver for the OTel benchmark, run as its own process.

``python -m bench._receiver`` listens on 127.0.0.1 (a free port, printed on
stdout as the first line), decodes every ``POST /v1/traces`` body as an
``ExportTraceServiceRequest`` (as a collector does) and counts the spans.
``GET /count`` answers the count so far. It runs in a separate process so that
decoding does not share the measured side's GIL. HTTP/1.1 with keep-alive, as
the SDK's exporter uses it.
"""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

_REPLY = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans = 0
        self.requests = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self.server.counts.lock:
            self.server.counts.spans += n
            self.server.counts.requests += 1
        self._reply(_REPLY, "application/x-protobuf")

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        with self.server.counts.lock:
            text = f"{self.server.counts.spans} {self.server.counts.requests}\n"
        self._reply(text.encode(), "text/plain")

    def _reply(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    counts: _Counts


def main() -> None:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.counts = _Counts()
    print(server.server_address[1], flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.2)


if __name__ == "__main__":
    main()
