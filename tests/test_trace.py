"""The trace outputs: the aligned terminal line, sanitize, and the JSON Lines record."""

from __future__ import annotations

import io
import json
import re
import threading
import time
import unicodedata
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agentrt import trace
from agentrt.events import Event
from agentrt.gojson import compact, encode_string
from agentrt.timefmt import ZERO_TIME, format_time_nano
from agentrt.trace import (
    jsonl,
    jsonl_record,
    jsonl_with_err,
    sanitize,
    writer,
    writer_with_err,
)

AT = datetime(2026, 9, 25, 14, 3, 4, 500000, tzinfo=UTC)


def event(
    payload: bytes = b"{}",
    *,
    seq: int = 7,
    run_id: str = "run-1",
    step_id: str = "step-1",
    at: datetime = AT,
    type: str = "step.decided",
) -> Event:
    return Event(seq, run_id, step_id, at, type, payload)


@pytest.fixture
def local_zone(monkeypatch):
    """Set the process's local zone for the test, and put it back after."""

    def set_zone(tz: str) -> None:
        monkeypatch.setenv("TZ", tz)
        time.tzset()

    yield set_zone
    monkeypatch.undo()
    time.tzset()


class FailingStream(io.RawIOBase):
    """A binary stream whose writes fail (``fail_after`` successful ones first)."""

    def __init__(self, fail_after: int = 0) -> None:
        self.fail_after = fail_after
        self.calls = 0
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self.calls += 1
        if self.calls > self.fail_after:
            raise OSError(28, "No space left on device")
        self.data += b
        return len(b)


