"""The event stream mapped to OpenTelemetry spans: pure, stateful, and its only
I/O is reading earlier events from its source after a restart.

:class:`SpanMapper` is fed events in seq order (as a follower delivers them)
and returns the spans each event finishes. A span is returned only when it
ends, so a run's span appears at ``run.finished`` and a step's when the step
ends. The mapping is the reference exporter's (``export/otel``, spec section
3.5): one trace per run; ``agentrt.run`` at the root, ``agentrt.step`` and
``agentrt.event`` under it, ``agentrt.model``, ``agentrt.approval`` and
``agentrt.tool.late`` under their step; every id derived from what the span
stands for (:mod:`agentrt_otel.ids`). Each of the 19 event types has its own
handler; only a type this build does not know takes the generic path.

State. Per run: the run span, the open steps (with their *interrupted*
flag), the current step, open model calls and open approvals. A run's state
is dropped as soon as nothing of it is open, so memory follows open spans
only. Besides, a bounded memory (``finished_runs``, default 4096, 1 or
more) of recently finished runs lets events that arrive after
``run.finished`` be recognised.

Restarts: rebuilt by replay. The events table is the complete, ordered
record of every run, and it is exactly what the first pass mapped (a follower
reads it through the same capped page reads). So when this mapper meets an
event of a run it holds nothing of (it started on a cursor past the run's
first events), and it has a :class:`SpanStartSource` (a read-only store), it
first maps the run's earlier events (seq below the event's) again, read a
page of ``REPLAY_PAGE`` (200) events at a time, then the event itself. The
run's spans that the replay ends are dropped: they ended before the cursor,
so the process before delivered them. Every start time, attribute and span
event is then the one a single pass produces, and a run that finished before
the cursor is known to have finished (its late tool result or model result
maps as in one pass). A ``run.created`` needs no replay (it is
a run's first event), so a pass from the start never reads the source.

Cost: each run is replayed at most once per mapper, on its first event after
the cursor: one indexed read per 200 of its earlier events, each mapped once
more, in memory of one page plus the run's open spans. A restart thus reads
again at most the earlier events of the runs that go on after the cursor
(never the whole table), and only when they go on. The one exception is a
run that has left the finished memory: each later event of it (a late
result after ``finished_runs`` other runs ended) replays it again. (So would
each event of a run whose earlier events leave nothing open; the runtime
never writes one, as every run begins with ``run.created``.)

Without a source (or when the read fails, logged once) the mapper starts the
span it missed at the event that shows it, flagged
``agentrt.span.start_unknown = true``; a step ended by a tool result starts at
the implied tool start (the event's time minus ``duration_ms``), a model call
at its result's time minus ``latency_ms``. The one limitation this leaves:
a model result for a run that has left the finished memory (``finished_runs``
other runs ended since its end) takes its call's own span id, already
exported as ``unknown`` at the run's end, since nothing tells the run is
over (with a source the replay reads its end again, and it is a late span).

Every time, an event's or one implied from a duration, is kept within what
OTLP carries on every hop (:func:`~agentrt_otel._fields.clamp_ns`): before
1970 is 1970, after 2262-04-11T23:47:16.854775807Z (the largest signed 64-bit
count of nanoseconds) is that instant. A time the exporter could not encode
would fail its page on every attempt, and a page is never skipped.

Deliberate departures from the reference (each keeps restart invariance):

1. *An event for a run this mapper saw finish* never opens a new run, step,
   model or approval span (the reference would open a run span that never
   ends, or emit a second span with an id already exported). Such an event
   becomes a zero-length ``agentrt.event`` span whose id is derived from its
   seq, as unknown event types already do. The two things the runtime does
   write after ``run.finished`` keep their meaning: a late
   ``step.tool_finished`` (its ``agentrt.tool.late`` span) and the result of
   a model call that was in flight when the run ended (below).
2. *The result of a model call in flight when its run ended* (a cancel
   during the call, or a driver that lost its lease and records the result
   all the same) does not export the call's span a second time: the run's
   end closes every open call as ``unknown``, as the reference does, so a
   call whose result never comes (its driver crashed) is exported with the
   run; a result that comes later is a late ``agentrt.model`` span of its
   own, ``span_id("model.late", call_id)`` under the step, with the result's
   status, usage and ``agentrt.model.late`` true, as a late tool result is an
   ``agentrt.tool.late`` span.
3. *A second decision on an approval whose span already ended* (a spent
   grant expiring when the run resumes, ``approved`` then ``expired``) is a
   span event ``approval.decided`` on its step instead of a second approval
   span with the same id.

With a source, restart invariance is exact: the spans of any number of
restarts equal one pass's, apart from a page exported twice after a kill.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from functools import lru_cache

from opentelemetry.trace import SpanKind, StatusCode

from agentrt.errors import described, shown_number
from agentrt.events import Event, EventType
from agentrt.trace import sanitize
from agentrt_otel._fields import (
    APPROVAL,
    APPROVAL_NOTE,
    CANCELLED,
    DECIDED,
    DECISION,
    LATE,
    LEASE,
    LIMIT,
    LOOP,
    MODEL,
    MODEL_ERROR,
    MODEL_RESULT,
    POLICY,
    RESUMED,
    RUN_END,
    STEP_FAILED,
    STEP_START,
    TOOL,
    TOOL_APPROVAL,
    TOOL_ERROR,
    TOOL_NAME,
    clamp_ns,
    decode_limits,
    event_at_ns,
)
from agentrt_otel._payload import Field, Payload
from agentrt_otel._restart import ReadFailed, earlier_events
from agentrt_otel._state import Attrs, OpenSpan, RunState, StepState
from agentrt_otel.ids import span_id, trace_id
from agentrt_otel.records import (
    SpanEventRecord,
    SpanRecord,
    SpanStartSource,
)
from agentrt_otel.semconv import add_semantic_attributes
from agentrt_otel.text import DEFAULT_MAX_TEXT, truncate

__all__ = ["DEFAULT_FINISHED_RUNS", "SpanMapper"]

_log = logging.getLogger("agentrt_otel")

#: How many finished runs the mapper remembers (see the module docstring).
DEFAULT_FINISHED_RUNS = 4096


_INTERNAL = SpanKind.INTERNAL
_CLIENT = SpanKind.CLIENT
_UNSET = StatusCode.UNSET
_NO_ATTRS: Attrs = {}

_T = "agentrt.payload.truncated"
_RUN_ID = "agentrt.run.id"
_STEP_ID = "agentrt.step.id"
_START_UNKNOWN = "agentrt.span.start_unknown"
#: Event types compared on every event, as plain strings (an enum member's
#: lookup and comparison cost several times a string's).
_RUN_CREATED = EventType.RUN_CREATED.value
_TOOL_FINISHED = EventType.STEP_TOOL_FINISHED.value
_MODEL_COMPLETED = EventType.MODEL_COMPLETED.value
_MODEL_FAILED = EventType.MODEL_FAILED.value


#: Ids longer than this are derived each time instead of cached: a cache entry
#: keeps its id alive after its run ended, and a page read hands out ids of
#: up to 64 Ki characters, so 20k entries could hold gigabytes.
_CACHED_ID_LEN = 256


@lru_cache(maxsize=4096)
def _cached_trace_id(run_id: str) -> int:
    return trace_id(run_id)


@lru_cache(maxsize=16384)
def _cached_span_id(kind: str, id: str) -> int:
    return span_id(kind, id)


def _trace_id(run_id: str) -> int:
    """Trace ids are asked for once per finished span; most runs have many."""
    return _cached_trace_id(run_id) if len(run_id) <= _CACHED_ID_LEN else trace_id(run_id)


def _span_id(kind: str, id: str) -> int:
    """A run's or step's span id is derived again for each of its children."""
    return _cached_span_id(kind, id) if len(id) <= _CACHED_ID_LEN else span_id(kind, id)


Handler = Callable[[Event, Payload, int, list[SpanRecord]], None]


class SpanMapper:
    """Events in seq order in, finished :class:`SpanRecord` objects out.

    Not thread-safe: one mapper sees one stream, as one follower delivers
    it. ``max_text`` caps text attributes (:func:`truncate`); ``source`` is
    read only to replay a run this mapper meets in the middle.
    """

    def __init__(
        self,
        source: SpanStartSource | None = None,
        *,
        max_text: int = DEFAULT_MAX_TEXT,
        finished_runs: int = DEFAULT_FINISHED_RUNS,
    ) -> None:
        for name, value, least in (("max_text", max_text, 0),
                                   ("finished_runs", finished_runs, 1)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"otel: {name} is {described(value)}, not an int: "
                                f"{least} or more")
        if max_text < 0:
            raise ValueError(f"otel: max_text {shown_number(max_text)} is negative")
        if finished_runs < 1:
            # A run forgotten at its end: its call's late result would take the
            # call's own span id, exported already as unknown (docstring, 2).
            raise ValueError(f"otel: finished_runs {shown_number(finished_runs)} must be 1 or "
                             "more: a run "
                             "must be remembered past its end for a late model result to be "
                             "told from its call")
        self._max_text = max_text
        self._source = source
        self._replaying = False
        self._read_failed = False
        self._runs: dict[str, RunState] = {}
        # Finished runs, oldest first, with the model calls their end closed as
        # ``unknown`` (a result that still comes is a late span, docstring 2).
        self._finished: OrderedDict[str, set[str]] = OrderedDict()
        self._finished_cap = finished_runs
        # Keyed by the types' plain strings, which an event's type is.
        self._handlers: dict[str, Handler] = {k.value: v for k, v in {
            EventType.RUN_CREATED: self._run_created,
            EventType.RUN_STARTED: self._run_started,
            EventType.RUN_RESUMED: self._run_resumed,
            EventType.LEASE_TAKEN_OVER: self._lease_taken_over,
            EventType.LIMIT_EXCEEDED: self._limit_exceeded,
            EventType.LOOP_DETECTED: self._loop_detected,
            EventType.STEP_STARTED: self._step_started,
            EventType.STEP_DECIDED: self._step_decided,
            EventType.STEP_POLICY: self._step_policy,
            EventType.STEP_TOOL_STARTED: self._tool_started,
            EventType.STEP_TOOL_FINISHED: self._tool_finished,
            EventType.STEP_FAILED: self._step_failed,
            EventType.STEP_INTERRUPTED: self._step_interrupted,
            EventType.APPROVAL_REQUESTED: self._approval_requested,
            EventType.APPROVAL_DECIDED: self._approval_decided,
            EventType.MODEL_DISPATCHED: self._model_dispatched,
            EventType.MODEL_COMPLETED: self._model_result,
            EventType.MODEL_FAILED: self._model_result,
            EventType.RUN_FINISHED: self._run_finished,
        }.items()}

    # -- public -------------------------------------------------------------

    @property
    def handled_types(self) -> frozenset[str]:
        """The event types with a specific mapping (all the runtime writes)."""
        return frozenset(self._handlers)

    @property
    def open_runs(self) -> int:
        """Runs with at least one open span."""
        return len(self._runs)

    @property
    def remembered_runs(self) -> int:
        """Finished runs remembered (at most ``finished_runs``)."""
        return len(self._finished)

    @property
    def open_spans(self) -> int:
        """Spans started and not yet ended."""
        return sum(
            (st.run is not None) + len(st.steps) + len(st.models) + len(st.approvals)
            for st in self._runs.values()
        )

    def map(self, event: Event) -> list[SpanRecord]:
        """The spans ``event`` finishes, in the order they ended."""
        out: list[SpanRecord] = []
        run_id = event.run_id
        runs = self._runs
        if (run_id not in runs and self._source is not None and not self._replaying
                and run_id not in self._finished and event.type != _RUN_CREATED):
            self._replay(event)
        payload = Payload.parse(event.payload)
        at = event_at_ns(event)
        closed = self._finished.get(run_id)  # None while the run is not known to be over
        if closed is not None and not self._after_end(event, payload, closed):
            self._event_span(event, payload, at, out)
        else:
            handler = self._handlers.get(event.type)
            if handler is not None:
                handler(event, payload, at, out)
            else:
                self._unknown(event, payload, at, out)
        st = runs.get(run_id)
        if st is not None and st.empty():
            del runs[run_id]
        return out

    def map_all(self, events: Iterable[Event]) -> list[SpanRecord]:
        """:meth:`map` over several events, spans concatenated."""
        out: list[SpanRecord] = []
        for event in events:
            out.extend(self.map(event))
        return out

    def _replay(self, event: Event) -> None:
        """Rebuild the state of a run met in the middle by mapping its earlier
        events again, as one pass did (module docstring, "Restarts").

        The spans the replay ends are the run's own (mapping an event of
        one run ends nothing of another), and ended before ``event``, so the
        process that mapped them first delivered them: they are dropped."""
        assert self._source is not None
        run_id = event.run_id
        if not run_id:
            return
        self._replaying = True
        try:
            for earlier in earlier_events(self._source, run_id, event.seq):
                self.map(earlier)
        except ReadFailed as err:  # as without a source: a half-rebuilt run helps no one
            self._runs.pop(run_id, None)
            self._finished.pop(run_id, None)
            if not self._read_failed:  # once: a flaky store must not flood the log
                self._read_failed = True
                _log.warning("otel: reading the earlier events of run %s from the store failed "
                             "(%s); spans it started before are marked start_unknown",
                             sanitize(run_id), sanitize(str(err)))
        finally:
            self._replaying = False

    # -- helpers ------------------------------------------------------------

    def _state(self, run_id: str) -> RunState:
        st = self._runs.get(run_id)
        if st is None:
            st = self._runs[run_id] = RunState(run_id)
        return st

    def _text(self, attrs: Attrs, key: str, p: Payload, field: str) -> None:
        value = p.string(field)
        if value:
            attrs[key] = truncate(value, self._max_text)

    def _set(self, attrs: Attrs, p: Payload, fields: tuple[Field, ...]) -> Attrs:
        p.apply(attrs, fields, self._max_text)
        return attrs

    @staticmethod
    def _truncated(attrs: Attrs, p: Payload) -> Attrs:
        length = p.truncated_length()
        if length is not None:
            attrs[_T] = length
        return attrs

    def _finish(self, span: OpenSpan, end_ns: int, out: list[SpanRecord]) -> None:
        attrs = span.attrs
        add_semantic_attributes(span.name, attrs, span.run_id)
        out.append(SpanRecord(
            span.name, _trace_id(span.run_id), span.span_id, span.parent_id, span.kind,
            span.start_ns, end_ns, attrs, tuple(span.events), span.status_code,
            span.status_description,
        ))

    @staticmethod
    def _after_end(event: Event, p: Payload, closed: set[str]) -> bool:
        """Events the runtime itself writes after ``run.finished``: a late tool
        result, and the result of a model call the run's end closed as
        ``unknown`` (a cancel during the call, or a driver that lost its lease
        and records its result all the same)."""
        t = event.type
        if t == _TOOL_FINISHED:
            return p.is_true("late")
        if t in (_MODEL_COMPLETED, _MODEL_FAILED):
            return p.string("call_id") in closed
        return False

    def _remember_finished(self, run_id: str, closed: set[str]) -> None:
        self._finished[run_id] = closed
        self._finished.move_to_end(run_id)
        while len(self._finished) > self._finished_cap:
            self._finished.popitem(last=False)

    # -- ensure run / step --------------------------------------------------

    def _ensure_run(self, st: RunState, at: int) -> OpenSpan:
        if st.run is not None:
            return st.run
        attrs: Attrs = {_RUN_ID: st.run_id, _START_UNKNOWN: True}
        st.run = OpenSpan("agentrt.run", st.run_id, _span_id("run", st.run_id), None, _INTERNAL,
                          at, attrs)
        return st.run

    def _new_step(self, st: RunState, step_id: str, start: int, attrs: Attrs) -> StepState:
        span = OpenSpan("agentrt.step", st.run_id, _span_id("step", step_id),
                        _span_id("run", st.run_id), _INTERNAL, start, attrs)
        step = st.steps[step_id] = StepState(span)
        return step

    def _ensure_step(self, st: RunState, step_id: str, at: int,
                     implied: int | None = None) -> StepState:
        step = st.steps.get(step_id)
        if step is not None:
            return step
        attrs: Attrs = {_RUN_ID: st.run_id, _STEP_ID: step_id}
        start = implied
        if start is None:
            start = at
            attrs[_START_UNKNOWN] = True
        if not st.current:
            st.current = step_id
        return self._new_step(st, step_id, start, attrs)

    def _end_step(self, st: RunState, step_id: str, at: int, end: str, status: str,
                  out: list[SpanRecord]) -> None:
        step = st.steps.pop(step_id)
        attrs = step.span.attrs
        attrs["agentrt.step.end"] = end
        if status:
            attrs["agentrt.step.status"] = status
        self._finish(step.span, at, out)

    # -- run-level events ---------------------------------------------------

    def _run_created(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        st = self._state(e.run_id)
        if st.run is not None:
            return
        attrs = self._truncated({}, p)
        attrs[_RUN_ID] = e.run_id
        self._text(attrs, "agentrt.run.goal", p, "goal")
        decode_limits(attrs, p)
        st.run = OpenSpan("agentrt.run", e.run_id, _span_id("run", e.run_id), None, _INTERNAL, at,
                          attrs)

    def _run_event(self, e: Event, p: Payload, at: int, attrs: Attrs) -> None:
        run = self._ensure_run(self._state(e.run_id), at)
        run.events.append(SpanEventRecord(e.type, at, attrs))

    def _run_started(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        self._run_event(e, p, at, _NO_ATTRS)

    def _run_resumed(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        self._run_event(e, p, at, self._set(self._truncated({}, p), p, RESUMED))

    def _lease_taken_over(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        self._run_event(e, p, at, self._set(self._truncated({}, p), p, LEASE))

    def _limit_exceeded(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        self._run_event(e, p, at, self._set(self._truncated({}, p), p, LIMIT))

    def _loop_detected(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        self._run_event(e, p, at, self._set(self._truncated({}, p), p, LOOP))

    def _run_finished(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        st = self._state(e.run_id)
        run = self._ensure_run(st, at)
        status = p.string("status")
        for span, _ in st.approvals.values():
            span.attrs["agentrt.approval.status"] = "pending"
            self._finish(span, at, out)
        st.approvals.clear()
        for span in st.models.values():  # a result that comes later is late (docstring, 2)
            span.attrs["agentrt.model.status"] = "unknown"
            self._finish(span, at, out)
        closed = set(st.models)
        st.models.clear()
        for step_id in list(st.steps):
            interrupted = st.steps[step_id].interrupted
            self._end_step(st, step_id, at, "run.finished", "interrupted" if interrupted else "",
                           out)
        attrs = self._truncated(run.attrs, p)
        attrs["agentrt.run.status"] = status
        self._set(attrs, p, RUN_END)
        if status == "COMPLETED":
            run.status_code = StatusCode.OK
        elif status == "FAILED":
            run.status_code = StatusCode.ERROR
            run.status_description = p.string("reason")
        elif status == "CANCELLED":
            cancelled = self._set({}, p, CANCELLED)
            run.events.append(SpanEventRecord("run.cancelled", at, cancelled))
        self._finish(run, at, out)
        st.run = None
        st.current = ""
        st.steps.clear()
        del self._runs[e.run_id]
        self._remember_finished(e.run_id, closed)

    # -- step events --------------------------------------------------------

    def _step_started(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        st = self._state(e.run_id)
        if st.current and st.current != e.step_id and st.current in st.steps:
            interrupted = st.steps[st.current].interrupted
            self._end_step(st, st.current, at, "step.started",
                           "interrupted" if interrupted else "", out)
        st.current = e.step_id
        if e.step_id in st.steps:
            return
        attrs = self._truncated({}, p)
        attrs[_RUN_ID] = e.run_id
        attrs[_STEP_ID] = e.step_id
        self._set(attrs, p, STEP_START)
        self._new_step(st, e.step_id, at, attrs)

    def _step_decided(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        span = self._ensure_step(self._state(e.run_id), e.step_id, at).span
        self._set(self._truncated(span.attrs, p), p, DECISION)
        span.events.append(SpanEventRecord(e.type, at, _NO_ATTRS))

    def _step_policy(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        span = self._ensure_step(self._state(e.run_id), e.step_id, at).span
        self._set(self._truncated(span.attrs, p), p, POLICY)
        span.events.append(SpanEventRecord(e.type, at, _NO_ATTRS))

    def _tool_started(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        span = self._ensure_step(self._state(e.run_id), e.step_id, at).span
        self._set(self._truncated(span.attrs, p), p, TOOL_NAME)
        span.events.append(SpanEventRecord(e.type, at, self._set({}, p, TOOL_APPROVAL)))

    def _tool_finished(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        duration = p.integer("duration_ms")
        implied = clamp_ns(at - duration * 1_000_000) if duration is not None else None
        if p.is_true("late"):
            self._late_tool(e, p, at, implied, out)
            return
        st = self._state(e.run_id)
        # A negative duration (a damaged row) must not start the step after it ends.
        start = None if implied is None else min(implied, at)
        span = self._ensure_step(st, e.step_id, at, start).span
        attrs = self._set(self._truncated(span.attrs, p), p, TOOL)
        if p.has("error"):
            self._set(attrs, p, TOOL_ERROR)
            return  # step.failed follows in the same transaction and ends the step
        self._end_step(st, e.step_id, at, "step.tool_finished", "done", out)

    def _late_tool(self, e: Event, p: Payload, at: int, implied: int | None,
                   out: list[SpanRecord]) -> None:
        """A cancelled run's tool outcome: its own span, touching nothing open."""
        attrs = self._set(self._truncated({}, p), p, TOOL)
        attrs[_RUN_ID] = e.run_id
        attrs[_STEP_ID] = e.step_id
        self._set(attrs, p, LATE)
        start = at if implied is None else min(implied, at)
        span = OpenSpan("agentrt.tool.late", e.run_id, _span_id("late", e.step_id),
                        _span_id("step", e.step_id), _INTERNAL, start, attrs)
        self._finish(span, at, out)

    def _step_failed(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        st = self._state(e.run_id)
        span = self._ensure_step(st, e.step_id, at).span
        self._set(self._truncated(span.attrs, p), p, STEP_FAILED)
        span.status_code = StatusCode.ERROR
        span.status_description = p.string("observation")
        self._end_step(st, e.step_id, at, "step.failed", "failed", out)

    def _step_interrupted(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        step = self._ensure_step(self._state(e.run_id), e.step_id, at)
        step.interrupted = True
        attrs = self._truncated({}, p)
        nested = p.member("previous_status")
        if nested is not None and nested.has("previous_status"):
            attrs["agentrt.step.previous_status"] = nested.string("previous_status")
        else:
            attrs["agentrt.step.previous_status"] = p.string("previous_status")
        step.span.events.append(SpanEventRecord(e.type, at, attrs))

    # -- approvals ----------------------------------------------------------

    def _approval_requested(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        st = self._state(e.run_id)
        step = self._ensure_step(st, e.step_id, at).span
        approval_id = p.string("approval_id")
        note = self._set({"agentrt.approval.id": approval_id}, p, APPROVAL_NOTE)
        step.events.append(SpanEventRecord(e.type, at, note))
        if approval_id in st.approvals:
            return
        attrs = self._truncated({}, p)
        attrs[_RUN_ID] = e.run_id
        attrs[_STEP_ID] = e.step_id
        self._set(attrs, p, APPROVAL)
        span = OpenSpan("agentrt.approval", e.run_id, _span_id("approval", approval_id),
                        _span_id("step", e.step_id), _INTERNAL, at, attrs)
        st.approvals[approval_id] = (span, e.step_id)

    def _approval_decided(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        st = self._state(e.run_id)
        approval_id = p.string("approval_id")
        entry = st.approvals.pop(approval_id, None)
        if entry is not None:
            span = entry[0]
        else:
            if approval_id in st.ended_approvals:  # a spent grant expiring: docstring, 3
                step = self._ensure_step(st, e.step_id, at).span
                attrs = self._truncated({"agentrt.approval.id": approval_id}, p)
                self._decision_attrs(attrs, p)
                step.events.append(SpanEventRecord(e.type, at, attrs))
                return
            attrs = {_RUN_ID: e.run_id, _STEP_ID: e.step_id}
            if approval_id:
                attrs["agentrt.approval.id"] = approval_id
            attrs[_START_UNKNOWN] = True
            span = OpenSpan("agentrt.approval", e.run_id, _span_id("approval", approval_id),
                            _span_id("step", e.step_id), _INTERNAL, at, attrs)
        self._decision_attrs(self._truncated(span.attrs, p), p)
        st.ended_approvals.add(approval_id)
        self._finish(span, at, out)

    def _decision_attrs(self, attrs: Attrs, p: Payload) -> None:
        self._set(attrs, p, DECIDED)

    # -- model calls --------------------------------------------------------

    def _model_attrs(self, attrs: Attrs, e: Event, p: Payload) -> Attrs:
        attrs[_RUN_ID] = e.run_id
        attrs[_STEP_ID] = e.step_id
        return self._set(attrs, p, MODEL)

    def _model_dispatched(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        st = self._state(e.run_id)
        call_id = p.string("call_id")
        if call_id in st.models:
            return
        attrs = self._model_attrs(self._truncated({}, p), e, p)
        st.models[call_id] = OpenSpan("agentrt.model", e.run_id, _span_id("model", call_id),
                                      _span_id("step", e.step_id), _CLIENT, at, attrs)

    def _model_result(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        call_id = p.string("call_id")
        st = self._runs.get(e.run_id)
        span = st.models.pop(call_id, None) if st is not None else None
        if span is None:
            # A call whose dispatch this mapper did not see, or, after the run's
            # end closed it as unknown, its late result: a span of its own.
            late = e.run_id in self._finished
            latency = p.integer("latency_ms")
            start = at if latency is None else clamp_ns(min(at - latency * 1_000_000, at))
            attrs = self._model_attrs({}, e, p)
            if late:
                attrs["agentrt.model.late"] = True
            span = OpenSpan("agentrt.model", e.run_id,
                            _span_id("model.late" if late else "model", call_id),
                            _span_id("step", e.step_id), _CLIENT, start, attrs)
        attrs = self._truncated(span.attrs, p)
        status = p.string("status")
        self._set(attrs, p, MODEL_RESULT[:1])
        usage = p.member("usage") or Payload(None, {}, None)
        for key in ("input_tokens", "output_tokens", "cached_input_tokens"):
            value = usage.strict_int(key)
            attrs["agentrt.model." + key] = value if isinstance(value, int) else 0
        self._set(attrs, p, MODEL_RESULT[1:])
        if e.type == _MODEL_FAILED:
            self._set(attrs, p, MODEL_ERROR)
            span.status_code = StatusCode.ERROR
            span.status_description = status
        self._finish(span, at, out)

    # -- anything else ------------------------------------------------------

    def _unknown(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        """A type this build does not know: an event on the open run span, or
        a zero-length span of its own (a finished run is never reopened)."""
        st = self._runs.get(e.run_id)
        if st is not None and st.run is not None:
            st.run.events.append(SpanEventRecord(e.type, at, self._truncated({}, p)))
            return
        self._event_span(e, p, at, out)

    def _event_span(self, e: Event, p: Payload, at: int, out: list[SpanRecord]) -> None:
        attrs = self._truncated({}, p)
        attrs[_RUN_ID] = e.run_id
        attrs["agentrt.event.type"] = e.type
        attrs["agentrt.event.seq"] = e.seq
        if e.step_id:
            attrs[_STEP_ID] = e.step_id
        span = OpenSpan("agentrt.event", e.run_id, _span_id("event", str(e.seq)),
                        _span_id("run", e.run_id), _INTERNAL, at, attrs)
        self._finish(span, at, out)
