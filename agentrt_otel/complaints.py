"""What the SDK's OTLP exporter said when an export failed, in a few words.

The SDK exporters log each failed attempt themselves, several lines per
attempt with the transport's own exception text
(``Transient error HTTPConnectionPool(host='127.0.0.1', port=4318): Max
retries exceeded ... [Errno 111] Connection refused ...``), and return a bare
FAILURE. A sidecar waiting out a collector outage would print those lines for
as long as it lasts. :class:`ExporterComplaints` takes them instead: it keeps
the last one, and :meth:`ExporterComplaints.reason` gives its gist for the
one line :class:`~agentrt_otel.transport.OTelSink` writes when an outage
begins, and :meth:`ExporterComplaints.too_large` tells it when the collector
refused a request for its size, so the sink sends the spans in smaller ones
instead of waiting for a request that can never be accepted;
:meth:`ExporterComplaints.retry_after` tells it how long a throttling
collector asked it to wait (``Retry-After``).
"""

from __future__ import annotations

import logging
import re

from agentrt.trace import sanitize
from agentrt_otel.http_failures import CLIENT_CERT_VARIABLES

__all__ = ["ATTEMPTS_LOGGER", "CLIENT_CERTIFICATE_WANTED", "NO_TIME_LEFT", "SDK_EXPORTER_LOGGER",
           "ExporterComplaints", "gist", "says_too_large"]

#: The parent of the SDK's OTLP exporter loggers (gRPC and HTTP).
SDK_EXPORTER_LOGGER = "opentelemetry.exporter.otlp"
#: Where the checked HTTP session (:mod:`agentrt_otel.answers`) says why each
#: attempt failed: the SDK says nothing but "due to timeout, max retries or
#: shutdown" when it gives up before a retry whose wait (its backoff, or a
#: ``Retry-After``) is longer than what is left of the export timeout.
ATTEMPTS_LOGGER = "agentrt_otel.attempts"

#: Why an attempt asked for after the export's deadline was not made
#: (:mod:`agentrt_otel.answers`): its failure does not replace the cause before it.
NO_TIME_LEFT = "no time left of the export timeout for another attempt"
#: What a gRPC connection closed after its TLS handshake, with no client
#: certificate sent, is said to be (:mod:`agentrt_otel.answers`).
CLIENT_CERTIFICATE_WANTED = ("the collector closed the TLS connection, as one that wants a "
                             f"client certificate does: name one in {CLIENT_CERT_VARIABLES}")
#: The words a failure through a proxy ends with (:mod:`agentrt_otel.answers`).
_THROUGH_PROXY = re.compile(r" \(through the proxy [^()]*\)$")
#: Lines that follow a cause without naming one; they do not replace it.
_NO_CAUSE = ("due to timeout, max retries or shutdown", "Shutdown in progress", NO_TIME_LEFT)
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
#: The gRPC exporter's failure line, and its line for a failure it retries.
_GRPC_DETAILS = re.compile(r"error code: (StatusCode\.\w+), error details: (.*)"
                           r"|^Transient error (StatusCode\.\w+) encountered .*Error details: (.*)")
#: gRPC's own preambles for a connection that failed, before the chain of
#: causes they end with ("failed to connect to all addresses; last error:
#: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused").
_GRPC_CONNECTING = re.compile(r"failed to connect to all addresses|connections to all backends "
                              r"failing|DNS resolution failed|errors resolving ")