class TrickleStream(io.RawIOBase):
    """A raw stream that takes three bytes per call and yields the CPU between
    calls, so unsynchronised writers would interleave their lines."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        chunk = bytes(b[:3])
        self.data += chunk
        time.sleep(0)
        return len(chunk)


# --- the aligned line -------------------------------------------------------


def test_writer_prints_local_time_padded_type_and_payload(local_zone):
    local_zone("XST-05:30")
    out = io.BytesIO()
    at = datetime(2026, 9, 25, 14, 3, 4, 512999, tzinfo=UTC)
    writer(out)(event(b'{"tool":"read"}', at=at))
    assert out.getvalue() == (
        b'2026-09-25 19:33:04.512 +0530  step.decided           {"tool":"read"}\n'
    )


def test_writer_prints_a_negative_offset_and_keeps_long_types_whole(local_zone):
    local_zone("YST+07")
    out = io.StringIO()
    writer(out)(event(b"{}", type="a.type.longer.than.twenty.two"))
    assert out.getvalue() == "2026-09-25 07:03:04.500 -0700  a.type.longer.than.twenty.two {}\n"


def test_writer_puts_an_untrusted_payload_on_one_safe_line(local_zone):
    local_zone("UTC0")
    out = io.BytesIO()
    writer(out)(event(b'{"out":"line1\nline2\x1b[2J\xe2\x80\xae"}\n', type="step.tool_finished"))
    line = out.getvalue().decode()
    assert line.count("\n") == 1 and line.endswith("\n")
    assert line == (
        "2026-09-25 14:03:04.500 +0000  step.tool_finished     "
        '{"out":"line1 line2\\x1b[2J\\u{202e}"} \n'
    )


def test_writer_sanitizes_the_event_type_too(local_zone):
    local_zone("UTC0")
    out = io.StringIO()
    writer(out)(event(b"{}", type="evil\x1b[31m"))
    assert "\x1b" not in out.getvalue() and "evil\\x1b[31m" in out.getvalue()


def test_writer_survives_the_zero_time(local_zone):
    local_zone("YST+07")
    out = io.StringIO()
    writer(out)(event(b"{}", at=ZERO_TIME))
    assert out.getvalue().startswith("0001-01-01 00:00:00.000 +0000  step.decided")


# --- sanitize ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain ascii with symbols <>&\"'{}[]",
        "مرحبا بالعالم",  # Arabic
        "नमस्ते दुनिया",  # Hindi: vowel signs and virama are marks, a few per letter
        "你好，世界。日本語のテキスト。한국어 텍스트",  # CJK
        "😀 👍🏽 🇫🇷 ❤️",  # emoji, skin tone, flag, variation selector
        "שָׁלוֹם",  # Hebrew with points
        "Tiếng Việt, e\u0301 decomposed",  # Vietnamese, a decomposed accent
        "ภาษาไทย",  # Thai
        "\ufffd already replaced",
    ],
)
def test_sanitize_leaves_legitimate_text_unchanged_and_returns_it_as_is(text):
    assert sanitize(text) is text


def test_sanitize_turns_newlines_into_spaces_and_escapes_control_characters():
    assert sanitize("a\nb\r\nc\td\x00\x1b[31m\x7f\x85\x9f") == (
        "a b  c\\x09d\\x00\\x1b[31m\\x7f\\x85\\x9f"
    )


@pytest.mark.parametrize(
    ("char", "escaped"),
    [
        ("\u202a", "\\u{202a}"),
        ("\u202b", "\\u{202b}"),
        ("\u202c", "\\u{202c}"),
        ("\u202d", "\\u{202d}"),
        ("\u202e", "\\u{202e}"),
        ("\u2066", "\\u{2066}"),
        ("\u2067", "\\u{2067}"),
        ("\u2068", "\\u{2068}"),
        ("\u2069", "\\u{2069}"),
        ("\u061c", "\\u{061c}"),
        ("\u200e", "\\u{200e}"),
        ("\u200f", "\\u{200f}"),
    ],
)
def test_sanitize_escapes_bidi_controls(char, escaped):
    assert sanitize(f"invoice{char}fdp.exe") == f"invoice{escaped}fdp.exe"


@pytest.mark.parametrize(
    "char", ["\u200b", "\u200c", "\u200d", "\u2060", "\u2061", "\u2062", "\u2063", "\u2064",
             "\ufeff", "\u00ad", "\u180e"],
)  # fmt: skip
def test_sanitize_escapes_zero_width_and_invisible_characters(char):
    assert sanitize(f"pay{char}pal") == f"pay\\u{{{ord(char):04x}}}pal"


def test_sanitize_escapes_line_and_paragraph_separators():
    assert sanitize("one\u2028two\u2029three") == "one\\u{2028}two\\u{2029}three"


def test_sanitize_escapes_the_tag_block_with_at_least_four_lowercase_digits():
    hidden = "".join(chr(0xE0000 + ord(c)) for c in "Hi")
    assert sanitize(f"ok{hidden}\U000e007f") == "ok\\u{e0048}\\u{e0069}\\u{e007f}"


def test_sanitize_keeps_four_combining_marks_and_counts_the_dropped():
    assert sanitize("e" + "\u0301" * 4) == "e" + "\u0301" * 4
    assert sanitize("Z" + "\u0336\u0301\u0302\u0303\u0304\u0305\u0306" + "a" + "\u0301" * 5) == (
        "Z\u0336\u0301\u0302\u0303[+3 combining marks dropped]a" + "\u0301" * 4
        + "[+1 combining marks dropped]"
    )  # fmt: skip


def test_sanitize_replaces_undecodable_bytes_and_lone_surrogates():
    assert sanitize(b"a\xffb\xe2\x80".decode("utf-8", "surrogateescape")) == "a\ufffdb\ufffd\ufffd"
    assert sanitize("x\ud800y") == "x\ufffdy"


#: The invisible characters the spec names, by code point.
SPEC_INVISIBLE = (
    {0x00AD, 0x061C, 0x180E, 0xFEFF}
    | set(range(0x200B, 0x2010))
    | set(range(0x2028, 0x202F))
    | set(range(0x2060, 0x2065))
    | set(range(0x2066, 0x206A))
    | set(range(0xE0000, 0xE0080))
)


@given(st.text())
def test_sanitize_output_holds_nothing_that_moves_hides_or_stacks(text):
    marks = 0
    for c in sanitize(text):
        o = ord(c)
        assert not (o < 0x20 or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xDFFF)
        assert o not in SPEC_INVISIBLE
        marks = marks + 1 if unicodedata.category(c).startswith("M") else 0
        assert marks <= 4


def test_sanitize_finds_exactly_the_specified_characters_in_all_of_unicode():
    # Every code point five times, then a letter: a special character matches
    # alone, a combining mark as a run.
    text = "".join(chr(cp) * 5 + "a" for cp in range(0x110000))
    singles: set[int] = set()
    runs: set[int] = set()
    for m in trace._unicode_pattern().finditer(text):
        found = m.group()
        (singles if len(found) == 1 else runs).add(ord(found[0]))
    assert runs == {cp for cp in range(0x110000) if unicodedata.category(chr(cp))[0] == "M"}
    controls = set(range(0x20)) | set(range(0x7F, 0xA0))
    assert singles == controls | SPEC_INVISIBLE | set(range(0xD800, 0xE000))


# --- the JSON Lines record --------------------------------------------------


def test_jsonl_writes_one_object_per_event():
    out = io.BytesIO()
    observe = jsonl(out)
    observe(event(b"", seq=1, step_id="", type="run.created"))
    observe(event(b'{"reason":"a < b & c"}', seq=2, step_id="step-1", type="step.decided"))
    lines = out.getvalue().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    assert lines[0] == (
        b'{"seq":1,"run_id":"run-1","at":"2026-09-25T14:03:04.5Z","type":"run.created",'
        b'"payload":{}}'
    )
    second = json.loads(lines[1])
    assert second == {
        "seq": 2,
        "run_id": "run-1",
        "step_id": "step-1",
        "at": "2026-09-25T14:03:04.5Z",
        "type": "step.decided",
        "payload": {"reason": "a < b & c"},
    }
    assert b"a < b & c" in lines[1]


def test_jsonl_record_keeps_html_characters_literal():
    record = jsonl_record(event(b'{"a":"<b>&"}', run_id="<r&>"))
    assert b'"run_id":"<r&>"' in record and b'"payload":{"a":"<b>&"}' in record


def test_jsonl_record_is_byte_stable():
    e = event(b'{ "b" : 2, "a" : [1.50, "\\u00e9"] }', seq=42, run_id="r", step_id="s")
    expected = (
        b'{"seq":42,"run_id":"r","step_id":"s","at":"2026-09-25T14:03:04.5Z",'
        b'"type":"step.decided","payload":{"b":2,"a":[1.50,"\\u00e9"]}}\n'
    )
    assert jsonl_record(e) == expected
    assert jsonl_record(e) == expected


@pytest.mark.parametrize(
    ("payload", "embedded"),
    [
        (b' {"n" : 1.0e5 , "s" : "\\u00e9 x" , "a" : 1, "a" : 2 }\n',
         b'{"n":1.0e5,"s":"\\u00e9 x","a":1,"a":2}'),
        (b'{"q": "say \\"hi \\\\", "b": [ 1 , -0 , 1E+2 ]}',
         b'{"q":"say \\"hi \\\\","b":[1,-0,1E+2]}'),
        (b'{"t":"tab\\tnew\\nline", "u": "\\u003c"}', b'{"t":"tab\\tnew\\nline","u":"\\u003c"}'),
        (b'\t[ "spaced  out" ,\r\n"x" ]  ', b'["spaced  out","x"]'),
        (b'{"big": 123456789012345678901234567890, "inf": 1e999 }',
         b'{"big":123456789012345678901234567890,"inf":1e999}'),
        (b'{"lone": "\\ud800" }', b'{"lone":"\\ud800"}'),
        (b'{"sep":"\xe2\x80\xa8"}', b'{"sep":"\xe2\x80\xa8"}'),
        (b'"just a string"', b'"just a string"'),
        (b"  \n ", b"{}"),
        (b"", b"{}"),
    ],
)  # fmt: skip
def test_jsonl_record_compacts_the_payload_without_reserialising_it(payload, embedded):
    record = jsonl_record(event(payload, seq=1, run_id="r", step_id=""))
    prefix = b'{"seq":1,"run_id":"r","at":"2026-09-25T14:03:04.5Z","type":"step.decided","payload":'
    assert record == prefix + embedded + b"}\n"


def test_jsonl_invalid_payload_is_emitted_not_dropped():
    record = jsonl_record(event(b"not json", seq=9, step_id=""))
    assert record == (
        b'{"seq":9,"run_id":"run-1","at":"2026-09-25T14:03:04.5Z","type":"step.decided",'
        b'"payload":"not json","invalid_payload":true}\n'
    )


@pytest.mark.parametrize(
    ("payload", "as_string"),
    [
        (b'{"a":NaN}', b'"{\\"a\\":NaN}"'),
        (b'{"a":1} trailing', b'"{\\"a\\":1} trailing"'),
        (b"\xef\xbb\xbf{}", b'"\xef\xbb\xbf{}"'),  # a BOM is not JSON
        ('{"a":1}'.encode("utf-16"), b'"\\ufffd\\ufffd{\\u0000\\"\\u0000a\\u0000\\"\\u0000:'
                                     b'\\u00001\\u0000}\\u0000"'),
        (b'{"s":"\xff\xe2\x80"}', b'"{\\"s\\":\\"\\ufffd\\ufffd\\ufffd\\"}"'),  # per bad byte
        (b'{"s":"a\nb"}', b'"{\\"s\\":\\"a\\nb\\"}"'),
    ],
)  # fmt: skip
def test_jsonl_invalid_payload_becomes_a_string_with_go_escapes(payload, as_string):
    record = jsonl_record(event(payload))
    assert record.endswith(b',"payload":' + as_string + b',"invalid_payload":true}\n')
    json.loads(record)


def test_jsonl_record_escapes_string_fields_like_go():
    record = jsonl_record(event(b"{}", run_id='q"\\\n\x01\u2028\ud800é<', step_id="", type="t"))
    assert b'"run_id":"q\\"\\\\\\n\\u0001\\u2028\\ufffd\xc3\xa9<"' in record


def test_jsonl_record_prints_every_time_in_utc_as_it_is_stored():
    # An event holds its time as stored (UTC), so a live record and the same
    # event exported later are byte-identical whatever zone the driver's clock
    # reads in (the reference printed the clock's zone live and UTC after).
    at = datetime(2026, 9, 25, 7, 3, 4, 120000, tzinfo=timezone(timedelta(hours=-7)))
    assert b'"at":"2026-09-25T14:03:04.12Z"' in jsonl_record(event(at=at))
    whole = datetime(2026, 9, 25, 19, 33, 4, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert b'"at":"2026-09-25T14:03:04Z"' in jsonl_record(event(at=whole))


def test_jsonl_record_prints_the_zero_time_as_go_does():
    assert b'"at":"0001-01-01T00:00:00Z"' in jsonl_record(event(at=ZERO_TIME))


@given(st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.just(UTC)))
def test_jsonl_record_time_is_format_time_nano(at):
    record = json.loads(jsonl_record(event(at=at)))
    assert record["at"] == format_time_nano(at)


def go_time(t: datetime) -> bytes:
    """How the record writes a UTC time, built from its fields."""
    fraction = f".{t.microsecond:06d}".rstrip("0") if t.microsecond else ""
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:"
            f"{t.second:02d}{fraction}Z").encode()


stored_times = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 1), timezones=st.just(UTC)).map(
        lambda t: f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:"
                  f"{t.second:02d}" + (f".{t.microsecond:06d}".rstrip("0") if t.microsecond
                                       else "") + "Z"),
    st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}"
                  r"(\.[0-9]{0,10})?([Zz]|[+-][0-9]{2}:[0-9]{2})?\Z"),
    st.text(max_size=30),
)


@given(stored_times)
@example("2026-09-25T14:03:04.50Z")
@example("2026-09-25T14:03:04.000Z")
@example("2026-09-25T14:03:04.Z")
@example("2026-09-25T14:03:04.1234567Z")
@example("2026-09-25T14:03:04.123456789Z")
@example("2026-09-25t14:03:04.5z")
@example("2026-09-25t14:03:04.5Z")
@example("2026-09-25T14:03:04.5z")
@example("2026-09-25T14:03:04Z ")
@example("2026-09-25T14:03:04.5+00:00")
@example("2026-09-25T16:03:04.5+02:00")
@example("2026-02-30T14:03:04.5Z")
@example("0000-09-25T14:03:04.5Z")
@example("2026-09-25T24:00:00Z")
@example("")
def test_jsonl_record_time_is_the_stored_time_read_and_written_back(text):
    # The record copies a stored time that is already in its form (nanoseconds
    # of a database the Go reference wrote included) and rebuilds any other
    # from the parsed time.
    e = Event(7, "r", "", text, "step.decided", b"{}")
    canonical = re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                             r"(\.[0-9]{0,8}[1-9])?Z", text)
    expected = text.encode() if canonical and e.at != ZERO_TIME else go_time(e.at)
    stated = re.fullmatch(r".*:[0-9]{2}\.([0-9]{1,9})([Zz]|[+-][0-9]{2}:[0-9]{2})", text)
    if not canonical and stated and e.at != ZERO_TIME:  # the digits it states, as Go keeps them
        digits = stated.group(1).rstrip("0").encode()
        expected = expected.split(b".")[0].removesuffix(b"Z") + (
            b"." + digits if digits else b"") + b"Z"
    assert b'"at":"' + expected + b'"' in jsonl_record(e)


@pytest.mark.parametrize(("stored", "written"), [
    ("2026-09-25T14:03:04.123456789Z", "2026-09-25T14:03:04.123456789Z"),
    # Before: rebuilt from microseconds, .123456Z and .123456Z.
    ("2026-09-25T14:03:04.123456780Z", "2026-09-25T14:03:04.12345678Z"),
    ("2026-09-25T14:03:04.123456789+00:00", "2026-09-25T14:03:04.123456789Z"),
    ("2026-09-25T16:33:04.000000100+02:30", "2026-09-25T14:03:04.0000001Z"),
    ("2026-09-25T14:03:04.000000000Z", "2026-09-25T14:03:04Z"),
    ("2026-02-30T14:03:04.5Z", "0001-01-01T00:00:00Z"),  # not a day: the zero time
])
def test_jsonl_record_keeps_the_nanoseconds_a_stored_time_states_in_any_form(stored, written):
    e = Event(7, "r", "", stored, "step.decided", b"{}")
    assert b'"at":"' + written.encode() + b'"' in jsonl_record(e)


@given(st.text(), st.text(min_size=1))
def test_jsonl_record_writes_ids_with_go_escapes(run_id, step_id):
    record = jsonl_record(event(run_id=run_id, step_id=step_id))
    quoted_run = encode_string(run_id, False).encode("utf-8")
    quoted_step = encode_string(step_id, False).encode("utf-8")
    assert record.startswith(b'{"seq":7,"run_id":' + quoted_run + b',"step_id":' + quoted_step
                             + b',"at":')


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def refuse(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def is_json(payload: bytes) -> bool:
    """Whether ``payload`` is one JSON value (or blank), by the stdlib's strict reading."""
    if not payload.strip():
        return True
    try:
        json.loads(payload.decode("utf-8"), parse_constant=refuse)
    except (ValueError, RecursionError):
        return False
    return True


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)


