"""Hostile event streams: the exporter's mapping, encoding and JSON Lines never fail.

The exporter reads an ``events`` table it does not control (a database another
program wrote, or a damaged one). A row that made the mapping or the OTLP
encoding raise would fail its page on every attempt, and the exporter would
stop shipping for good; a JSON Lines record that is not one line of JSON
breaks every log tool downstream. So these properties feed generated streams
of anything a row can hold:

* types: the 19 the runtime writes and unknown ones;
* payloads: objects whose known keys (``agentrt_otel/_fields.py`` and
  ``mapping.py``) hold wrong types (strings for numbers, objects, lists,
  null, booleans, floats, integers past 2**64, negative numbers, NaN-like
  text), JSON that is not an object, invalid JSON, invalid UTF-8, empty
  bytes, long strings, deep nesting, the capped-payload object;
* times: valid ones, the year 1 and 9999, unparseable text, times that go
  backwards;
* orders: steps without ``run.created``, events after ``run.finished``, step
  ids shared by runs, results without their dispatch, decisions on unknown
  approvals, many runs interleaved;
* ids: empty, long, non-ASCII (no lone surrogates: a store reads invalid
  UTF-8 as U+FFFD, so it cannot hand one out).

and check that the mapper (in one pass, one event at a time, and restarted in
pages over a source, an in-memory one and a real store) never raises, that
what it returns becomes SDK spans that the OTLP encoder serialises without
raising or dropping an attribute, and that every JSON Lines record is one
line of JSON with the record's keys.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import hypothesis.strategies as st
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from stress import rounds

from agentrt.events import ALL_EVENT_TYPES, Event, EventType
from agentrt.store import open_store
from agentrt.trace import jsonl_record
from agentrt_otel import SpanMapper, SpanRecord
from agentrt_otel import _fields as fields
from agentrt_otel._fields import MAX_TIME_NS
from agentrt_otel.config import build_resource, resource_attributes
from agentrt_otel.spans import to_readable_spans
from agentrt_otel.testing import SCENARIOS, EventStream, StreamSource

#: `make stress` runs these with many more examples (see FUZZ).
pytestmark = pytest.mark.slow

RESOURCE = build_resource(resource_attributes({}))
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: CI runs a bounded number of examples; `make stress` (AGENTRT_STRESS=1) many more.
FUZZ = settings(
    max_examples=rounds(80, 2000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- what the encoder says when it drops an attribute -------------------------------
# ``_encode_attributes`` catches a value it cannot encode (an int past int64, a
# string that is not UTF-8), logs it and drops the attribute: no exception, but
# the span arrives without it. Listened for here, as a silent failure.


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_ENCODER_ERRORS = _Errors()
logging.getLogger("opentelemetry.exporter.otlp.proto.common").addHandler(_ENCODER_ERRORS)


# -- the keys each type reads ---------------------------------------------------------

def _keys(*tables: tuple[tuple[str, str, int], ...]) -> tuple[str, ...]:
    return tuple(f for table in tables for f, _, _ in table)


_COMMON = ("truncated", "length", "head")
TYPE_KEYS: dict[str, tuple[str, ...]] = {
    EventType.RUN_CREATED: ("goal", "limits"),
    EventType.RUN_STARTED: (),
    EventType.RUN_RESUMED: _keys(fields.RESUMED),
    EventType.LEASE_TAKEN_OVER: _keys(fields.LEASE),
    EventType.LIMIT_EXCEEDED: _keys(fields.LIMIT),
    EventType.LOOP_DETECTED: _keys(fields.LOOP),
    EventType.RUN_FINISHED: ("status", *_keys(fields.RUN_END, fields.CANCELLED)),
    EventType.STEP_STARTED: _keys(fields.STEP_START),
    EventType.STEP_DECIDED: _keys(fields.DECISION),
    EventType.STEP_POLICY: _keys(fields.POLICY),
    EventType.STEP_TOOL_STARTED: _keys(fields.TOOL_NAME, fields.TOOL_APPROVAL),
    EventType.STEP_TOOL_FINISHED: ("late", *_keys(fields.TOOL, fields.TOOL_ERROR, fields.LATE)),
    EventType.STEP_FAILED: _keys(fields.STEP_FAILED),
    EventType.STEP_INTERRUPTED: ("previous_status",),
    EventType.APPROVAL_REQUESTED: _keys(fields.APPROVAL, fields.APPROVAL_NOTE),
    EventType.APPROVAL_DECIDED: ("approval_id", *_keys(fields.DECIDED)),
    EventType.MODEL_DISPATCHED: _keys(fields.MODEL),
    EventType.MODEL_COMPLETED: ("usage", *_keys(fields.MODEL, fields.MODEL_RESULT)),
    EventType.MODEL_FAILED: ("usage", *_keys(fields.MODEL, fields.MODEL_RESULT,
                                             fields.MODEL_ERROR)),
}
assert set(TYPE_KEYS) == set(ALL_EVENT_TYPES)
ALL_KEYS = tuple(sorted({k for keys in TYPE_KEYS.values() for k in keys} | set(_COMMON)))
NESTED_KEYS = {
    "limits": fields._LIMIT_INTS,
    "usage": ("input_tokens", "output_tokens", "cached_input_tokens"),
    "previous_status": ("previous_status",),
}


# -- JSON text, written by hand so it can hold what json.dumps would not --------------

class Raw(NamedTuple):
    """Text written as it is: number literals past a double or int64, NaN, deep nesting."""

    text: str


class Obj(NamedTuple):
    """An object as its members in order (duplicate keys allowed)."""

    pairs: tuple[tuple[str, Any], ...]


class Style(NamedTuple):
    ascii: bool
    comma: str
    colon: str


def render(node: Any, style: Style) -> str:
    if isinstance(node, Raw):
        return node.text
    if isinstance(node, Obj):
        members = (json.dumps(k, ensure_ascii=style.ascii) + style.colon + render(v, style)
                   for k, v in node.pairs)
        return "{" + style.comma.join(members) + "}"
    if isinstance(node, list):
        return "[" + style.comma.join(render(v, style) for v in node) + "]"
    return json.dumps(node, ensure_ascii=style.ascii)


styles = st.builds(Style, st.booleans(),
                   st.sampled_from([",", ", ", " ,\n", ",\t"]),
                   st.sampled_from([":", ": ", " :\r\n"]))


def to_bytes(text: str) -> bytes:
    # Lone surrogates written raw (ascii=False) become CESU bytes: invalid UTF-8.
    return text.encode("utf-8", "surrogatepass")


no_surrogates = st.characters(blacklist_categories=("Cs",))
EXTREME_INTS = [0, -1, 1, INT64_MAX, INT64_MAX + 1, INT64_MIN, INT64_MIN - 1, 2**64 - 1, 2**64,
                2**64 + 1, 10**30, -(10**30), 9_223_372_036_854, -9_223_372_036_854_775]
NUMBER_LITERALS = ["1e400", "-1e400", "1E5", "1.0", "-0", "-0.0", "0.1e-400", "1e-7", "5e18",
                   "123456789012345678901234567890", "18446744073709551616",
                   "-9223372036854775809", "9223372036854775808", "1.5e308", "2.0e0"]
NOT_JSON_LITERALS = ["NaN", "Infinity", "-Infinity", "01", "+1", ".5", "1.", "0x10", "True",
                     "None", "undefined", "'s'", "tru", "nul"]
NAN_LIKE = ["NaN", "nan", "inf", "-inf", "Infinity", "1e3", "5", "-5", " 7", "0x1F", "", "null",
            "true", "false", "1.0", "९", "٣", "COMPLETED ", "completed"]
STATUSES = ["COMPLETED", "FAILED", "CANCELLED", "RUNNING", "PAUSED", "ok", "error", ""]


def _deep(depth: int) -> st.SearchStrategy[Raw]:
    return st.sampled_from([
        Raw("[" * depth + "]" * depth),
        Raw('{"a":' * depth + "1" + "}" * depth),
        Raw('{"previous_status":' * depth + '"x"' + "}" * depth),
        Raw("[" * depth),  # unbalanced: invalid
    ])


long_strings = st.builds(lambda c, n: c * n,
                         st.sampled_from(["x", "é", "😀", "a\u0301", "\u202e", "\x00", "\n"]),
                         st.sampled_from([255, 1023, 1024, 1025, 4096, 70_000]))

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(EXTREME_INTS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(NUMBER_LITERALS).map(Raw),
    st.text(no_surrogates, max_size=20),
    st.text(no_surrogates, max_size=20),
    # lone surrogates, escaped: JSON, which orjson refuses (raw, they are bad UTF-8: below)
    st.sampled_from(['"\\ud800"', '"a\\udfffb"', '"\\udbff\\udc00x\\ud800"']).map(Raw),
    st.sampled_from(NAN_LIKE),
    long_strings,
)

rare = st.one_of(
    st.sampled_from(NOT_JSON_LITERALS).map(Raw),
    st.sampled_from([64, 255, 256, 257, 1023, 1024, 1025, 3000]).flatmap(_deep),
)


def _object_of(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Obj]:
    keys = st.sampled_from(ALL_KEYS) | st.text(no_surrogates, max_size=6)
    return st.lists(st.tuples(keys, values), max_size=4).map(lambda ps: Obj(tuple(ps)))


values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | _object_of(inner),
                      max_leaves=5)
not_objects = scalars | st.lists(values, max_size=3)
hostile = values

id_pool = st.sampled_from(["a1", "a2", "c1", "c2", "", "\u00e9", "a1 "])


def _nested(key: str) -> st.SearchStrategy[Obj]:
    inner = st.sampled_from(NESTED_KEYS[key])
    return st.lists(st.tuples(inner, hostile | st.integers(-(2**40), 2**40)), max_size=12
                    ).map(lambda ps: Obj(tuple(ps)))


PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "status": st.sampled_from(STATUSES),
    "late": st.just(True),
    "truncated": st.just(True),
    "length": st.sampled_from(EXTREME_INTS) | st.integers(),
    "approval_id": id_pool,
    "call_id": id_pool,
    "error": st.text(no_surrogates, max_size=10),
    "duration_ms": st.sampled_from(EXTREME_INTS) | st.integers(-(2**62), 2**62),
    "latency_ms": st.sampled_from(EXTREME_INTS) | st.integers(-(2**62), 2**62),
    **{key: _nested(key) for key in NESTED_KEYS},
}


@st.composite
def object_payloads(draw: st.DrawFn, type_: str) -> Obj:
    own = st.sampled_from(TYPE_KEYS.get(type_) or ALL_KEYS)
    keys = st.one_of(own, own, own, st.sampled_from(_COMMON), st.sampled_from(ALL_KEYS),
                     st.text(no_surrogates, max_size=6))
    pairs = []
    for _ in range(draw(st.integers(1, 6))):
        key = draw(keys)
        plausible = PLAUSIBLE.get(key)
        value = draw(plausible | hostile if plausible is not None else hostile)
        pairs.append((key, value))
    return Obj(tuple(pairs))


@st.composite
def with_rare_value(draw: st.DrawFn, type_: str) -> Obj:
    """An object of the type's keys with one value that is invalid or deep."""
    obj = draw(object_payloads(type_))
    key = draw(st.sampled_from(TYPE_KEYS.get(type_) or ALL_KEYS))
    pairs = list(obj.pairs)
    pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(rare)))
    return Obj(tuple(pairs))


