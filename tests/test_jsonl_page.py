"""The page of JSON Lines records written in C (agentrt/_jsonlpage.c) is, byte
for byte, what jsonl_record writes for each event, and it is really used."""

from __future__ import annotations

import json
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _asan_kit import run_under_asan
from _fixtures_kit import copy_fixture
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentrt import open_existing, trace
from agentrt.events import OWN_EVENT_CLASSES, Event, event_from_fields
from agentrt.trace import jsonl_page, jsonl_record

try:
    from agentrt._jsonlpage import join_records
except ImportError:  # no C compiler at install (test_packaging.py fails if there is one)
    join_records = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(join_records is None, reason="agentrt._jsonlpage not built")


def python_page(events: list[Event]) -> bytes:
    return b"".join(jsonl_record(e) for e in events)


def c_page(events: list[Event]) -> bytes:
    return join_records(events, OWN_EVENT_CLASSES, jsonl_record)


def refuse(event: Event) -> bytes:
    raise AssertionError(f"the C path left {event!r} to Python")


def stored(seq: int = 1, run_id: str = "run-1", step_id: str = "step-1",
           at: str = "2026-09-25T14:03:04.5Z", type: str = "step.decided",
           payload: bytes = b'{"a":1}') -> Event:
    return event_from_fields((seq, run_id, step_id, at, type, payload))


def test_every_fixture_event_is_written_in_c_as_python_writes_it(tmp_path: Path) -> None:
    with open_existing(copy_fixture(tmp_path)) as store:
        events = store.list_events_after("", 0, 100_000)
    assert len(events) > 100
    assert join_records(events, OWN_EVENT_CLASSES, refuse) == python_page(events)


def test_a_record_in_the_runtimes_form_is_written_without_python() -> None:
    events = [stored(), stored(seq=2, step_id=""), Event(3, "r", "", datetime(
        2026, 1, 2, 3, 4, 5, tzinfo=UTC), "run.started", b"[]")]
    assert join_records(events, OWN_EVENT_CLASSES, refuse) == python_page(events)
    assert b'"step_id"' not in c_page(events[1:2])


@pytest.mark.parametrize("change", [
    {"run_id": 'a"b'}, {"step_id": "s\\1"}, {"type": "t\u00e9"}, {"run_id": "a\x7f"},
    {"at": "2026-09-25T14:03:04.50Z"}, {"at": "2026-09-25T14:03:04+00:00"},
    {"at": "2026-02-29T14:03:04Z"}, {"at": "2026-09-25 14:03:04Z"},
    {"at": "2026-09-25T24:00:00Z"}, {"at": "2026-09-25T23:60:00Z"},
    {"at": "2016-12-31T23:59:60Z"}, {"at": "0000-01-01T00:00:00Z"},
    {"at": "2026-13-01T00:00:00Z"}, {"at": "2026-04-31T00:00:00Z"},
    {"at": "2026-04-00T00:00:00Z"}, {"at": "1900-02-29T00:00:00Z"},
    {"at": "2026-09-25T14:03:04.1234567891Z"},
    {"payload": b'"\xed\xa0\x80"'}, {"payload": b'"\xc0\xaf"'},
    {"payload": b'"\xe0\x80\xaf"'}, {"payload": b'"\xf0\x80\x80\xaf"'},
    {"payload": b'"\xf4\x90\x80\x80"'}, {"payload": b'"\xf0\x90'},
    {"payload": b""}, {"payload": b" \n "}, {"payload": b"nope"},
    {"payload": b'"\\udc00"'}, {"payload": b'"\\ud83d x"'}, {"payload": b'"\\ud83d\\u0041"'},
    {"payload": b'"\\ud800"'}, {"payload": b"[" * 65 + b"]" * 65},
    {"payload": b"[1e100]"}, {"payload": b"1" * 201}, {"payload": b"-1E-400"},
    {"seq": 2**64}, {"seq": True},
])
def test_an_event_in_another_form_is_left_to_python(change: dict[str, object]) -> None:
    event = stored(**change)  # type: ignore[arg-type]
    seen: list[Event] = []

    def fallback(e: Event) -> bytes:
        seen.append(e)
        return jsonl_record(e)

    assert join_records([stored(), event], OWN_EVENT_CLASSES, fallback) == python_page(
        [stored(), event])
    assert seen == [event]


@pytest.mark.parametrize("at", ["2000-02-29T23:59:59Z", "0001-01-01T00:00:00Z",
                                "9999-12-31T23:59:59.999999999Z", "2026-09-25T14:03:04.000000001Z"])