_TLS_FAILED = re.compile(r"handshake failed", re.IGNORECASE)
_SSL_REASON = re.compile(r"SSL routines:[^:]*:([A-Z_]+)")
#: The HTTP exporter's last line for a failed request: its status and reason.
_HTTP_FAILED = re.compile(r"batch code: (\d+|None), reason: (.*)")
_HTTP_TRANSIENT = re.compile(r"^Transient error (.*) encountered while exporting")
_NO_ANSWER = "due to timeout, max retries or shutdown"
_NO_ANSWER_SAID = "no answer within the export timeout (OTEL_EXPORTER_OTLP_TIMEOUT)"
#: gRPC's words for an endpoint that answered something other than HTTP/2
#: (grpc-core: an HTTP/1.x status line, or any first frame but SETTINGS).
_HTTP1_SERVER = re.compile(r"http1\.x server|Expected SETTINGS frame as the first frame")
_MAX = 200
#: A collector refusing a request for its size: HTTP 413 (the HTTP exporter's
#: "batch code: 413"), gRPC's "Received message larger than max" (grpcio and
#: grpc-go word it alike; its status, RESOURCE_EXHAUSTED, also means "overloaded"
#: and is not enough), and the HTTP exporter's own ``max_request_size`` check.
_TOO_LARGE = re.compile(
    r"code: 413\b|larger than max|exceeds max_request_size", re.IGNORECASE)


def gist(message: str) -> str:
    """The part of an SDK exporter message that says why: the OS error of a
    connection that failed, a gRPC status and its details (a collector's
    whole, gRPC's own words for a connection that failed cut to the cause they
    end with), else the message (its first line). What came from the collector
    is made safe for a terminal line and cut at 200 characters: its words are
    not ours to print raw."""
    return _gist(message)


def collector_text(text: str) -> str:
    """Words that came from a collector (or over its connection), as one line of
    at most 200 characters with no terminal control in it (``sanitize``)."""
    return sanitize(text)[:_MAX]


def _gist(message: str) -> str:
    found = _ERRNO.search(message)
    if found:  # the OS's words, but found in text a collector may have written
        return collector_text(found.group(1).strip())
    found = _GRPC_DETAILS.search(message)
    if found:
        code, details = (part for part in found.groups() if part is not None)
        details = details.removesuffix(": OK")  # grpc's status text after the cause
        through = _THROUGH_PROXY.search(details)
        if through:
            return _grpc_gist(code, details[:through.start()]) + _proxy_note(through)
        return _grpc_gist(code, details)
    first = message.strip().splitlines()[0] if message.strip() else ""
    note = ""
    through = _THROUGH_PROXY.search(first)
    if through:  # our note on the proxy, kept whole after the collector's cut words
        first, note = first[:through.start()], _proxy_note(through)
    found = _HTTP_FAILED.search(first)
    if found:
        code, reason = found.groups()
        said = reason if code == "None" or reason.startswith(f"HTTP {code}") else (
            f"HTTP {code} {reason}")
        return collector_text(said) + note
    found = _HTTP_TRANSIENT.search(first)
    if found:  # a retried refusal: the note ends the words the SDK quotes
        words = found.group(1)
        inner = _THROUGH_PROXY.search(words)
        if inner:
            words, note = words[:inner.start()], _proxy_note(inner)
        return collector_text(words) + note
    if _NO_ANSWER in first:
        return _NO_ANSWER_SAID + note
    return collector_text(first) + note


def _proxy_note(through: re.Match[str]) -> str:
    """The note on the proxy the request went through (ours, made safe all the
    same: a collector's details can end with words shaped like it)."""
    return sanitize(through.group(0))


def _grpc_gist(code: str, details: str) -> str:
    """The gist of a gRPC failure's status and details."""
    if details == CLIENT_CERTIFICATE_WANTED:
        return f"{code}: {details}"
    if _TLS_FAILED.search(details):
        ssl = _SSL_REASON.search(details)
        why = f" ({ssl.group(1).lower().replace('_', ' ')})" if ssl else ""
        return (f"{code}: TLS handshake failed{why}: a plain-text collector needs "
                "--insecure, a TLS one a certificate this host trusts")[:_MAX]
    if _HTTP1_SERVER.search(details):
        return (f"{code}: the endpoint did not answer in HTTP/2, as gRPC does: if it is "
                "an OTLP/HTTP port (a collector's is usually 4318), use --protocol "
                "http/protobuf")[:_MAX]
    cause = details  # a collector's own words, kept whole ("x-api-key header: not valid ...")
    if _GRPC_CONNECTING.match(details):
        cause = details.rsplit(": ", 1)[-1]  # the cause gRPC's chain of words ends with
        if cause.endswith("]") and "[" not in cause:
            cause = cause[:-1]  # the end of a bracketed list ("[...: Domain name not found]")
    if cause == "Deadline Exceeded":
        return f"{code}: {_NO_ANSWER_SAID}"
    return collector_text(f"{code}: {cause}" if cause not in ("", "None") else code)