@st.composite
def rendered(draw: st.DrawFn, nodes: st.SearchStrategy[Any]) -> bytes:
    return to_bytes(render(draw(nodes), draw(styles)))


@st.composite
def cut(draw: st.DrawFn, data: st.SearchStrategy[bytes]) -> bytes:
    """Valid JSON cut short (a row written half)."""
    whole = draw(data)
    return whole[: draw(st.integers(0, max(len(whole) - 1, 0)))]


@st.composite
def bad_utf8_member(draw: st.DrawFn, type_: str) -> bytes:
    key = draw(st.sampled_from(TYPE_KEYS.get(type_) or ALL_KEYS))
    junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe2\x80", b"\x80abc"]))
    where = draw(st.sampled_from(["string", "key", "outside"]))
    if where == "string":
        return b'{"%s":"x%sy"}' % (key.encode(), junk)
    if where == "key":
        return b'{"%s%s":1,"%s":"v"}' % (key.encode(), junk, key.encode())
    return b'{"%s":1}%s' % (key.encode(), junk)


def truncation_objects() -> st.SearchStrategy[bytes]:
    """The object a capped page read puts in place of a payload that is too long."""
    length = st.sampled_from(EXTREME_INTS) | st.integers() | hostile
    head = st.text(no_surrogates, max_size=30) | long_strings | hostile
    return st.builds(
        lambda n, h, extra, style: to_bytes(render(
            Obj((("truncated", True), ("length", n), ("head", h), *extra)), style)),
        length, head, st.lists(st.tuples(st.sampled_from(ALL_KEYS), hostile), max_size=2),
        styles)