@pytest.mark.parametrize("payload", [b'"\xed\x9f\xbf\xee\x80\x80"', b'"\xf4\x8f\xbf\xbf"',
                                     b'"\xf0\x90\x80\x80\xc2\x80\x7f"', b"-0.5e+7",
                                     b'"\\ud83d\\ude00 \\uDBFF\\uDFFF"',
                                     b' { "a" : [ 1 ,\t"x \\" y" ] }\r\n', b"[ ]", b"{\n}"])
def test_the_edges_of_the_runtimes_form_are_written_in_c(at: str, payload: bytes) -> None:
    event = stored(at=at, payload=payload)
    assert join_records([event], OWN_EVENT_CLASSES, refuse) == jsonl_record(event)


@pytest.mark.parametrize("payload", [b"1e99", b"-1" + b"0" * 199 + b".5E+99", b"[0.5e-9]"])
def test_numbers_within_a_doubles_range_are_written_in_c(payload: bytes) -> None:
    assert join_records([stored(payload=payload)], OWN_EVENT_CLASSES, refuse) == jsonl_record(
        stored(payload=payload))


def _frames_below() -> int:
    frame, n = sys._getframe(), 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    return n


def test_c_and_python_agree_on_a_deep_out_of_range_number_near_the_recursion_limit() -> None:
    """orjson refuses 1e400 and Python's strict decoder, recursing once a level,
    decides: called with few frames left it calls the payload invalid. The C
    path leaves such numbers to Python, so the two paths still agree."""
    event = stored(payload=b"[" * 60 + b"1e400" + b"]" * 60)

    def down(n: int) -> tuple[bytes, bytes]:
        return down(n - 1) if n else (c_page([event]), python_page([event]))

    c, python = down(sys.getrecursionlimit() - _frames_below() - 40)
    assert c == python


def test_a_str_subclass_id_does_not_change_the_record_of_the_plain_id_after_it() -> None:
    class Odd(str):
        def encode(self, *args: object, **kwargs: object) -> bytes:  # type: ignore[override]
            return b"spoofed"

    plain = "a-run-id-seen-first-as-a-subclass"
    python_page([stored(seq=1, run_id=Odd(plain))])
    later = stored(seq=2, run_id=plain)
    assert b'"run_id":"a-run-id-seen-first-as-a-subclass"' in python_page([later])
    assert c_page([later]) == python_page([later])


def test_a_subclass_of_event_is_left_to_python_whatever_its_fields() -> None:
    class Renamed(Event):
        @property
        def type(self) -> str:
            return "renamed"

    event = Renamed(1, "r", "s", "2026-09-25T14:03:04Z", "run.started", b"{}")
    assert c_page([event]) == jsonl_record(event)
    assert b'"type":"renamed"' in c_page([event])


def test_a_fallback_that_fails_or_returns_no_bytes_stops_the_page() -> None:
    with pytest.raises(ZeroDivisionError):
        join_records([stored(payload=b"x")], OWN_EVENT_CLASSES, lambda e: 1 / 0)
    with pytest.raises(TypeError, match="not bytes"):
        join_records([stored(payload=b"x")], OWN_EVENT_CLASSES, lambda e: "text")


def test_a_fallback_that_empties_the_page_it_is_writing_changes_nothing() -> None:
    events = [stored(seq=i, payload=b"x") for i in range(50)]
    expected = python_page(events)

    def clearing(e: Event) -> bytes:
        events.clear()
        return jsonl_record(e)

    assert join_records(events, OWN_EVENT_CLASSES, clearing) == expected


def test_jsonl_page_without_the_c_module_writes_the_same_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events = [stored(), stored(payload=b" [1, 2] "), stored(run_id="é")]
    with_c = jsonl_page(events)
    monkeypatch.setattr(trace, "_join_records", None)
    assert jsonl_page(events) == with_c == python_page(events)


