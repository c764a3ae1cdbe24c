"""Hashing properties: the canonical form is Go's encoding of the sorted value, and the
forms a hash or a policy sees do not depend on how a value was spelled or stored."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt import ToolSpec, canonical_json, check_json, content_hash, policy_json
from agentrt.gojson import compact, dumps, sorted_map

# JSON values without floats: a float's literal is kept as written, which a
# Python float cannot say.
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def go_sorted(value: Any) -> Any:
    """The value as Go holds it after decoding into any: maps sort their keys."""
    if isinstance(value, dict):
        return sorted_map({k: go_sorted(v) for k, v in value.items()})
    if isinstance(value, list):
        return [go_sorted(v) for v in value]
    return value


@settings(max_examples=150, deadline=None)
@given(values, st.sampled_from([None, 0, 2]))
def test_canonical_json_matches_encoding_json(value, indent):
    raw = json.dumps(value, indent=indent, ensure_ascii=False).encode()
    assert check_json(raw) is None
    assert canonical_json(raw) == dumps(go_sorted(value))
    assert content_hash(raw) == content_hash(canonical_json(raw))


@settings(max_examples=150, deadline=None)
@given(values)
def test_policy_form_is_the_same_from_raw_and_stored_bytes(value):
    raw = json.dumps(value, indent=1, ensure_ascii=True).encode()
    stored = compact(raw, html=True)  # what a RawMessage column holds
    assert policy_json(raw) == policy_json(stored)
    assert policy_json(raw) == dumps(go_sorted(value), html=False)
    assert canonical_json(raw) == canonical_json(stored)


def test_tool_spec_hash_is_of_its_canonical_json():
    pretty = ToolSpec("push", "push <main>", b'{ "type": "object",\n  "required": ["ref"] }',
                      "remote_mutation", timedelta(seconds=30))
    compact_spec = ToolSpec("push", "push <main>", b'{"required":["ref"],"type":"object"}',
                            "remote_mutation", timedelta(seconds=30))
    digest, text = pretty.spec_hash()
    assert (digest, text) == compact_spec.spec_hash()
    assert text == (b'{"description":"push \\u003cmain\\u003e","input_schema":{"required":'
                    b'["ref"],"type":"object"},"name":"push","side_effect":"remote_mutation",'
                    b'"timeout":30000000000}')
    assert content_hash(text) == digest


def test_changed_tool_spec_is_another_hash():
    base = ToolSpec("push", "push it", b'{"type":"object"}', "remote_mutation",
                    timedelta(seconds=30))
    changed = [
        ToolSpec("push", "push it!", b'{"type":"object"}', "remote_mutation",
                 timedelta(seconds=30)),
        ToolSpec("push", "push it", b'{"type":"object","x":1}', "remote_mutation",
                 timedelta(seconds=30)),
        ToolSpec("push", "push it", b'{"type":"object"}', "destructive", timedelta(seconds=30)),
        ToolSpec("push", "push it", b'{"type":"object"}', "remote_mutation",
                 timedelta(seconds=31)),
        ToolSpec("push", "push it", b'{"type":"object"}', "remote_mutation",
                 timedelta(seconds=30), terminal=True),
    ]
    hashes = {base.spec_hash()[0]} | {spec.spec_hash()[0] for spec in changed}
    assert len(hashes) == 1 + len(changed)


def test_keys_equal_after_replacement_collapse_and_never_fail_the_hash():
    # "\ud800" decodes to U+FFFD: the two keys become one, the last winning, as in Go.
    raw = b'{"\\ud800":1,"\\ufffd":{}}'
    assert content_hash(raw) == content_hash('{"\ufffd":{}}'.encode())
    assert check_json(raw) == "unpaired surrogate \\ud800"


def test_approval_json_times_are_rfc3339_and_created_at_is_never_empty():
    from datetime import UTC, datetime

    from agentrt import Approval

    approval = Approval("a", "r", "s", "k", b"{}", b"{}", None, "h", "pending",
                        created_at=datetime(2026, 10, 1, 9, 0, 0, 500000, tzinfo=UTC))
    out = approval.to_json()
    assert out["created_at"] == "2026-10-01T09:00:00.5Z"
    assert "expires_at" not in out and "decided_at" not in out
    approval.created_at = None  # a stored time that did not decode
    assert approval.to_json()["created_at"] == "0001-01-01T00:00:00Z"


tricky_text = st.text(
    alphabet=st.sampled_from(list("ab<>&\"\\/\x00\x01\x1f\x7f\u2028\u2029é—€\U0001f600\ufffd")),
    max_size=8) | st.text(max_size=8)
plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(plain_values, st.booleans())
def test_go_encoding_fast_path_is_the_encoder(value, html):
    from agentrt.gojson import _encode

    out: list[str] = []
    _encode(value, out, html)
    assert dumps(value, html=html) == "".join(out).encode("utf-8", "surrogateescape")


def test_go_encoding_keeps_refusing_what_go_would_not_write():
    import pytest

    from agentrt.events import EventType
    from agentrt.gojson import Raw

    with pytest.raises(TypeError):
        dumps({"cost": 1.5})
    assert dumps({"type": EventType.RUN_STARTED, "n": True}) == b'{"type":"run.started","n":true}'
    assert dumps({"raw": Raw(b' { "a" : "<" } ')}) == b'{"raw":{"a":"\\u003c"}}'
    assert dumps("\ud800") == b'"\\ufffd"'  # a lone surrogate, as Go writes it
    assert dumps(2**70) == b"1180591620717411303424"


# -- the fast paths give the strict decoder's answers -------------------------

def _number() -> st.SearchStrategy[str]:
    return st.sampled_from([
        "0", "-0", "7", "-12", "1.0", "1.50", "-0.0", "1e5", "1E+2", "2e-3", "1e400",
        "1e-99999", "1e00000000002", "1e10000", "1e10001", "18446744073709551615",
        "18446744073709551616", "-9223372036854775809", "123456789012345678901234567890",
    ])


def _string() -> st.SearchStrategy[str]:
    plain = st.text(max_size=8).map(lambda s: json.dumps(s, ensure_ascii=False))
    tricky = st.sampled_from([
        '"a:b"', '"\\u003a"', '"2026-01-05T10:00:00Z"', '"-0"', '"\\ud800"',
        '"\\ud83d\\ude00"', '"<&>"', '"\u2028"', '"\\\\u"', '"tab\\t"', '"\\/"', '"1e99999"',
    ])
    return plain | tricky


def _text(depth: int = 0) -> st.SearchStrategy[str]:
    ws = st.sampled_from(["", "", " ", "\n", "\t "])
    leaf = st.sampled_from(["null", "true", "false"]) | _number() | _string()
    if depth >= 3:
        return leaf
    inner = _text(depth + 1)
    array = st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]")
    members = st.lists(st.tuples(_string(), inner), max_size=3)
    obj = st.tuples(members, st.booleans(), ws).map(
        lambda t: "{" + ",".join(f"{k}{t[2]}:{t[2]}{v}"
                                 for k, v in (t[0] + t[0][:1] if t[1] else t[0])) + "}")
    return st.tuples(ws, leaf | array | obj, ws).map("".join)


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (ValueError, RecursionError) as exc:
        return type(exc)


json_texts = _text().map(lambda s: s.encode("utf-8", "surrogatepass"))
noisy = st.one_of(json_texts, st.binary(max_size=24),
                  st.tuples(json_texts, st.binary(max_size=2)).map(b"".join))


@settings(max_examples=600, deadline=None)
@given(noisy)
def test_check_json_fast_path_gives_the_strict_answer(data):
    from agentrt.canonical import MAX_JSON_DEPTH, _depth_exceeds, _strict_check

    if not _depth_exceeds(data, MAX_JSON_DEPTH):
        assert check_json(data) == _strict_check(data)


@settings(max_examples=600, deadline=None)
@given(noisy, st.booleans())
def test_canonical_fast_path_gives_the_strict_form(data, html):
    from agentrt.canonical import _canonical, _strict_canonical

    assert _outcome(_canonical, data, html) == _outcome(_strict_canonical, data, html)


def test_check_json_fast_path_leaves_every_refusal_to_the_strict_check():
    for data, problem in [
        (b'{"a":1,"a":2}', 'duplicate key "a"'),
        (b'{"a":"x:y","a":1}', 'duplicate key "a"'),
        (b'{"\\u003a":1,"\\u003a":2}', 'duplicate key ":"'),
        (b'{"t":"12:30","t":1}', 'duplicate key "t"'),
        (b"1e99999", "number 1e99999 has an exponent beyond ±10000"),
        (b"[1e-10001]", "number 1e-10001 has an exponent beyond ±10000"),
        (b'"\\ud800"', "unpaired surrogate \\ud800"),
        (b'"\xed\xa0\x80"', "not valid UTF-8"),
    ]:
        assert check_json(data) == problem
    assert check_json(b'{"url":"https://x","t":"12:30:00"}') is None
