"""An OTLP/HTTP request that met something other than an HTTP/1.1 collector, in one sentence.

Python's HTTP stack reports such an endpoint in its own terms, which the SDK
exporter logs as they are and the outage line would repeat:

- a gRPC port (a collector's 4317 speaks HTTP/2 only) answers with binary
  HTTP/2 frames: ``('Connection aborted.', BadStatusLine('\\x00\\x00\\x18\\x04...'))``;
- a port that closes at once (a TLS or gRPC server refusing plain HTTP/1.1):
  ``RemoteDisconnected('Remote end closed connection without response')``;
- an ``https://`` endpoint that is plain text, a certificate this host does
  not trust, or a collector that wants a client certificate:
  ``HTTPSConnectionPool(...): Max retries exceeded ... SSLError(...)``.

:func:`sentence` turns each into one sentence saying what happened and the
fix; :mod:`agentrt_otel.answers` raises it in place of the original, as an
exception of the same class, so the SDK classifies and retries it as before.
"""

from __future__ import annotations

import http.client
import re
import ssl

__all__ = ["CLIENT_CERT_VARIABLES", "sentence"]

#: The TLS reason in an ``ssl.SSLError`` text: ``[SSL: WRONG_VERSION_NUMBER] ...``.
_SSL_REASON = re.compile(r"\[SSL: ([A-Z0-9_]+)\]")


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and what it wraps (its arguments, cause and context), in order."""
    seen: list[BaseException] = []
    todo = [error]
    while todo and len(seen) < 20:
        err = todo.pop(0)
        if any(err is s for s in seen):
            continue
        seen.append(err)
        todo.extend(a for a in err.args if isinstance(a, BaseException))
        todo.extend(c for c in (err.__cause__, err.__context__) if c is not None)
    return seen


def _not_http1(error: http.client.BadStatusLine) -> str:
    if isinstance(error, http.client.RemoteDisconnected):
        return ("the endpoint closed the connection without an HTTP/1.1 answer, as a TLS "
                "or gRPC port may: a TLS one needs an https:// endpoint, a gRPC one "
                "--protocol grpc")
    line = str(getattr(error, "line", error))
    if line.startswith("\x00\x00"):  # an HTTP/2 frame header: a 3-byte length, then its type
        return ("the endpoint answered in HTTP/2 frames, not HTTP/1.1, as a gRPC server "
                "does: use --protocol grpc, or the collector's OTLP/HTTP port (usually 4318)")
    return (f"the endpoint did not answer HTTP/1.1 (its answer began {ascii(line[:16])}): "
            "this URL is not a collector's OTLP/HTTP receiver (usually port 4318)")


#: What to name when a collector wants a client certificate.
CLIENT_CERT_VARIABLES = ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, its key in "
                         "OTEL_EXPORTER_OTLP_CLIENT_KEY")


def _tls_failed(error: ssl.SSLError) -> str:
    reason = getattr(error, "reason", None)
    if not isinstance(reason, str):
        found = _SSL_REASON.search(str(error))
        reason = found.group(1) if found else ""
    if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        return f"the collector asks for a client certificate: name one in {CLIENT_CERT_VARIABLES}"
    if isinstance(error, ssl.SSLEOFError) and not reason:
        # Closed after the handshake (one cut short says UNEXPECTED_EOF_WHILE_READING):
        # a TLS 1.3 server refusing a client without a certificate may close
        # before its alert is read.
        return ("the endpoint closed the TLS connection, as a collector may if it needs a "
                f"client certificate: name one in {CLIENT_CERT_VARIABLES}")
    why = f" ({reason.lower().replace('_', ' ')})" if reason else ""
    return (f"TLS handshake failed{why}: a plain-text collector needs an http:// endpoint, a "
            "TLS one a certificate this host trusts (OTEL_EXPORTER_OTLP_CERTIFICATE)")


def sentence(error: BaseException) -> str | None:
    """What ``error`` (raised by ``requests`` for one request) says about the
    endpoint, in one sentence; None when it is an ordinary failure (refused,
    reset, a timeout), whose own text is already short."""
    for err in _causes(error):
        if isinstance(err, http.client.BadStatusLine):
            return _not_http1(err)
        if isinstance(err, ssl.SSLError):
            return _tls_failed(err)
    return None
