"""Shipping a page of events' spans, and saying only once they have arrived.

:class:`OTelSink` is what a follower drives. Its contract is small:

``handle_page(events)``
    Maps the page's events to spans and hands them to the exporter's
    ``export()`` (a page's spans in batches of at most ``max_batch``). It
    returns only when the collector has accepted every span, so the caller
    saves its cursor after it returns, and only then. A failed export is
    retried, with ``2**n`` backoff and jitter capped at ``backoff.maximum``,
    for as long as it takes: a page is never skipped. The wait is on the
    ``stop`` event, so a stop cuts it short; then ``handle_page`` raises
    :class:`ExportStopped` and the caller must *not* save its cursor for the
    page (a restart sends it again: at most one page twice), or, when the
    first batches of a page handed in the first time were accepted,
    ``PartialPage`` for the events whose spans all were (the follower saves
    its cursor after them). A stop that
    comes while the collector is healthy does not interrupt the page in hand;
    an export attempt still running :data:`STOP_GRACE` (5 s) after a stop (a
    collector that does not answer) is given up, so a stop never waits for
    the exporter's timeout.

A collector that refuses a request for its size (HTTP 413, gRPC "received
message larger than max", as ``complaints`` tell) would refuse it forever, so
the batch is cut in two and both halves are sent at once, without a wait; the
smaller size is kept for the pages that follow. A single span too large for
the collector is an outage like any other, retried until the collector's
limit is raised.

``close()``
    Sets ``stop`` and shuts the exporter down (idempotent; callable from
    another thread, where it cuts short both this sink's wait and the SDK
    exporter's own retry wait). Spans of runs that are still open
    were never finished and are not sent: a later export rebuilds them from
    the store, with the same ids, when their runs go on.

Mapping happens exactly once per event. The mapper is stateful, so a page
that fails is never mapped again: its spans wait in ``pending`` and are sent
again as they are. If the caller hands the same page in again (after
:class:`ExportStopped`), the events it already mapped are recognised by their
seq and skipped, and the pending spans are sent first. One sink therefore
follows one increasing seq order; start a new sink to export from an earlier
cursor.

The SDK exporters retry a transient failure themselves within their timeout
(``OTEL_EXPORTER_OTLP_TIMEOUT``, honouring ``Retry-After``); this loop
handles the outages longer than that. It honours a ``Retry-After`` too (told
by ``complaints.retry_after()``, when they have it): it waits the longer of
its backoff and the collector's ask, at most :data:`MAX_RETRY_AFTER`, a stop
still cutting the wait short.

An exporter that writes to a local stream (the console exporter, on stdout)
has no collector to wait for: an ``OSError`` it raises (a reader that went
away, ``| head``; a full disk) is that stream's failure, and waiting would
never end. It propagates out of ``handle_page`` with the page's spans still
pending, so the caller does not save its cursor past what the stream took
(``agentrt-export`` ends quietly on a closed pipe, with exit 1 on another
write error).
"""

from __future__ import annotations

import bisect
import logging
import math
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult

from agentrt.errors import AgentrtError, described
from agentrt.events import Event
from agentrt.trace import stop_grace_seconds
from agentrt_export.follower import PartialPage
from agentrt_otel.config import ConfigError, build_resource, resource_attributes
from agentrt_otel.mapping import SpanMapper
from agentrt_otel.records import SpanStartSource
from agentrt_otel.spans import to_readable_spans
from agentrt_otel.text import DEFAULT_MAX_TEXT

__all__ = ["Backoff", "ExportStopped", "ExportStoppedPartway", "OTelSink"]

_log = logging.getLogger("agentrt_otel")

#: How long an export attempt may go on once a stop came. A collector that
#: answers does so in milliseconds; one that hangs would hold a SIGTERM for
#: the SDK's whole timeout (up to a day), past a service manager's patience.
#: (The test suite shortens it with the private AGENTRT_STOP_GRACE_S.)
STOP_GRACE = stop_grace_seconds(5.0)
#: The longest wait a collector's ``Retry-After`` is honoured for: one asking
#: for more (a day, a date next year) is retried after an hour all the same.
MAX_RETRY_AFTER = 3600.0
#: How often a running attempt looks at the stop event.
_STOP_POLL = 0.05


