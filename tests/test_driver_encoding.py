"""The loop's fast encoder writes exactly the reference encoder's bytes."""

from __future__ import annotations

import json

import pytest
from _driver_kit import call, clock, limits, make
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.driver import AbortRun, FuncTool, ToolError, ToolResult
from agentrt.driver.jsonenc import encode
from agentrt.driver.stored import stored_decision, stored_observation, stored_policy
from agentrt.errors import EncodeError
from agentrt.gojson import Raw, dumps
from agentrt.records import Decision, Observation, PolicyDecision
from agentrt.testing import static_tool

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


# -- lone surrogates and floats ------------------------------------------------------
#
# ``st.text()`` never draws a surrogate (Hypothesis leaves out category Cs by
# default), so the property above never sends orjson a string it refuses. Here
# the text includes them: orjson refuses a lone surrogate and ``encode`` falls
# back to the reference encoder, which writes U+FFFD as Go does.

ANY_CHAR = st.one_of(st.characters(exclude_categories=()), st.characters(categories=["Cs"]))
SURROGATE_TEXT = st.text(alphabet=ANY_CHAR, max_size=12)
#: Text that certainly holds a lone surrogate, somewhere among any other characters.
WITH_SURROGATE = st.tuples(SURROGATE_TEXT, st.characters(categories=["Cs"]),
                           SURROGATE_TEXT).map("".join)
SURROGATE_VALUE = st.recursive(
    st.one_of(SURROGATE_TEXT, st.integers(-(2**70), 2**70), st.booleans(), st.none(), RAW),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(SURROGATE_TEXT, inner, max_size=4)),
    max_leaves=12)
LONE = "x\ud800<\udfff>&\u2028"  # two lone surrogates among characters Go escapes


def _floats(value):
    """Whether decoded JSON holds a float anywhere."""
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_floats(v) for v in value.values())
    if isinstance(value, list):
        return any(_floats(v) for v in value)
    return False


@settings(max_examples=400, deadline=None)
@given(SURROGATE_VALUE)
def test_the_fast_encoder_matches_the_reference_encoder_on_lone_surrogates(value):
    out = encode(value)
    assert out == dumps(value)
    out.decode("utf-8")  # strict: no surrogate ever reaches the bytes


@settings(max_examples=200, deadline=None)
@given(WITH_SURROGATE, WITH_SURROGATE)
def test_a_lone_surrogate_is_written_as_the_replacement_character(key, text):
    out = encode({key: [text]})
    assert out == dumps({key: [text]})
    fix = {ord(c): "\ufffd" for c in key + text if 0xD800 <= ord(c) <= 0xDFFF}
    assert json.loads(out) == {key.translate(fix): [text.translate(fix)]}


def test_lone_surrogates_in_keys_and_values_are_escaped_as_go_does():
    value = {"s": "a\ud800b", "\udfff": ["\ud83d\ude00", Raw(b'"<\xe2\x80\xa8>"')]}
    expected = b'{"s":"a\\ufffdb","\\ufffd":["\\ufffd\\ufffd","\\u003c\\u2028\\u003e"]}'
    assert encode(value) == dumps(value) == expected


@settings(max_examples=200, deadline=None)
@given(WITH_SURROGATE, WITH_SURROGATE, RAW, st.booleans())
def test_the_stored_form_is_what_a_reload_decodes_with_lone_surrogates(text, other, raw, flag):
    d = Decision("tool_call", text, raw.data, other, raw.data, text, other, other, text, flag)
    assert encode(d.to_json()) == dumps(d.to_json())
    assert stored_decision(d) == Decision.from_json(dumps(d.to_json()))
    p = PolicyDecision(text, other, text, raw.data, raw.data)
    assert encode(p.to_json()) == dumps(p.to_json())
    assert stored_policy(p) == PolicyDecision.from_json(dumps(p.to_json()))
    o = Observation(text, raw.data, other, text)
    assert encode(o.to_json()) == dumps(o.to_json())
    assert stored_observation(o) == Observation.from_json(dumps(o.to_json()))


def _events(store, run_id):
    return {e.type: e for e in store.list_events(run_id)}


def test_lone_surrogates_a_tool_and_the_agent_return_are_recorded_as_the_reference_writes_them():
    tools = [static_tool("read", summary=LONE),
             static_tool("done", summary="fin", terminal=True)]
    script = [call("read", b"{}", reason=LONE), call("done", b"{}")]
    d, store, _, _ = make(script=script, tools=tools, now=clock(), monotonic=lambda: 0.0)
    run = d.start("goal", limits(), run_id="r")
    assert (run.status, run.reason) == ("COMPLETED", "goal_completed")
    events = store.list_events("r")
    decided = [e for e in events if e.type == "step.decided"][0]
    assert decided.payload == dumps(call("read", b"{}", reason=LONE).to_json())
    assert decided.payload == (
        b'{"kind":"tool_call","tool":"read","args":{},'
        b'"reason":"x\\ufffd\\u003c\\ufffd\\u003e\\u0026\\u2028"}')
    finished = [e for e in events if e.type == "step.tool_finished"][0]
    step = store.list_steps("r")[0]
    assert finished.payload == dumps({"content_hash": step.observation.content_hash,
                                      "duration_ms": 0, "summary": LONE, "tool": "read"})
    assert step.observation.summary == "x\ufffd<\ufffd>&\u2028"
    assert step.decision.reason == "x\ufffd<\ufffd>&\u2028"