TEXT = st.characters(exclude_categories=["Cs"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(TEXT, max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(TEXT, max_size=4),
                                                                inner, max_size=4),
    max_leaves=12)


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    value = draw(json_values)
    form = draw(st.sampled_from(["compact", "ascii", "indented", "mutated", "bytes"]))
    if form == "bytes":
        return draw(st.binary(max_size=24))
    compact = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if form == "compact":
        return compact
    if form == "ascii":  # astral characters as escaped surrogate pairs
        return json.dumps(value, separators=(",", ":")).encode()
    if form == "indented":
        return json.dumps(value, indent=1, ensure_ascii=False).encode()
    data = bytearray(compact)
    where = draw(st.integers(0, len(data)))
    byte = draw(st.sampled_from(b' "\\{}[],:0-eE.\x00\x1f\x80\xc3\xed\xf4\xff'))
    data[where:where + draw(st.integers(0, 1))] = bytes([byte])
    return bytes(data)


ids = st.text(st.sampled_from('ab-_.:/ <>&"\\\x1f\x7f\u00e9\u2028\ud800'), max_size=6)


@st.composite
def times(draw: st.DrawFn) -> str:
    t = datetime(1, 1, 1, tzinfo=UTC) + timedelta(
        seconds=draw(st.integers(0, 315_537_897_599)))
    text = t.strftime("%Y-%m-%dT%H:%M:%S")
    text = "0" * (4 - text.index("-")) + text  # years below 1000: four digits, as stored
    digits = draw(st.text(st.sampled_from("0123456789"), max_size=10))
    text += ("." + digits if digits or draw(st.booleans()) else "") + "Z"
    if draw(st.booleans()):
        where = draw(st.integers(0, len(text) - 1))
        text = text[:where] + draw(st.sampled_from("09:-.TZ+ x")) + text[where + 1:]
    return text


@settings(max_examples=400)
@given(st.lists(st.tuples(st.integers(-(2**64), 2**64), ids, ids, times(), ids, payloads()),
                max_size=6))
@example([(1, "r", "", "0999-12-31T23:59:59.000000001Z", "t", b"[1e400]")])
@example([(1, "r", "s", "2024-02-29T00:00:60Z", "t", b'"\xed\x9f\xbf\xf0\x90\x80\x80"')])
def test_c_and_python_write_the_same_page(rows: list[tuple[object, ...]]) -> None:
    events = [event_from_fields(row) for row in rows]
    assert c_page(events) == python_page(events)


def test_c_and_python_agree_on_many_damaged_payloads(tmp_path: Path) -> None:
    """Every single-byte change of real payloads: the place a C parser goes wrong."""
    with open_existing(copy_fixture(tmp_path)) as store:
        payloads = sorted({e.payload for e in store.list_events_after("", 0, 100_000)})
    rng = random.Random(7)
    events = []
    for payload in payloads[:40]:
        for _ in range(60):
            data = bytearray(payload)
            where = rng.randrange(len(data) + 1)
            data[where:where + rng.randrange(2)] = bytes([rng.randrange(256)])
            events.append(stored(payload=bytes(data)))
    assert c_page(events) == python_page(events)


ASAN_CHILD = r"""
import importlib.util, random, sys
spec = importlib.util.spec_from_file_location("agentrt._jsonlpage", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from agentrt import open_existing
from agentrt.events import OWN_EVENT_CLASSES, event_from_fields
from agentrt.trace import jsonl_record
with open_existing(sys.argv[2]) as store:
    payloads = sorted({e.payload for e in store.list_events_after("", 0, 100_000)})
rng = random.Random(11)
cases = []
for payload in payloads:
    for cut in range(len(payload) + 1):  # every prefix: each way a value can end early
        cases.append(payload[:cut])
    # whitespace outside strings, which the record leaves out as it copies
    cases.append(b" " + payload.replace(b",", b", ").replace(b":", b" :\n") + b"\t")
    for _ in range(40):
        data = bytearray(payload)
        where = rng.randrange(len(data) + 1)
        data[where:where + rng.randrange(3)] = bytes(rng.randrange(256) for _ in range(2))
        cases.append(bytes(data))
times = ["2026-09-25T14:03:04.123456789Z", "2026-09-25T14:03:04Z", "2026-09-25T14:03:0",
         "2026-09-25T14:03:04.", "2026-09-25T14:03:04.1", ""]
for i, payload in enumerate(cases):
    # bytearray copies: each payload in an allocation of its own, so an over-read shows
    event = event_from_fields((i, "r", "s", times[i % len(times)], "t", bytes(bytearray(payload))))
    if module.join_records([event], OWN_EVENT_CLASSES, jsonl_record) != jsonl_record(event):
        sys.exit(f"differs: {event!r}")
print("ok", len(cases))
"""


def test_the_c_record_writer_reads_no_byte_outside_its_input_under_asan(tmp_path: Path) -> None:
    """AddressSanitizer over every prefix and many damaged forms of real payloads.
    The test build parses exact-length copies of each payload and time
    (JSONLPAGE_EXACT_COPIES), where a bytes object holds a NUL after its data,
    so a read even one byte past the end aborts the child."""
    child = run_under_asan(tmp_path, "_jsonlpage", ASAN_CHILD, copy_fixture(tmp_path / "db"),
                           defines=("-DJSONLPAGE_EXACT_COPIES",))
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.startswith("ok ")
