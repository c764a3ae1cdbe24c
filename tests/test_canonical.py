"""Canonical JSON, the consumer-JSON boundary check, and every hash's golden vector."""

import hashlib
import json
import re
import tracemalloc
from datetime import timedelta

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import agentrt
from agentrt import canonical_json, check_json, content_hash, policy_json
from agentrt.gojson import STRING_PATTERN, Raw, compact, dumps, encode_string, raw_members

NULL_HASH = "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", NULL_HASH),
        (b"  ", NULL_HASH),
        (b"null", NULL_HASH),
        (b"1.0", "d0ff5974b6aa52cf562bea5921840c032a860a91a3512f7fe8f768f6bbe005f6"),
        (b"{}", "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"),
        (b'"<script>&amp;</script>"',
         "82f277f8f0331a2f51b10e04e886175451d160438aef59587053bfbcea064dd7"),
        (b'{"a":2,"a":1}', "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"),
        (b'{"a":1} trailing',
         "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"),
        (b'"\\ud800"', hashlib.sha256('"\ufffd"'.encode()).hexdigest()),
    ],
)
def test_content_hash_matches_the_reference_golden_vectors(raw, expected):
    assert content_hash(raw) == expected


def test_content_hash_of_undecodable_bytes_is_the_hash_of_the_bytes():
    assert content_hash(b"{nope") == hashlib.sha256(b"{nope").hexdigest()


def test_canonical_json_sorts_keys_keeps_number_literals_and_escapes_html():
    got = canonical_json(b' {"b": 1, "a": [1.0, -0, 1E+2, "<\xe2\x80\xa8>"]} ')
    assert got == b'{"a":[1.0,-0,1E+2,"\\u003c\\u2028\\u003e"],"b":1}'


def test_canonical_json_refuses_what_would_hash_lossily():
    with pytest.raises(ValueError, match="duplicate key"):
        canonical_json(b'{"a":1,"a":2}')
    with pytest.raises(ValueError, match="not valid JSON"):
        canonical_json(b'{"a":1} trailing')
    assert canonical_json(b"   ") == b"null"


def test_canonical_keys_sort_by_utf8_bytes_not_utf16_units():
    # U+FF61 sorts before U+1F600 in UTF-8 byte order but after it in UTF-16 units.
    got = canonical_json('{"\U0001f600":1,"\uff61":2}'.encode())
    assert got == '{"\uff61":2,"\U0001f600":1}'.encode()


def test_policy_form_is_the_canonical_traversal_without_html_escaping():
    assert policy_json(b'{"b":"<&>", "a":1.50}') == b'{"a":1.50,"b":"<&>"}'
    assert policy_json(b'{"a":1,"b":"x"}') == policy_json(b'{ "b" : "x", "a" : 1 }')


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"[" * 257 + b"]" * 257, "nested deeper than 256 levels"),
        (b'"\xff"', "not valid UTF-8"),
        (b"{", "not valid JSON"),
        (b"1 2", "not valid JSON"),
        (b"NaN", "not valid JSON"),
        (b'"\\ud800"', "unpaired surrogate \\ud800"),
        (b'{"k":1,"k":2}', 'duplicate key "k"'),
        (b"1" * 10001, "number 111111111111111111111111... is longer than 10000 characters"),
        (b"1e10001", "number 1e10001 has an exponent beyond ±10000"),
    ],
)
def test_check_json_refuses_in_the_reference_order(raw, problem):
    assert check_json(raw) == problem


def test_check_json_accepts_deep_but_bounded_and_brackets_inside_strings():
    assert check_json(b"[" * 256 + b"]" * 256) is None
    assert check_json(b'["' + b"[" * 1000 + b'"]') is None
    assert check_json(b'"\\ud83d\\ude00"') is None
    assert check_json(b"1e10000") is None


def test_approval_hash_golden():
    spec = agentrt.ToolSpec("push", "push <main> & tag", b'{"type":"object"}',
                            "remote_mutation", timedelta(seconds=30))
    req = agentrt.ToolRequest("r1", "s1", spec, b'{"n":7,"ref":"refs/heads/main"}')
    got = agentrt.approval_hash("remote_mutation", b'{"tool":"push","args":{"n":7}}',
                                b'{"title":"Publish <PR> & tag","lines":1.0}', req)
    assert got == "175bcfc7a7e3cdab6b98d7b50caf9f2a8e59d5208211b97de39a4b027c7fa0b2"