def payloads(type_: str) -> st.SearchStrategy[bytes]:
    objects = rendered(object_payloads(type_))
    return st.one_of(
        *[objects] * 30,
        rendered(not_objects),  # JSON, not an object
        rendered(rare),
        rendered(with_rare_value(type_)),
        rendered(with_rare_value(type_)),
        truncation_objects(),
        bad_utf8_member(type_),
        cut(objects),
        st.binary(max_size=40),
        st.sampled_from([b"", b" ", b"\n\t ", b"\x0b", b"{}", b"[]", b"null", b"{} {}",
                         b"\xef\xbb\xbf{}", b"{\"a\":1}\x00", b'{"a":NaN}', b'{"a":1,}',
                         b'{"late":true,"late":false}', b'{"\\ud800":"\\udfff"}',
                         b'{"approval_id":"\\ud800"}', b'"\\ud800"', b"1e400",
                         b'{"goal":"x\ny"}', b'{"goal":"x\x00y"}', b'{"goal":"\xe2\x80\xa8"}',
                         b'{"goal":"\\"}', b'{"reason":"a\\\\"}\n', b'{"a":1}\n{"b":2}',
                         "{}".encode("utf-16")]),
    )


# -- times ------------------------------------------------------------------------------

def _stored(t: Any) -> str:
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
            + (f".{t.microsecond:06d}".rstrip("0") if t.microsecond else "") + "Z")


