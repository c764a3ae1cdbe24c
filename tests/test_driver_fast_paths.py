"""The loop's shortcuts give the answers of the functions they stand for.

Each pins one shortcut taken for a step's cost: the argument and result checks
that also give the canonical forms from one parse, the stored time built from
a remembered second, and the last reading formatted remembered by identity.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st
from test_hashing import noisy

from agentrt.canonical import (
    canonical_text,
    check_and_forms,
    check_and_hash,
    check_json,
    content_hash,
    policy_json,
)
from agentrt.driver.stored import stored_raw
from agentrt.timefmt import format_time


@settings(max_examples=600, deadline=None)
@given(noisy)
def test_check_and_hash_is_the_check_then_the_hash(data):
    problem = check_json(data)
    assert check_and_hash(data) == (problem, content_hash(data) if problem is None else "")


@settings(max_examples=600, deadline=None)
@given(noisy)
def test_check_and_forms_is_the_check_then_both_forms(data):
    problem = check_json(data)
    if problem is not None:
        assert check_and_forms(data) == (problem, b"", b"")
        return
    canonical = canonical_text(data)
    assert check_and_forms(data) == (problem, policy_json(data), canonical)
    # The loop check hashes the canonical form: the content hash, also of the
    # arguments as the step stores them (compacted and escaped).
    digest = hashlib.sha256(canonical).hexdigest()
    assert digest == content_hash(data) == content_hash(stored_raw(data) or b"{}")


def test_the_depth_limit_still_applies_to_long_texts():
    deep = b"[" * 257 + b"]" * 257
    assert check_and_hash(deep) == ("nested deeper than 256 levels", "")
    assert check_and_forms(deep) == ("nested deeper than 256 levels", b"", b"")
    assert check_json(b"[" * 256 + b"]" * 256) is None


def _iso(t: datetime) -> str:
    text = t.replace(tzinfo=None).isoformat()
    return (text.rstrip("0") if t.microsecond else text) + "Z"


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                    timezones=st.just(UTC)),
       st.lists(st.integers(min_value=-2_000_000, max_value=2_000_000), max_size=6))
def test_stored_times_within_one_second_and_across_are_the_iso_form(t, offsets):
    # Readings a few microseconds to seconds apart, formatted in turn: the second
    # remembered from one must not leak into the next.
    for us in [0, *offsets]:
        u = t + timedelta(microseconds=us)
        assert format_time(u) == _iso(u)
        assert format_time(u) == _iso(u)  # the same reading again


def test_the_last_reading_is_remembered_by_identity_only():
    a = datetime(2026, 10, 1, 9, 0, 5, 120000, tzinfo=UTC)
    b = datetime(2026, 10, 1, 9, 0, 5, 120000, tzinfo=timezone(timedelta(hours=2)))
    assert format_time(a) == "2026-10-01T09:00:05.12Z"
    assert format_time(b) == "2026-10-01T07:00:05.12Z"  # equal fields, another instant
    assert format_time(None) == ""
    assert format_time(a) == "2026-10-01T09:00:05.12Z"