class Complaints(Protocol):
    """What the exporter said about an attempt that failed
    (:class:`agentrt_otel.complaints.ExporterComplaints`). One that also has
    ``retry_after()`` (seconds a throttling collector asked to wait, 0 for
    none) has that wait honoured; one with ``heard()`` (whether the exporter
    complained since ``clear()``) lets a stop during an attempt say the
    failure it was retrying after, rather than that nothing answered."""

    def clear(self) -> None:
        """Forget what was said before the next attempt."""

    def reason(self) -> str:
        """Why the attempt failed, in a few words ('' if unknown)."""

    def too_large(self) -> bool:
        """Whether the collector refused the request for its size."""


class ExportStopped(AgentrtError):
    """A stop came while the collector was refusing spans. The page was not
    delivered; the cursor must stay before it."""

    base = "otel: stopped before the collector accepted the page"
    #: What a restart sends, as the command says it.
    resent = "the page is sent again on restart"


class ExportStoppedPartway(ExportStopped):
    """:class:`ExportStopped` after the collector accepted the page's first
    batches: the cursor moves past the events whose spans all arrived."""

    resent = "the rest of the page is sent again on restart"


class OutputStoppedExport(ExportStopped):
    """:class:`ExportStopped` of a console exporter: no collector is involved;
    standard output took nothing more (its reader is not reading)."""

    base = "otel: stopped before the page was written to standard output"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Waits between attempts: ``initial * 2**n`` seconds, capped at
    ``maximum``, each multiplied by a random factor in ``1 ± jitter``.

    ``initial`` and ``maximum`` are finite seconds with ``0 < initial <=
    maximum``, and ``0 <= jitter < 1``: a wait of nothing would retry a
    collector that is down as fast as the CPU allows. Anything else raises
    :class:`~agentrt_otel.config.ConfigError`.
    """

    initial: float = 1.0
    maximum: float = 30.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        for name in ("initial", "maximum", "jitter"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise ConfigError(f"otel: backoff {name} is {described(value)}, not a finite "
                                  "number" + (" of seconds" if name != "jitter" else ""))
        if not self.initial > 0:
            raise ConfigError(f"otel: backoff initial {self.initial} must be more than 0 "
                              "seconds: without a wait, a collector that is down is retried "
                              "as fast as the CPU allows")
        if not self.maximum >= self.initial:
            raise ConfigError(f"otel: backoff maximum {self.maximum} is less than its initial "
                              f"wait {self.initial}: give a maximum of at least {self.initial}")
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"otel: backoff jitter {self.jitter} must be from 0 up to, not "
                              "including, 1 (a fraction of each wait)")

    def delay(self, attempt: int) -> float:
        base = min(self.maximum, self.initial * 2.0 ** min(attempt, 62))
        return base * random.uniform(1.0 - self.jitter, 1.0 + self.jitter)


def _has_methods(value: object, *names: str) -> bool:
    return all(callable(getattr(value, name, None)) for name in names)


def _check_sink_arguments(
    exporter: object, source: object, resource: object, stop: object, backoff: object,
    max_batch: object, max_text: object, mapper: object, complaints: object,
    local_stream: object,
) -> None:
    """Refuse what :class:`OTelSink` could not use, before anything is built: a
    wrong exporter would fail every export, which the sink takes for an outage
    and retries for ever."""
    if exporter is not None and not _has_methods(exporter, "export", "shutdown"):
        hint = (": build one from the settings with build_exporter(resolve_config(...))"
                if isinstance(exporter, str) else "")
        raise ConfigError(f"otel: exporter is {described(exporter)}, not a span exporter "
                          "(an object with export(spans) and shutdown()), nor None to map and "
                          f"discard{hint}")
    if source is not None and not _has_methods(source, "list_events_after"):
        raise ConfigError(f"otel: source is {described(source)}, not a store (an object with "
                          "list_events_after(run_id, seq, limit)), nor None")
    if resource is not None and not isinstance(resource, Resource):
        raise ConfigError(f"otel: resource is {described(resource)}, not an OpenTelemetry "
                          "Resource: build one with build_resource(resource_attributes(...)), "
                          "or pass None for the default")
    if stop is not None and not isinstance(stop, threading.Event):
        raise ConfigError(f"otel: stop is {described(stop)}, not a threading.Event, nor None")
    if backoff is not None and not isinstance(backoff, Backoff):
        raise ConfigError(f"otel: backoff is {described(backoff)}, not a Backoff, nor None")
    for name, value, unit in (("max_batch", max_batch, "spans per export"),
                              ("max_text", max_text, "bytes per text attribute")):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"otel: {name} is {described(value)}, not an int: the most "
                              f"{unit}, 1 or more")
        if value <= 0:
            raise ConfigError(f"otel: {name} {value} must be positive: the most {unit}, 1 or "
                              "more")
    if mapper is not None and not isinstance(mapper, SpanMapper):
        raise ConfigError(f"otel: mapper is {described(mapper)}, not a SpanMapper, nor None")
    if complaints is not None and not _has_methods(complaints, "clear", "reason", "too_large"):
        raise ConfigError(f"otel: complaints is {described(complaints)}, not an object with "
                          "clear(), reason() and too_large(), nor None")
    if local_stream is not None and not isinstance(local_stream, bool):
        raise ConfigError(f"otel: local_stream is {described(local_stream)}, not True, False "
                          "or None")


class OTelSink:
    """Events in, spans out over the exporter, delivery confirmed per page.

    ``exporter`` None (``OTEL_TRACES_EXPORTER=none``) maps and discards.
    ``source`` is a read-only store used to rebuild spans whose start came
    before this process did (see :class:`SpanMapper`). ``complaints`` say
    why the exporter reported FAILURE, for the line logged when an outage
    begins, and whether the request was too large (see the module doc).
    ``local_stream`` says the exporter writes to a local stream, whose
    ``OSError`` propagates instead of being waited out (default: whether it
    is the SDK's ``ConsoleSpanExporter``).

    Every argument is checked here: a wrong one raises
    :class:`~agentrt_otel.config.ConfigError` naming it, so that no export
    fails for it later (which would be retried as an outage, for ever).
    """

    def __init__(
        self,
        exporter: SpanExporter | None,
        *,
        source: SpanStartSource | None = None,
        resource: Resource | None = None,
        stop: threading.Event | None = None,
        backoff: Backoff | None = None,
        max_batch: int = 512,
        max_text: int = DEFAULT_MAX_TEXT,
        mapper: SpanMapper | None = None,
        complaints: Complaints | None = None,
        local_stream: bool | None = None,
    ) -> None:
        _check_sink_arguments(exporter, source, resource, stop, backoff, max_batch, max_text,
                              mapper, complaints, local_stream)
        self._exporter = exporter
        self._mapper = mapper if mapper is not None else SpanMapper(source, max_text=max_text)
        self._resource = resource if resource is not None else build_resource(
            resource_attributes({}))
        self._stop = stop if stop is not None else threading.Event()
        self._backoff = backoff if backoff is not None else Backoff()
        self._max_batch = max_batch
        self._complaints = complaints
        self._local_stream = (isinstance(exporter, ConsoleSpanExporter) if local_stream is None
                              else local_stream)
        self._pending: list[list[ReadableSpan]] = []
        self._mapped_seq = 0
        self._exported = 0
        self._failures = 0  # failed attempts of the current outage
        self._failures_waited_out = False  # a Retry-After wait was said in this outage
        self._outage_began = 0.0
        self._lock = threading.Lock()  # one page at a time
        self._close_lock = threading.Lock()
        self._closed = False
        self._abandoned: threading.Thread | None = None  # an attempt given up at a stop

    @property
    def mapper(self) -> SpanMapper:
        return self._mapper

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    @property
    def pending(self) -> int:
        """Spans mapped and not yet accepted by the collector."""
        return sum(len(b) for b in self._pending)

    @property
    def exported(self) -> int:
        """Spans the collector has accepted through this sink."""
        return self._exported

    def handle_page(self, events: Sequence[Event]) -> None:
        """Deliver the spans of ``events`` (in seq order); see the module doc.

        A stop after some of the page's batches were accepted (a page of more
        spans than one batch) raises :class:`PartialPage` for the events whose
        spans all arrived, so the cursor moves past them and a restart sends
        only the rest (and the accepted spans of the one event cut between
        two batches): it was the whole page again. Only for a page handed in
        the first time: one handed in again after a stop, its spans pending
        from the call before, is given up whole, as before."""
        with self._lock:
            if self._closed:
                raise AgentrtError("otel: the sink is closed")
            # Spans made by the page up to each of its events; only for a page
            # whose spans are all its own (none left pending from an earlier one).
            made: list[int] | None = [] if not self._pending else None
            try:
                self._map(events, made)
            finally:
                try:
                    self._send()
                except ExportStopped as stop:
                    accepted = self._events_accepted(made)
                    if accepted and type(stop) is ExportStopped:  # a collector's, not stdout's
                        raise PartialPage(accepted, ExportStoppedPartway(str(stop.detail))) \
                            from None
                    raise

    def _events_accepted(self, made: list[int] | None) -> int:
        """How many of the page's first events have every span accepted."""
        if not made:
            return 0
        sent = made[-1] - sum(len(batch) for batch in self._pending)
        # None accepted: the whole page is given up, as before any batch.
        return bisect.bisect_right(made, sent) if sent > 0 else 0

    def _map(self, events: Sequence[Event], made: list[int] | None = None) -> None:
        spans = []
        try:
            for event in events:
                if event.seq > self._mapped_seq:  # else mapped before: pending or sent
                    spans.extend(self._mapper.map(event))
                    self._mapped_seq = event.seq
                if made is not None:
                    made.append(len(spans))
        finally:
            if spans and self._exporter is not None:
                ready = to_readable_spans(spans, self._resource)
                for i in range(0, len(ready), self._max_batch):
                    self._pending.append(ready[i:i + self._max_batch])

    def _attempt(self, batch: list[ReadableSpan]) -> tuple[bool, str]:
        assert self._exporter is not None
        if self._abandoned is not None:
            # One attempt at a time on one exporter; and what the attempt given
            # up at a stop says as it ends belongs to it, not to the next one.
            self._abandoned.join()
            self._abandoned = None
        if self._complaints is not None:
            self._complaints.clear()
        try:
            result = self._export_unless_stopped(batch)
        except ExportStopped:
            raise
        except Exception as err:  # an exporter bug must not skip spans either
            if self._local_stream and isinstance(err, OSError):
                raise  # the stream failed, not a collector: no wait would mend it
            return False, f"{type(err).__name__}: {err}"
        if result is SpanExportResult.SUCCESS:
            return True, ""
        if result is not SpanExportResult.FAILURE:
            # Not an outage: the same exporter would answer the same for ever.
            raise ConfigError(f"otel: the exporter's export() returned {described(result)}, "
                              "not a SpanExportResult; the page was not delivered")
        why = self._complaints.reason() if self._complaints is not None else ""
        return False, why or "the exporter reported FAILURE"

    def _export_unless_stopped(self, batch: list[ReadableSpan]) -> object:
        """``export(batch)``, run on a thread of its own so that a stop is not
        held up by an attempt that hangs: given up, as :class:`ExportStopped`,
        when it goes on :data:`STOP_GRACE` past a stop. The page is then sent
        again by the next start, twice if the attempt succeeded late (at
        least once, as after a kill)."""
        assert self._exporter is not None
        exporter, done = self._exporter, threading.Event()
        outcome: list[object] = []

        def attempt() -> None:
            try:
                outcome.append(exporter.export(batch))
            except BaseException as err:  # noqa: BLE001 - raised again on the caller's thread
                outcome.append(err)
            finally:
                done.set()

        worker = threading.Thread(target=attempt, name="agentrt-otel-export", daemon=True)
        worker.start()
        while not done.wait(_STOP_POLL):
            if self._stop.is_set() and not done.wait(STOP_GRACE):
                self._abandoned = worker
                if self._local_stream:
                    raise OutputStoppedExport(
                        f"{self.pending} spans were not written whole: standard output took "
                        f"nothing more (its reader is not reading) {STOP_GRACE:g} s after "
                        "the stop")
                heard = getattr(self._complaints, "heard", None)
                if callable(heard) and heard():  # a failure the exporter was retrying after
                    why = self._complaints.reason()  # type: ignore[union-attr]
                    raise ExportStopped(
                        f"{self.pending} spans were not accepted: the exporter was still "
                        f"retrying after {why}, {STOP_GRACE:g} s after the stop")
                raise ExportStopped(f"{self.pending} spans were not accepted: the collector "
                                    f"had not answered {STOP_GRACE:g} s after the stop")
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def _split_if_too_large(self, batch: list[ReadableSpan], why: str) -> bool:
        """Cut a batch the collector refused for its size in two, in place at
        the head of ``pending``, and send smaller batches from now on."""
        if len(batch) < 2 or self._complaints is None or not self._complaints.too_large():
            return False
        half = len(batch) // 2
        self._pending[0:1] = [batch[:half], batch[half:]]
        if half < self._max_batch:
            self._max_batch = half
            _log.warning("otel: the collector refused %d spans in one request as too large "
                         "(%s); sending at most %d per request from now on",
                         len(batch), why, half)
        return True

    def _send(self) -> None:
        """Send pending batches in order until none is left. One outage logs
        one line when it begins and one when the collector recovers."""
        while self._pending:
            batch = self._pending[0]
            began = time.monotonic()  # an outage lasts from its first attempt's start
            ok, why = self._attempt(batch)
            if ok:
                self._pending.pop(0)
                self._exported += len(batch)
                if self._failures:
                    _log.warning("otel: the collector accepted spans again after %d failed "
                                 "attempt%s over %.1f s", self._failures,
                                 "s" if self._failures != 1 else "",
                                 time.monotonic() - self._outage_began)
                    self._failures = 0
                    self._failures_waited_out = False
                continue
            if self._split_if_too_large(batch, why):
                continue
            backoff, asked = self._backoff.delay(self._failures), self._retry_after()
            delay = max(backoff, asked)
            if not self._failures:
                self._outage_began = began
                _log.warning("otel: exporting %d spans failed (%s); retrying with backoff, "
                             "the cursor stays before this page", len(batch), why)
            if asked > backoff and not self._failures_waited_out:
                self._failures_waited_out = True  # said once per outage
                _log.warning("otel: the collector asked to wait %g s before the next attempt "
                             "(Retry-After); waiting", asked)
            self._failures += 1
            if self._stop.is_set() or self._closed or self._stop.wait(delay):
                attempts = f"{self._failures} attempt{'s' if self._failures != 1 else ''}"
                raise ExportStopped(f"{self.pending} spans were not accepted after {attempts}")

    def _retry_after(self) -> float:
        """The wait a throttling collector asked for (``Retry-After``), as OTLP
        says to honour it, at most :data:`MAX_RETRY_AFTER`; 0 if none."""
        asked = getattr(self._complaints, "retry_after", None)
        return min(float(asked() or 0.0), MAX_RETRY_AFTER) if callable(asked) else 0.0

    def close(self) -> None:
        """Stop and shut the exporter down; safe to call twice, from any thread."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._exporter is not None:
            self._exporter.shutdown()
