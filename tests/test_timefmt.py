"""Stored times: the fast path for the runtime's own form reads exactly what the general
parser reads, and everything else still goes through the general parser."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrt.timefmt import format_time, local_stamp, parse_time

# The general parser alone (the pattern, then datetime), kept here as the oracle.
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,
)


def general(text: str) -> datetime | None:
    if text == "":
        return None
    m = _RFC3339.match(text)
    if m is None:
        raise ValueError(f"time {text!r} is not RFC 3339")
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    micro = int(((m.group(7) or "") + "000000")[:6])
    if m.group(8):
        tz = UTC
    else:
        delta = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        tz = timezone(delta if m.group(9) == "+" else -delta)
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz).astimezone(UTC)


def outcome(fn, text: str) -> tuple[str, object]:
    try:
        t = fn(text)
    except ValueError:
        return ("error", None)
    return ("ok", (t, t.tzinfo is UTC) if t is not None else None)


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)),
       st.integers(min_value=0, max_value=9), st.integers(min_value=0, max_value=999))
def test_a_stored_time_parses_as_the_general_parser_reads_it(t, digits, nanos):
    fraction = f"{t.microsecond:06d}{nanos:03d}"[:digits]
    text = (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
            + (f".{fraction}" if digits else "") + "Z")
    got = parse_time(text)
    assert got == general(text)
    assert got is not None and got.tzinfo is UTC


@given(st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 31),
                    timezones=st.just(UTC)))
def test_format_then_parse_is_the_identity(t):
    assert parse_time(format_time(t)) == t


@given(st.text(alphabet="0123456789-:T.Zzt+ ٣", min_size=18, max_size=32))
def test_anything_else_parses_or_fails_as_the_general_parser_says(text):
    assert outcome(parse_time, text) == outcome(general, text)


@pytest.mark.parametrize("text", [
    "2026-10-01T24:00:00Z", "2026-02-29T00:00:00Z", "2026-10-01T23:59:60Z",
    "0000-01-01T00:00:00Z", "2026-13-01T00:00:00Z", "2026-10-01T09:00:00.Z",
    "2026-10-01t09:00:00z", "2026-10-01T09:00:00+02:00", "2026-10-01T09:00:00.1234567890Z",
    "2026-W40-1T09:00:00Z", "2026-10-01 09:00:00Z", "٢٠٢٦-10-01T09:00:00Z",
    "2026-10-01T09:00:00,5Z",
])
def test_edge_forms_read_as_the_general_parser_reads_them(text):
    assert outcome(parse_time, text) == outcome(general, text)


@pytest.mark.parametrize(("zone", "utc", "stamp"), [
    # New York's local mean time before 1883: -4:56:02, a minute Go truncates to -0456.
    ("America/New_York", datetime(1880, 1, 1, 12, 0, tzinfo=UTC), "1880-01-01 07:03:58 -0456"),
    # Amsterdam's +0:19:32 of 1935.
    ("Europe/Amsterdam", datetime(1935, 1, 1, 12, 0, tzinfo=UTC), "1935-01-01 12:19:32 +0019"),
    ("Africa/Monrovia", datetime(1971, 1, 1, 12, 0, tzinfo=UTC), "1971-01-01 11:15:30 -0044"),
    ("America/New_York", datetime(2026, 7, 1, 12, 0, tzinfo=UTC), "2026-07-01 08:00:00 -0400"),
    # POSIX: 30 s west of UTC, which Go writes as +0000 (no minute to sign).
    ("XXX0:00:30", datetime(2026, 1, 1, 12, 0, tzinfo=UTC), "2026-01-01 11:59:30 +0000"),
])
def test_local_stamp_writes_a_zone_offset_in_whole_minutes_toward_zero_as_go(
        monkeypatch, zone, utc, stamp):
    """Before: a negative offset with seconds was floored, a minute off Go's."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        assert local_stamp(utc) == stamp
    finally:
        monkeypatch.undo()
        time.tzset()



@pytest.mark.parametrize(("t", "text"), [
    (datetime(1880, 1, 1, 7, 3, 58, tzinfo=timezone(-timedelta(hours=4, minutes=56, seconds=2))),
     "1880-01-01T07:03:58-04:56"),
    (datetime(2026, 1, 1, 11, 59, 30, tzinfo=timezone(-timedelta(seconds=30))),
     "2026-01-01T11:59:30+00:00"),
    (datetime(2026, 1, 1, 12, 19, 32, tzinfo=timezone(timedelta(minutes=19, seconds=32))),
     "2026-01-01T12:19:32+00:19"),
])
def test_format_time_nano_writes_an_offset_in_whole_minutes_toward_zero_as_go(t, text):
    """Before: a negative offset with seconds was floored (-04:57, -00:01)."""
    from agentrt.timefmt import format_time_nano
    assert format_time_nano(t) == text
