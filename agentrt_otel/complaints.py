"""What the SDK's OTLP exporter said when an export failed, in a few words.

The SDK exporters log each failed attempt themselves, several lines per
attempt with the transport's own exception text
(``Transient error HTTPConnectionPool(host='127.0.0.1', port=4318): Max
retries exceeded ... [Errno 111] Connection refused ...``), and return a bare
FAILURE. A sidecar waiting out a collector outage would print those lines for
as long as it lasts. :class:`ExporterComplaints` takes them instead: it keeps
the last one, and :meth:`ExporterComplaints.reason` gives its gist for the
one line :class:`~agentrt_otel.transport.OTelSink` writes when an outage
begins.
"""

from __future__ import annotations

import logging
import re

__all__ = ["SDK_EXPORTER_LOGGER", "ExporterComplaints", "gist"]

#: The parent of the SDK's OTLP exporter loggers (gRPC and HTTP).
SDK_EXPORTER_LOGGER = "opentelemetry.exporter.otlp"

#: Lines that follow a cause without naming one; they do not replace it.
_NO_CAUSE = ("due to timeout, max retries or shutdown", "Shutdown in progress")
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
_GRPC_DETAILS = re.compile(r"error code: (StatusCode\.\w+), error details: (.*)")
_MAX = 200


def gist(message: str) -> str:
    """The part of an SDK exporter message that says why: the OS error of a
    connection that failed, a gRPC status and its details, else the message
    (its first line, at most 200 characters)."""
    found = _ERRNO.search(message)
    if found:
        return found.group(1).strip()
    found = _GRPC_DETAILS.search(message)
    if found:
        code, details = found.groups()
        return f"{code}: {details.rsplit(': ', 1)[-1]}"[:_MAX]
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first[:_MAX]


class ExporterComplaints(logging.Handler):
    """Holds the SDK exporter's last warning or error instead of printing it
    (a closing "gave up" line does not replace the cause logged before it)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._last = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad log call must not stop the export
            message = str(record.msg)
        if self._last and any(text in message for text in _NO_CAUSE):
            return
        self._last = message

    def reason(self) -> str:
        """The gist of the last complaint, '' when there was none."""
        return gist(self._last) if self._last else ""

    def install(self) -> ExporterComplaints:
        """Take over the SDK exporter loggers' output (for a command's lifetime)."""
        logger = logging.getLogger(SDK_EXPORTER_LOGGER)
        logger.addHandler(self)
        logger.propagate = False
        return self

    def uninstall(self) -> None:
        logger = logging.getLogger(SDK_EXPORTER_LOGGER)
        logger.removeHandler(self)
        logger.propagate = True