ODD_TIMES = [
    "", "not a time", "0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000001Z",
    "9999-12-31T23:59:59Z", "9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999999Z",
    "0001-01-01T00:30:00+01:00", "9999-12-31T23:30:00-01:00", "0000-01-01T00:00:00Z",
    "1969-12-31T23:59:59.999999Z", "1970-01-01T00:00:00Z", "2262-04-11T23:47:16.854775807Z",
    "2262-04-11T23:47:16.854775808Z", "2262-04-12T00:00:00Z", "2026-02-30T00:00:00Z",
    "2026-09-25T24:00:00Z", "2026-09-25T23:59:60Z", "2026-09-25 14:03:04Z",
    "2026-09-25t14:03:04.5z", "2026-09-25T14:03:04.5+14:00", "2026-09-25T14:03:04.5+99:99",
    "2026-09-25T14:03:04.Z", "2026-09-25T14:03:04.0000000000Z", "2026-09-25T14:03:04Z\n",
    "２０２６-09-25T14:03:04Z", "12", "-1", "2026-09-25", "T", "Z",
]
at_texts = st.one_of(
    st.datetimes().map(_stored),  # year 1 to 9999
    st.sampled_from(ODD_TIMES),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=32),
    st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                  r"(\.[0-9]{0,10})?([Zz]|[+-][0-9]{2}:[0-9]{2})?\Z"),
)

# -- ids and types ------------------------------------------------------------------------

ids = st.one_of(
    st.sampled_from(["r1", "r2", "s1", "s2", "", "run-\u00e9\u4e00", "\ufffd", "a" * 5000,
                     "\u00e9" * 3000, "x" * 70_000, "id with spaces\nand\tcontrols\x00",
                     "\u202eevil", "😀"]),
    st.text(no_surrogates, max_size=24),
)
unknown_types = st.one_of(
    st.sampled_from(["", "run.Created", "run.created ", "RUN.CREATED", "step", "step.",
                     "model.completed\x00", "x" * 300, "ünknown.type", "\ufffd", "run"]),
    st.text(no_surrogates, max_size=24),
)
types = st.one_of(*[st.sampled_from(ALL_EVENT_TYPES)] * 6, unknown_types)


@st.composite
def streams(draw: st.DrawFn, max_events: int = 30) -> list[Event]:
    """Events of a few runs interleaved, in strictly increasing seq order (the
    table's), with everything else free: no order between types, ids shared
    across runs, times in any order."""
    runs = draw(st.lists(ids, min_size=1, max_size=4))
    steps = draw(st.lists(ids, min_size=1, max_size=4))
    seq = draw(st.integers(1, 5) | st.sampled_from([-7, 0, INT64_MAX - 200]))
    out: list[Event] = []
    for _ in range(draw(st.integers(0, max_events))):
        type_ = draw(types)
        step = draw(st.sampled_from(steps) | st.just(""))
        out.append(Event(seq, draw(st.sampled_from(runs)), step, draw(at_texts), type_,
                         draw(payloads(type_))))
        seq += draw(st.integers(1, 3))
    return out