@st.composite
def encoded_json(draw):
    """A JSON value and one of many ways of writing it."""
    value = draw(json_values)
    ensure_ascii = draw(st.booleans())
    indent = draw(st.none() | st.integers(0, 3) | st.sampled_from(["\t", " \r\n"]))
    separators = draw(st.sampled_from([None, (",", ":"), (" , ", " : "), (",\n", ":\t")]))
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators)
    padding = draw(st.sampled_from(["", " ", "\n", " \t\r\n"]))
    return value, (padding + text + padding).encode("utf-8", "surrogatepass")


@given(encoded_json())
def test_jsonl_payload_parses_to_the_value_it_was_given(case):
    value, payload = case
    record = jsonl_record(event(payload, run_id="r", step_id=""))
    assert record.endswith(b"\n") and record.count(b"\n") == 1
    parsed = json.loads(record)
    if "invalid_payload" in parsed:  # raw lone surrogates are not UTF-8, so not JSON
        assert b"\xed" in payload
        return
    assert parsed["payload"] == value
    start = len(b'{"seq":7,"run_id":"r","at":"2026-09-25T14:03:04.5Z","type":"step.decided"')
    assert record[start:] == b',"payload":' + compact(payload.strip(b" \t\r\n")) + b"}\n"


@given(st.binary(), st.text(), st.text(), st.text())
def test_jsonl_record_is_one_json_line_whatever_the_event_holds(payload, run_id, step_id, type_):
    record = jsonl_record(event(payload, run_id=run_id, step_id=step_id, type=type_))
    assert record.endswith(b"\n") and record.count(b"\n") == 1
    parsed = json.loads(record.decode("utf-8"))
    assert list(parsed)[:2] == ["seq", "run_id"]
    assert ("step_id" in parsed) == bool(step_id)
    assert parsed["run_id"] == LONE_SURROGATE.sub("\ufffd", run_id)
    assert parsed["type"] == LONE_SURROGATE.sub("\ufffd", type_)
    # A payload Go's bytes.TrimSpace empties is written as {}, not flagged.
    assert ("invalid_payload" in parsed) != (is_json(payload) or _go_blank(payload))