def test_go_encoder_escapes_like_encoding_json():
    assert encode_string('a"\\\b\f\n\r\t\x01\x7f<>&\u2028é') == (
        '"a\\"\\\\\\b\\f\\n\\r\\t\\u0001\x7f\\u003c\\u003e\\u0026\\u2028é"'
    )
    assert encode_string("<>&\u2029", html=False) == '"<>&\\u2029"'
    assert dumps({"z": Raw(b' { "a" : "<" } '), "a": [1, True, None]}) == (
        b'{"z":{"a":"\\u003c"},"a":[1,true,null]}'
    )
    assert compact(b'{ "a b" : [ 1 , "x\\" y" ] }') == b'{"a b":[1,"x\\" y"]}'


TEXTBOOK_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40).map(lambda b: bytes(b'"\\ a\n{'[x % 6] for x in b)))
def test_the_string_pattern_finds_what_the_textbook_pattern_finds(data):
    """Unrolled and possessive, it must still match exactly the same strings,
    in valid JSON or not (a damaged payload is scanned too)."""
    assert re.compile(STRING_PATTERN, re.DOTALL).findall(data) == TEXTBOOK_STRING.findall(data)


def test_compacting_a_long_string_takes_memory_in_proportion_to_it():
    """The textbook string pattern kept backtracking state per byte: 130x the
    input, so a 27 MB tool result took 3.6 GB."""
    data = json.dumps({"text": 'lorem ipsum \\" dolor ' * 100_000}, indent=1).encode()
    tracemalloc.start()
    try:
        out = compact(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out == json.dumps(json.loads(data), separators=(",", ":")).encode()
    assert peak < 4 * len(data)


def test_raw_members_keep_each_value_byte_exact():
    got = raw_members(b' {"a": {"x" : 1.50}, "b": "s", "a": [1] } ')
    assert got == {"a": b"[1]", "b": b'"s"'}
    with pytest.raises(ValueError):
        raw_members(b"[1]")


def _nested(depth: int, inner: bytes = b"") -> bytes:
    return b'{"a":' * (depth - 1) + b"[" + inner + b"]" + b"}" * (depth - 1)


@pytest.mark.parametrize("depth", [254, 255, 256])
@pytest.mark.parametrize("inner", [b"", b"1"])
def test_json_nested_up_to_256_levels_has_the_strict_paths_forms(depth, inner):
    """orjson's encoder stops at 255 levels (a TypeError); the limit is 256."""
    from agentrt.canonical import (
        _strict_canonical,
        canonical_text,
        check_and_forms,
        check_and_hash,
    )
    for data in (b"[" * depth + b"]" * depth, _nested(depth, inner)):
        assert check_json(data) is None
        want = _strict_canonical(data, True)
        assert canonical_json(data) == want == canonical_text(data)
        assert policy_json(data) == _strict_canonical(data, False)
        assert content_hash(data) == hashlib.sha256(want).hexdigest()
        assert check_and_hash(data) == (None, hashlib.sha256(want).hexdigest())
        assert check_and_forms(data) == (None, _strict_canonical(data, False), want)


def test_a_run_whose_tool_result_and_arguments_are_nested_256_levels_completes():
    from _driver_kit import limits, make

    from agentrt.driver import FuncTool, ToolResult
    from agentrt.records import Decision

    deep = b"[" * 256 + b"]" * 256
    args = b'{"a":' + b"[" * 255 + b"]" * 255 + b"}"
    ran: list[bytes] = []

    def fetch(call):
        ran.append(call.args)
        return ToolResult(deep, "deep")

    d, store, _, _ = make(script=[Decision.tool_call("fetch", args), Decision.complete()],
                          tools=[FuncTool("fetch", fetch, side_effect="local_mutation")])
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("COMPLETED", "goal_completed")
    assert len(ran) == 1
    assert [s.status for s in store.list_steps("r")][0] == "done"


def test_keys_that_differ_only_by_lone_surrogates_keep_the_last_value_written():
    """Go decodes each key to U+FFFD as it reads it, so the last member wins
    (spec 4.1), not the last value of the first spelling."""
    from agentrt.canonical import canonical_text

    data = b'{"\\ud800":1,"\\ud801":2,"\\ud800":3}'
    assert canonical_text(data) == '{"\ufffd":3}'.encode()
    assert content_hash(data) == hashlib.sha256('{"\ufffd":3}'.encode()).hexdigest()
    assert policy_json(b'[{"\\udc00":[1],"a":0,"\\udc01":{"\\ud800":1,"\\ud800":2}}]') == \
        '[{"a":0,"\ufffd":{"\ufffd":2}}]'.encode()