def says_too_large(message: str) -> bool:
    """Whether an SDK exporter message says the collector refused the request
    for its size (so the same spans may pass in smaller requests)."""
    return _TOO_LARGE.search(message) is not None


class ExporterComplaints(logging.Handler):
    """Holds the SDK exporter's last warning or error instead of printing it
    (a closing "gave up" line does not replace the cause logged before it).

    ``endpoint``, when given, prefixes every :meth:`reason`: an operator
    reading the outage line learns which collector is down.
    """

    def __init__(self, endpoint: str = "") -> None:
        super().__init__(logging.WARNING)
        self._endpoint = endpoint
        self._last = ""
        self._retry_after = 0.0
        self._set_aside: list[tuple[logging.Logger, logging.Filter]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "retry_after" in record.__dict__:  # a refusal's answer (agentrt_otel.answers)
            self._retry_after = record.__dict__["retry_after"] or 0.0
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad log call must not stop the export
            message = str(record.msg)
        if self._last and any(text in message for text in _NO_CAUSE):
            return
        self._last = message

    def reason(self) -> str:
        """The gist of the last complaint, after the endpoint if one was given
        (``<endpoint> refused them`` when the exporter said nothing)."""
        if not self._last:
            return f"{self._endpoint} refused them" if self._endpoint else ""
        return f"{self._endpoint}: {gist(self._last)}" if self._endpoint else gist(self._last)

    def heard(self) -> bool:
        """Whether the exporter complained since :meth:`clear`: an attempt still
        running then met a failure it is retrying after (a refusal, a name that
        did not resolve, a connection refused)."""
        return bool(self._last)

    def too_large(self) -> bool:
        """Whether the last complaint says the collector refused a request for its size."""
        return says_too_large(self._last)

    def retry_after(self) -> float:
        """The seconds the last refusal's ``Retry-After`` asked to wait, 0 if none."""
        return self._retry_after

    def clear(self) -> None:
        """Forget the last complaint: called before an attempt, so what follows
        explains that attempt alone."""
        self._last = ""
        self._retry_after = 0.0

    def install(self) -> ExporterComplaints:
        """Take over the SDK exporter loggers' output (for a command's lifetime),
        and listen to :data:`ATTEMPTS_LOGGER` too.

        Install it after building the exporter: the SDK's gRPC exporter logger
        drops a line repeating the previous one's template within 20 s (a
        ``DuplicateFilter``), which would leave a repeated failure unexplained.
        While installed, those filters are set aside (this handler already
        turns a run of failures into one line) and :meth:`uninstall` puts them back.
        """
        logger = logging.getLogger(SDK_EXPORTER_LOGGER)
        logger.addHandler(self)
        logger.propagate = False
        logging.getLogger(ATTEMPTS_LOGGER).addHandler(self)
        self._set_aside = []
        for name in list(logging.Logger.manager.loggerDict):
            if name.startswith(SDK_EXPORTER_LOGGER + "."):
                child = logging.getLogger(name)
                for f in list(child.filters):
                    if isinstance(f, logging.Filter) and type(f).__name__ == "DuplicateFilter":
                        child.removeFilter(f)
                        self._set_aside.append((child, f))
        return self

    def uninstall(self) -> None:
        logger = logging.getLogger(SDK_EXPORTER_LOGGER)
        logger.removeHandler(self)
        logger.propagate = True
        logging.getLogger(ATTEMPTS_LOGGER).removeHandler(self)
        for child, f in self._set_aside:
            child.addFilter(f)
        self._set_aside = []