def _go_blank(payload: bytes) -> bool:
    """Whether Go's bytes.TrimSpace leaves nothing of ``payload`` (unicode.IsSpace:
    the ASCII spaces, U+0085, U+00A0 and the Z categories)."""
    text = payload.decode("utf-8", "surrogateescape")
    return all(c in "\t\n\v\f\r \x85\xa0" or unicodedata.category(c) in ("Zs", "Zl", "Zp")
               for c in text)


# --- writers from many threads, and write failures --------------------------


@pytest.mark.parametrize("make", [jsonl, writer])
def test_trace_concurrent_events_stay_whole(make):
    out = TrickleStream()
    observe = make(out)
    start = threading.Barrier(20)

    def emit(i: int) -> None:
        start.wait()
        observe(event(b'{"i":%d,"pad":"%s"}' % (i, b"x" * 40), seq=i + 1))

    threads = [threading.Thread(target=emit, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = bytes(out.data).decode().splitlines()
    assert len(lines) == 20
    seen = sorted(int(line.split('"i":')[1].split(",")[0]) for line in lines)
    assert seen == list(range(20))
    if make is jsonl:
        assert sorted(json.loads(line)["seq"] for line in lines) == list(range(1, 21))


@pytest.mark.parametrize("make", [jsonl_with_err, writer_with_err])
def test_with_err_surfaces_a_write_failure_and_remembers_it(make):
    out = FailingStream(fail_after=1)
    observe, err = make(out)
    observe(event(seq=1))
    assert err() is None
    observe(event(seq=2))  # fails, but an observer never breaks the run it watches
    first = err()
    assert isinstance(first, OSError) and first.errno == 28
    observe(event(seq=3))
    assert err() is first
    assert out.calls == 2  # nothing written after the first failure
    assert out.data.count(b"\n") == 1


@pytest.mark.parametrize("make", [jsonl_with_err, writer_with_err])
def test_an_event_that_cannot_be_rendered_writes_nothing_and_its_error_is_noted(make):
    """Spec export 2.2: "the event writes nothing and the error is noted". Before:
    dropped without a word (err() stayed None). The events after it are written."""
    out = io.BytesIO()
    observe, err = make(out)
    observe(event(seq=1))
    unrenderable = event(seq=2)._replace(payload=object())  # not bytes: no record
    observe(unrenderable)
    first = err()
    assert isinstance(first, Exception)
    observe(event(seq=3))
    assert err() is first
    assert out.getvalue().count(b"\n") == 2


def test_jsonl_to_a_text_stream_writes_the_same_record():
    text, binary = io.StringIO(), io.BytesIO()
    e = event('{"é":"\u2028<"}'.encode())
    jsonl(text)(e)
    jsonl(binary)(e)
    assert text.getvalue().encode() == binary.getvalue() == jsonl_record(e)


def test_observers_flush_each_line():
    raw = io.BytesIO()
    buffered = io.BufferedWriter(raw, buffer_size=1 << 16)
    jsonl(buffered)(event())
    assert raw.getvalue() == jsonl_record(event())


def _run_python(code: str) -> tuple[int, str, str]:
    import subprocess
    import sys
    import textwrap

    from eventdb import REPO_ROOT, child_env

    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=REPO_ROOT, env=child_env(), timeout=60, check=False)
    return done.returncode, done.stdout, done.stderr


def test_a_trace_file_on_a_full_disk_leaves_nothing_for_its_owners_close_to_fail_on():
    """The observer swallows the failure (the trace ends quietly, as the reference's
    does); the line must not stay in the file object's buffer, where the owner's own
    close() would raise it as a traceback."""
    code, out, err = _run_python("""
        from agentrt import trace
        from agentrt.events import Event
        with open("/dev/full", "ab") as f:
            observe, failure = trace.jsonl_with_err(f)
            observe(Event(1, "r", "", "2026-01-01T00:00:00Z", "run.created", b"{}"))
            assert failure() is not None
        print("closed")
    """)
    assert (code, out, err) == (0, "closed\n", "")


def test_an_aligned_trace_file_past_the_size_limit_leaves_nothing_for_close(tmp_path):
    code, out, err = _run_python(f"""
        import resource, signal
        from agentrt import trace
        from agentrt.events import Event
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.RLIM_INFINITY))
        with open({str(tmp_path / "trace.log")!r}, "a") as f:
            observe, failure = trace.writer_with_err(f)
            for i in range(1, 4):
                observe(Event(i, "r", "", "2026-01-01T00:00:00Z", "step.decided",
                              b'{{"x":"' + b"a" * 60 + b'"}}'))
            assert failure() is not None
        print("closed")
    """)
    assert (code, out, err) == (0, "closed\n", "")


@pytest.mark.parametrize("space", ["\u00a0", "\u3000", " \u0085 ", "\u2028", "\u2000\u200a"])
def test_a_payload_of_unicode_white_space_only_is_blank_as_gos_trimspace_sees_it(space):
    record = jsonl_record(Event(1, "r", "", "2026-01-01T00:00:00Z", "t", space.encode()))
    assert record.endswith(b'"payload":{}}\n')


@pytest.mark.parametrize("text", ["\x1c", "\u00a0x"])
def test_a_payload_go_does_not_trim_to_nothing_is_still_flagged(text):
    record = jsonl_record(Event(1, "r", "", "2026-01-01T00:00:00Z", "t", text.encode()))
    assert record.endswith(b',"invalid_payload":true}\n')