def test_a_lone_surrogate_in_a_tool_error_is_recorded_as_the_reference_writes_it():
    def fail(_call):
        raise ToolError(LONE)

    tools = [FuncTool("t", fail), static_tool("done", terminal=True)]
    d, store, _, _ = make(script=[call("t", b"{}"), call("done", b"{}")], tools=tools,
                          now=clock(), monotonic=lambda: 0.0)
    assert d.start("goal", limits(), run_id="r").status == "COMPLETED"
    step = store.list_steps("r")[0]
    assert step.status == "failed"
    assert step.observation.content == dumps(
        {"error": LONE, "failure": "error", "tool": "t"})
    events = _events(store, "r")
    assert events["step.failed"].payload == dumps({
        "content_hash": step.observation.content_hash, "detail": "t error: " + LONE,
        "observation": "tool_error"})
    assert b"\\ufffd" in events["step.failed"].payload


# A float is where the two encoders part: orjson writes it (NaN as null) while
# the reference encoder refuses it, as Go's records hold none. ``encode``'s
# docstring says so. So no float reaches it: the loop refuses one where a
# decision or a tool result must hold text, and an AbortRun detail is its str().

def _no_floats_recorded(store, run_id):
    for e in store.list_events(run_id):
        assert not _floats(json.loads(e.payload)), (e.type, e.payload)
    for step in store.list_steps(run_id):
        if step.observation is not None:
            assert not _floats(json.loads(step.observation.content)), step.observation


def test_a_tool_aborting_with_a_float_detail_writes_no_float_into_records():
    def abort(_call):
        raise AbortRun(1.5)  # type: ignore[arg-type]

    d, store, _, _ = make(script=[call("t", b"{}")], tools=[FuncTool("t", abort)],
                          now=clock(), monotonic=lambda: 0.0)
    run = d.start("goal", limits(), run_id="r")
    assert (run.status, run.reason, run.reason_detail) == ("FAILED", "tool_abort", "1.5")
    _no_floats_recorded(store, "r")


def test_a_decision_with_a_float_where_text_belongs_fails_the_run_as_an_agent_error():
    d, store, _, _ = make(script=[Decision.fail(2.5)], now=clock())  # type: ignore[arg-type]
    run = d.start("goal", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "agent_error")
    assert "decision has a float message, not a str" in run.reason_detail
    _no_floats_recorded(store, "r")


def test_a_tool_result_with_a_float_summary_is_a_tool_error_and_the_run_goes_on():
    def tool(_call):
        return ToolResult(b'{"ok":true}', 0.5)  # type: ignore[arg-type]

    script = [call("t", b"{}"), Decision.complete(b"{}")]
    d, store, _, _ = make(script=script, tools=[FuncTool("t", tool)], now=clock(),
                          monotonic=lambda: 0.0)
    run = d.start("goal", limits(), run_id="r")
    assert run.status == "COMPLETED"
    first = store.list_steps("r")[0].observation
    assert first is not None and first.kind == "tool_error"
    assert "summary is a float, not a str" in first.summary
    _no_floats_recorded(store, "r")


# A lone surrogate that reaches a plain column rather than a JSON payload is
# stored as U+FFFD too (docs/architecture.md); binding it as it is would raise
# UnicodeEncodeError half-way through a transition.

def test_a_lone_surrogate_in_the_goal_is_recorded_as_the_replacement_character():
    d, store, _, _ = make(script=[Decision.complete(b"{}")], now=clock())
    run = d.start(LONE, limits(), run_id="r")
    assert run.status == "COMPLETED"
    assert store.get_run("r").goal == "x\ufffd<\ufffd>&\u2028"
    created = _events(store, "r")["run.created"]
    assert json.loads(created.payload)["goal"] == "x\ufffd<\ufffd>&\u2028"


@pytest.mark.parametrize("how", ["fail_decision", "tool_abort"])
def test_a_lone_surrogate_in_the_ending_detail_ends_the_run(how):
    def abort(_call):
        raise AbortRun(LONE)

    script = [Decision.fail(LONE)] if how == "fail_decision" else [call("t", b"{}")]
    d, store, _, _ = make(script=script, tools=[FuncTool("t", abort)], now=clock(),
                          monotonic=lambda: 0.0)
    run = d.start("goal", limits(), run_id="r")
    assert run.status == "FAILED"
    assert run.reason_detail == "x\ufffd<\ufffd>&\u2028"
    finished = _events(store, "r")["run.finished"]
    assert json.loads(finished.payload)["detail"] == "x\ufffd<\ufffd>&\u2028"