def _scenario_streams() -> list[list[Event]]:
    out = []
    for scenario in SCENARIOS:
        stream = EventStream(scenario.__name__)
        scenario(stream)
        out.append(_as_read(stream.events))
    everything = EventStream()
    for i, scenario in enumerate(SCENARIOS):
        everything.use("shared" if i % 2 else scenario.__name__)
        scenario(everything)
    return [*out, _as_read(everything.events)]


def _as_read(events: list[Event]) -> list[Event]:
    """Events as a store reads them back: the type a plain str, not an EventType."""
    return [e._replace(type=str(e.type)) for e in events]


SCENARIO_STREAMS = _scenario_streams()


def _as_node(payload: bytes) -> Obj | None:
    try:
        value = orjson.loads(payload)  # no Python recursion: the same verdict at any depth
    except orjson.JSONDecodeError:
        return None
    if type(value) is not dict:
        return None
    try:  # each member as its text: no recursion here either
        return Obj(tuple((k, Raw(orjson.dumps(v).decode())) for k, v in value.items()))
    except orjson.JSONEncodeError:  # nested past orjson's depth
        return None


@st.composite
def mutated_scenarios(draw: st.DrawFn) -> list[Event]:
    """The runtime's own streams (a run through each shape the fixtures make,
    or all of them, some sharing a run id) with a few events damaged: a known
    key's value made hostile, a payload replaced, a type, time, run or step
    changed, events dropped, repeated or moved. Deep states (open model calls,
    pending approvals, cancelled runs) meet hostile values this way."""
    events = list(draw(st.sampled_from(SCENARIO_STREAMS)))
    for _ in range(draw(st.integers(1, 6))):
        if not events:
            break
        i = draw(st.integers(0, len(events) - 1))
        e = events[i]
        op = draw(st.sampled_from(["key", "key", "key", "payload", "type", "at", "run", "step",
                                   "drop", "repeat", "move"]))
        if op == "key":
            node = _as_node(e.payload)
            if node is None:
                continue
            key = draw(st.sampled_from(TYPE_KEYS.get(e.type) or ALL_KEYS) | st.sampled_from(
                [k for k, _ in node.pairs] or list(ALL_KEYS)))
            plausible = PLAUSIBLE.get(key)
            value = draw(plausible | hostile if plausible is not None else hostile)
            pairs = [(k, v) for k, v in node.pairs if k != key or draw(st.booleans())]
            pairs.insert(draw(st.integers(0, len(pairs))), (key, value))
            events[i] = e._replace(payload=to_bytes(render(Obj(tuple(pairs)), draw(styles))))
        elif op == "payload":
            events[i] = e._replace(payload=draw(payloads(e.type)))
        elif op == "type":
            events[i] = e._replace(type=draw(types))
        elif op == "at":
            events[i] = e._replace(at=draw(at_texts))
        elif op == "run":
            events[i] = e._replace(run_id=draw(ids))
        elif op == "step":
            events[i] = e._replace(step_id=draw(ids))
        elif op == "drop":
            del events[i]
        elif op == "repeat":
            events.insert(i, e)
        else:
            events.insert(draw(st.integers(0, len(events) - 1)), events.pop(i))
    return [e._replace(seq=n) for n, e in enumerate(events, 1)]


_NUMBER_KEYS = {"index", "repeats", "attempt", "steps", "cost_micros", "duration_ms",
                "latency_ms", "length"}


def _good(key: str) -> st.SearchStrategy[Any]:
    """A value of the shape the runtime writes for ``key``, ids from small pools
    so that results meet their dispatch and decisions their request."""
    if key == "status":
        return st.sampled_from(STATUSES)
    if key in ("late", "truncated", "invalid_base64"):
        return st.just(True)
    if key == "call_id":
        return st.sampled_from(["c1", "c2", ""])
    if key == "approval_id":
        return st.sampled_from(["a1", "a2", ""])
    if key in NESTED_KEYS:
        return st.lists(st.tuples(st.sampled_from(NESTED_KEYS[key]),
                                  st.integers(0, 10**12) | st.sampled_from(["running", None])),
                        max_size=12).map(lambda ps: Obj(tuple(ps)))
    if key in _NUMBER_KEYS:
        return st.integers(-5, 10**6)
    return st.sampled_from(["x", "tool_call", "read", "boom", "", "é<&>"])


