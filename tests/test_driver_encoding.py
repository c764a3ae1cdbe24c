"""The loop's fast encoder writes exactly the reference encoder's bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.driver.jsonenc import encode
from agentrt.driver.stored import stored_decision, stored_observation, stored_policy
from agentrt.errors import EncodeError
from agentrt.gojson import Raw, dumps
from agentrt.records import Decision, Observation, PolicyDecision

RAW = st.sampled_from([b'{"a": 1}', b' [1, 2.50, "<&>"] ', b'"\xe2\x80\xa8"', b"{}", b"  ",
                       b'{"b":{"c":[true,null]}}', b"-0", b"1E+2"]).map(Raw)
SCALAR = st.one_of(st.text(), st.integers(-(2**70), 2**70), st.booleans(), st.none(), RAW)
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(), inner, max_size=4)), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(VALUE)
def test_the_fast_encoder_matches_the_reference_encoder(value):
    assert encode(value) == dumps(value)


def test_raw_json_the_reference_refuses_is_an_encode_error():
    with pytest.raises(EncodeError):
        encode({"a": Raw(b"{nope")})
    with pytest.raises(EncodeError):
        encode({"a": object()})


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(), RAW, st.booleans())
def test_the_stored_form_is_what_a_reload_decodes(text, other, raw, flag):
    d = Decision("tool_call", text, raw.data, other, raw.data, text, other, other, text, flag)
    assert stored_decision(d) == Decision.from_json(dumps(d.to_json()))
    p = PolicyDecision(text, other, text, raw.data, raw.data)
    assert stored_policy(p) == PolicyDecision.from_json(dumps(p.to_json()))
    o = Observation(text, raw.data, other, text)
    assert stored_observation(o) == Observation.from_json(dumps(o.to_json()))


def test_go_escapes_in_strings_and_raw_json_side_by_side():
    value = {"s": "<a&b>\u2028\u2029\u2014", "r": Raw(b' {"x": "<\xe2\x80\xa9>"} '),
             "l": ["&", Raw(b'"\xe2\x80\x94"')]}
    assert encode(value) == dumps(value)
    assert b"<" not in encode(value) and b"\xe2\x80\xa8" not in encode(value)
