"""The OTel export's fast paths give exactly what their general paths give.

Each fast path sits beside the general one it shortcuts: an event's time read
from its stored text (:func:`agentrt_otel._fields.event_at_ns` against
``event_ns(event.at, event.at_text)``) and a span id hashed from its kind's hashed prefix
(:func:`agentrt_otel.ids.span_id` against the formula over the whole text).
What reaches the collector must not change by a byte, so each is compared
with its general path over generated input.
"""

from __future__ import annotations

import hashlib

import hypothesis.strategies as st
from hypothesis import given, settings

from agentrt.events import Event
from agentrt_otel._fields import MAX_TIME_NS, event_at_ns, event_ns
from agentrt_otel.ids import span_id

# -- times -------------------------------------------------------------------


def _at(text: str) -> Event:
    return Event(1, "r", "", text, "run.started", b"{}")


def _general_ns(text: str) -> int:
    event = _at(text)
    return event_ns(event.at, event.at_text)


_DIGITS = (st.text("0123456789", min_size=0, max_size=11)
           | st.text("0123456789_ +-a\u0663", min_size=1, max_size=4))


@st.composite
def stored_times(draw: st.DrawFn) -> str:
    """Texts of the stored form's shape, most of them valid, with fields out of
    range, odd separators, fractions of 0 to 11 digits and other zones mixed in."""
    year = draw(st.sampled_from([1, 1969, 1970, 2026, 2262, 2263, 9999]) | st.integers(0, 9999))
    fields = [draw(st.integers(0, hi)) for hi in (13, 32, 25, 61, 61)]
    text = (f"{year:04d}-{fields[0]:02d}-{fields[1]:02d}{draw(st.sampled_from('TTTt '))}"
            f"{fields[2]:02d}:{fields[3]:02d}:{fields[4]:02d}")
    if draw(st.booleans()):
        text += draw(st.sampled_from(".,")) + draw(_DIGITS)
    return text + draw(st.sampled_from(["Z", "Z", "Z", "z", "+01:00", "", "Z "]))


@settings(max_examples=1500, deadline=None)
@given(stored_times() | st.text(max_size=32))
def test_an_event_time_read_from_its_text_equals_the_parsed_datetime_path(text: str) -> None:
    assert event_at_ns(_at(text)) == _general_ns(text)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 253_402_300_799), st.text("0123456789", min_size=1, max_size=9))
def test_every_second_and_fraction_in_range_reads_as_the_general_path(
        second: int, fraction: str) -> None:
    """Every instant OTLP can carry, and the years past it (clamped)."""
    from datetime import UTC, datetime

    text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    for written in (text + "Z", f"{text}.{fraction}Z"):
        assert event_at_ns(_at(written)) == _general_ns(written)


def test_sub_microsecond_digits_and_the_edges_of_what_otlp_carries_read_exactly() -> None:
    assert event_at_ns(_at("2026-10-01T09:00:00.123456789Z")) == 1_790_845_200_123_456_789
    assert event_at_ns(_at("2026-10-01T09:00:00.5Z")) == 1_790_845_200_500_000_000
    assert event_at_ns(_at("1970-01-01T00:00:00.000000500Z")) == 0  # as the datetime path
    assert event_at_ns(_at("2262-04-11T23:47:16.854775807Z")) == MAX_TIME_NS
    assert event_at_ns(_at("2262-04-11T23:47:16.9Z")) == MAX_TIME_NS  # clamped
    assert event_at_ns(_at("2262-04-11T23:47:17.5Z")) == MAX_TIME_NS
    assert event_at_ns(_at("9999-12-31T23:59:59Z")) == MAX_TIME_NS
    assert event_at_ns(_at("2026-13-01T09:00:00.5Z")) == 0  # no such month
    for not_a_fraction in ("1_2", " 12", "+12", "1\u06632"):  # int() would read them
        assert event_at_ns(_at(f"2026-10-01T09:00:00.{not_a_fraction}Z")) == 0


# -- span ids ----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["run", "step", "model"]) | st.text(max_size=6), st.text(max_size=40))
def test_a_span_id_from_its_kinds_hashed_prefix_equals_hashing_the_whole_text(
        kind: str, name: str) -> None:
    """Asked twice, as every kind's prefix is shared by all its ids."""
    text = (b"agentrt/span\x00" + kind.encode("utf-8", "surrogatepass") + b"\x00"
            + name.encode("utf-8", "surrogatepass"))
    expected = int.from_bytes(hashlib.sha256(text).digest()[:8], "big") or 1
    assert span_id(kind, name) == expected
    assert span_id(kind, name) == expected