@st.composite
def scripted_streams(draw: st.DrawFn) -> list[Event]:
    """Runs of the runtime's event types over small pools of run, step, call and
    approval ids, in any order: results with and without their dispatch,
    decisions on known and unknown approvals, runs cancelled with calls in
    flight, events after the end, the same step id in several runs. Values are
    mostly the runtime's shapes, some hostile; times mostly move forward."""
    runs = draw(st.lists(st.sampled_from(["r1", "r2", "r3", ""]) | ids, min_size=1,
                         max_size=3, unique=True))
    clock = draw(st.sampled_from([1_790_000_000, 0, 253_402_300_000, 9_223_372_036]))
    out: list[Event] = []
    for seq in range(1, draw(st.integers(1, 30)) + 1):
        type_ = draw(st.sampled_from(ALL_EVENT_TYPES) | unknown_types
                     if draw(st.integers(0, 9)) == 0 else st.sampled_from(ALL_EVENT_TYPES))
        pairs = []
        for key in TYPE_KEYS.get(type_, ()):
            if draw(st.booleans()):
                bad = draw(st.integers(0, 5)) == 0
                pairs.append((key, draw(hostile if bad else _good(key))))
        if draw(st.integers(0, 19)) == 0:
            payload = draw(payloads(type_))
        else:
            payload = to_bytes(render(Obj(tuple(pairs)), draw(styles)))
        clock += draw(st.integers(-2, 5))
        if draw(st.integers(0, 9)) == 0:
            at = draw(at_texts)
        else:
            try:
                at = _stored(datetime.fromtimestamp(max(clock, 0) / 1000, UTC))
            except (OverflowError, ValueError, OSError):
                at = "9999-12-31T23:59:59.999999Z"
        out.append(Event(seq, draw(st.sampled_from(runs)),
                         draw(st.sampled_from(["s1", "s2", "s3", ""])), at, type_, payload))
    return out


hostile_streams = st.one_of(streams(), mutated_scenarios(), scripted_streams())


@st.composite
def single_events(draw: st.DrawFn) -> Event:
    type_ = draw(types)
    seq = draw(st.integers(INT64_MIN, INT64_MAX))
    return Event(seq, draw(ids), draw(ids), draw(at_texts), type_, draw(payloads(type_)))


# -- the checks -----------------------------------------------------------------------------

def check_exportable(spans: Sequence[SpanRecord]) -> None:
    """What the exporter does with a page of spans, and what OTLP can carry."""
    for span in spans:
        assert span.trace_id != 0 and span.span_id != 0, span
        assert 0 <= span.start_ns <= MAX_TIME_NS and 0 <= span.end_ns <= MAX_TIME_NS, span
        for ev in span.events:
            assert 0 <= ev.time_ns <= MAX_TIME_NS, span
        for attrs in (span.attributes, *(ev.attributes for ev in span.events)):
            for key, value in attrs.items():
                assert type(value) in (str, int, bool), (key, value)
                if type(value) is int:
                    assert INT64_MIN <= value <= INT64_MAX, (key, value)
                if type(value) is str:
                    value.encode("utf-8")  # no lone surrogate
    del _ENCODER_ERRORS.records[:]
    readable = to_readable_spans(spans, RESOURCE)
    encode_spans(readable).SerializeToString()
    assert not _ENCODER_ERRORS.records, [r.getMessage() for r in _ENCODER_ERRORS.records]


def full(span: SpanRecord) -> tuple[Any, ...]:
    return (*span.identity(), span.kind, span.start_ns, span.end_ns,
            tuple(sorted(span.attributes.items())),
            tuple((e.name, e.time_ns, tuple(sorted(e.attributes.items()))) for e in span.events),
            span.status_code, span.status_description)


def check_record(event: Event) -> None:
    record = jsonl_record(event)
    assert type(record) is bytes
    assert record.endswith(b"\n") and record.count(b"\n") == 1, record[:200]
    assert b"\r" not in record
    try:
        parsed = json.loads(record)
    except RecursionError:  # a payload nested ~1000 deep is JSON, deeper than our parser goes
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + 5000)
        try:
            parsed = json.loads(record)
        finally:
            sys.setrecursionlimit(limit)
    assert type(parsed) is dict
    keys = ["seq", "run_id", "step_id", "at", "type", "payload"]
    if not event.step_id:
        keys.remove("step_id")
    assert [k for k in parsed if k in keys] == keys, list(parsed)
    assert parsed["seq"] == event.seq


mapper_options = st.fixed_dictionaries({
    "max_text": st.sampled_from([0, 1, 3, 16, 1024]),
    "finished_runs": st.sampled_from([1, 2, 4096]),
})

# A few shapes the ordering cases above name, spelled out.
AT = "2026-09-25T14:03:04Z"
_ORDERS = [
    [Event(1, "r", "s", AT, "step.tool_finished", b'{"duration_ms":1e400,"late":"yes"}'),
     Event(2, "r", "s", AT, "step.failed", b'{"observation":{"a":[1]}}')],
    [Event(1, "r", "", AT, "run.finished", b'{"status":"CANCELLED"}'),
     Event(2, "r", "s", AT, "model.completed", b'{"call_id":null,"usage":{"input_tokens":1.5}}'),
     Event(3, "r", "s", AT, "step.started", b"{}"),
     Event(4, "r", "s", AT, "approval.decided", b'{"approval_id":[]}')],
    [Event(1, "a", "s", AT, "step.started", b'{"index":18446744073709551616}'),
     Event(2, "b", "s", "0001-01-01T00:00:00Z", "step.started", b"[]"),
     Event(3, "a", "s", "9999-12-31T23:59:59.999999Z", "step.tool_finished",
           b'{"duration_ms":-9223372036854775808}'),
     Event(4, "b", "s", "x", "model.failed", b'{"latency_ms":-9223372036854775808}')],
    [Event(1, "", "", "", "run.created", b'{"limits":{"max_active_time":-9223372036854775808}}'),
     Event(2, "", "", "", "step.interrupted", b'{"previous_status":{"previous_status":{}}}')],
    # A call in flight when its run is cancelled, pushed out of the finished memory.
    [Event(1, "r1", "", AT, "run.created", b'{"limits":null}'),
     Event(2, "r1", "s", AT, "model.dispatched", b'{"call_id":"c","attempt":1e400}'),
     Event(3, "r1", "s", AT, "model.dispatched", b'{"call_id":"c","model":{"x":[]}}'),
     Event(4, "r1", "", AT, "run.finished", b'{"status":"CANCELLED","steps":"1"}'),
     Event(5, "r2", "", AT, "run.created", b'{"goal":"\\ud800","limits":{"max_steps":1e400}}'),
     Event(6, "r2", "", "x", "run.finished", b'{"status":"COMPLETED"}'),
     Event(7, "r1", "s", AT, "model.completed",
           b'{"call_id":"c","usage":{"input_tokens":18446744073709551616},"latency_ms":"9"}')],
    # Payloads orjson refuses, read the exact way (integers past a double, lone surrogates).
    [Event(1, "r", "", AT, "run.created",
           b'{"goal":"\\udfff","limits":{"max_steps":5,"grant_ttl":null,'
           b'"loop_threshold":18446744073709551616}}'),
     Event(2, "r", "s", AT, "step.decided", b'{"kind":true,"args":{"\\ud800":1e999},'
                                            b'"invalid_base64":"true"}'),
     Event(3, "r", "s", AT, "step.tool_finished",
           b'{"duration_ms":-5,"tool":"\\ud800","error":null,"summary":[1e400]}')],
]


_BIG = 70 * 1024  # past the page read's cap (MAX_PAGE_TEXT, 64 Ki characters)
HUGE_PAYLOADS: list[bytes | str] = [
    b'{"goal":"' + b"g" * _BIG + b'"}',
    b'{"goal":"' + b"\xff\xc3" * _BIG + b'"}',  # not UTF-8
    '{"goal":"' + "\u00e9\\\"\u2028" * _BIG + '"}',
    "[" * _BIG,
    b"\x00" * _BIG,
    '{"status":"CANCELLED","detail":"' + "\U0001f600" * _BIG + '"}',
]


class FailingSource(StreamSource):
    """A source whose reads fail after the first ``fail_after``."""

    def __init__(self, events: list[Event], fail_after: int) -> None:
        super().__init__(events)
        self.fail_after = fail_after

    def list_events_after(self, run_id: str, seq: int, limit: int) -> list[Event]:
        if len(self.calls) >= self.fail_after:
            raise OSError("disk I/O error")
        return super().list_events_after(run_id, seq, limit)


# -- properties -----------------------------------------------------------------------------

@FUZZ
@given(hostile_streams, mapper_options)
@example(_ORDERS[0], {"max_text": 1024, "finished_runs": 4096})
@example(_ORDERS[1], {"max_text": 0, "finished_runs": 1})
@example(_ORDERS[2], {"max_text": 1, "finished_runs": 1})
@example(_ORDERS[3], {"max_text": 3, "finished_runs": 1})
@example(_ORDERS[4], {"max_text": 1024, "finished_runs": 1})
@example(_ORDERS[5], {"max_text": 2, "finished_runs": 4096})
def test_mapping_a_hostile_stream_never_raises_and_its_spans_encode(
        events: list[Event], options: dict[str, int]) -> None:
    spans = SpanMapper(**options).map_all(events)
    check_exportable(spans)
    # One event at a time (as a follower feeds it), each event's spans a page.
    mapper = SpanMapper(**options)
    one_by_one: list[SpanRecord] = []
    for event in events:
        page = mapper.map(event)
        check_exportable(page)
        one_by_one.extend(page)
    assert list(map(full, one_by_one)) == list(map(full, spans))
    for event in events:
        check_record(event)


@FUZZ
@given(hostile_streams, st.lists(st.integers(0, 40), max_size=5), mapper_options,
       st.integers(1, 7), st.none() | st.integers(0, 3))
def test_mapping_restarted_in_pages_over_a_source_never_raises(
        events: list[Event], cuts: list[int], options: dict[str, int], page: int,
        fail_after: int | None) -> None:
    """Each page by a new mapper with the events as its source, as an exporter
    restarted on its cursor (it replays the runs it meets in the middle); the
    source may fail part way, as a store that goes away does."""
    source = StreamSource(list(events)) if fail_after is None else FailingSource(
        list(events), fail_after)
    bounds = sorted({0, len(events), *(min(c, len(events)) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        mapper = SpanMapper(source, **options)
        for i in range(lo, hi, page):
            check_exportable(mapper.map_all(events[i:min(i + page, hi)]))


@settings(FUZZ, max_examples=rounds(30, 800))
@given(streams(max_events=15) | mutated_scenarios() | scripted_streams(), st.integers(1, 6),
       st.lists(st.sampled_from(["step_id", "at", "type", "payload"]), max_size=2, unique=True),
       st.none() | st.sampled_from(HUGE_PAYLOADS))
def test_a_hostile_store_read_in_pages_by_restarted_mappers_never_raises(
        events: list[Event], page: int, as_blob: list[str], huge: bytes | str | None) -> None:
    """The same streams written to a real store's events table (foreign keys
    off, as a damaged or foreign database has them), some columns stored as
    BLOBs, one payload past the page cap; read back through the capped page
    read, each page mapped by a new mapper with the store as its source."""
    with open_store(":memory:") as store:
        conn = store.db()
        conn.execute("PRAGMA foreign_keys=OFF")
        for i, e in enumerate(events):
            row: dict[str, Any] = {"run_id": e.run_id, "step_id": e.step_id, "at": e.at_text,
                                   "type": e.type, "payload": e.payload}
            for col in as_blob:
                if col != "payload":
                    row[col] = row[col].encode("utf-8") + (b"\xff" if i % 2 else b"")
            if "payload" not in as_blob:
                with contextlib.suppress(UnicodeDecodeError):  # else stored as a BLOB
                    row["payload"] = e.payload.decode("utf-8")
            if huge is not None and i == 0:
                row["payload"] = huge
            conn.execute("INSERT INTO events (run_id, step_id, at, type, payload_json) "
                         "VALUES (:run_id, :step_id, :at, :type, :payload)", row)
        after = 0
        while True:
            batch = store.list_events_after("", after, page)
            if not batch:
                break
            spans = SpanMapper(store).map_all(batch)
            check_exportable(spans)
            for event in batch:
                check_record(event)
            after = batch[-1].seq


@settings(FUZZ, max_examples=rounds(150, 3000))
@given(single_events())
@example(Event(1, "r", "", "0001-01-01T00:00:00Z", "run.created", b""))
@example(Event(1, "r", "s", "9999-12-31T23:59:59.999999999Z", "x", b" \n{\"a\" : 1e400}\n"))
@example(Event(1, "r", "s", "not a time", "x", b"\xff\n\r\x00"))
@example(Event(1, "r", "s", "0001-01-01T00:30:00+01:00", "x", b"[" * 3000))
@example(Event(1, "r", "s", AT, "x", b"[" * 1024 + b"]" * 1024))
@example(Event(1, "r", "s", "2026-09-25T14:03:04.5+14:00", "x", b'{"a":"\\ud800"}'))
@example(Event(-1, "", "", "", "", b"\x0b\x0c"))
@example(Event(2**63 - 1, "r", "s", "2026-09-25T14:03:04.123457+00:00", "x", b"{}"))
def test_jsonl_record_is_one_line_of_json_for_any_event(event: Event) -> None:
    check_record(event)
