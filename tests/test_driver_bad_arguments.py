"""Bad input gets one clear sentence and changes nothing.

A wrong argument to the driver's public API (Limits, Driver, FuncTool,
ModelConfig, start/resume, the operator's calls) is refused at the call that
received it, naming the argument, before anything is written. A wrong type
returned by the consumer's own objects inside the loop (a tool's content, an
agent's decision, a policy's decision, a model's usage) becomes the outcome
the loop already records for that kind of mistake: the run never stays
RUNNING with a step half-way.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from _driver_kit import call, fixture_tools, limits, make, types

from agentrt.driver import (
    AgentFunc,
    ConfigError,
    DefaultPolicy,
    Driver,
    FuncTool,
    ModelConfig,
    ModelRequest,
    ModelResponse,
    Operator,
    PolicyFunc,
    Price,
    SideEffectPolicy,
    ToolResult,
    ToolUse,
    approve,
    approve_shown,
    cancel,
    reject,
    reject_shown,
)
from agentrt.records import Decision, Limits, PolicyDecision, ToolSpec, Usage
from agentrt.store import open_existing, open_store
from agentrt.testing import ModelToolAgent, ScriptedAgent, ScriptedModel, rate_limited

MAX_INT64 = (1 << 63) - 1
#: The longest duration int64 nanoseconds hold, as a timedelta (whole microseconds).
MAX_DURATION = timedelta(microseconds=MAX_INT64 // 1000)


def nothing_written(store) -> None:
    assert store.list_runs() == []
    assert store.chain_head() == (0, "")


def rd(c):
    return ToolResult(b'{"lines": 42}', "read 42 lines")


def read_tool(**kw) -> FuncTool:
    kw.setdefault("timeout", 5)
    return FuncTool("read", rd, **kw)


def driver(store=None, **kw) -> Driver:
    store = store if store is not None else open_store(":memory:")
    agent = kw.pop("agent", ScriptedAgent([call("read"), Decision.complete()]))
    policy = kw.pop("policy", DefaultPolicy())
    tools = kw.pop("tools", [read_tool()])
    return Driver(store, agent, policy, tools, **kw)


# ---------------------------------------------------------------------------
# 1. Limits, refused at start.

@pytest.mark.parametrize("field", [
    "max_steps", "max_consecutive_tool_failures", "loop_threshold", "max_model_calls",
    "max_output_tokens_per_call", "max_total_tokens", "max_estimated_cost_micros",
])
def test_a_bool_count_in_limits_is_refused_at_start_so_the_run_stays_readable(field):
    d = driver()
    with pytest.raises(ConfigError) as info:
        d.start("g", limits(**{field: True}), run_id="r")
    assert str(info.value) == f"agentrt: limits: {field} is a bool (True), not an int"
    nothing_written(d.store)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("max_steps", None, "limits: max_steps is None, not an int"),
    ("max_steps", "10", "limits: max_steps is a str ('10'), not an int"),
    ("max_steps", 2.5, "limits: max_steps is a float (2.5), not an int"),
    ("max_estimated_cost_micros", 1.5, "limits: max_estimated_cost_micros is a float (1.5)"),
    ("max_steps", 2**63, "limits: max_steps is 9223372036854775808, above 2**63-1"),
    ("max_total_tokens", 2**70, "limits: max_total_tokens is 1180591620717411303424, above"),
    ("max_model_calls", -(2**63) - 1, "limits: max_model_calls is -9223372036854775809, below"),
    ("max_active_time", 5.0, "limits: max_active_time is a float (5.0), not a timedelta"),
    ("max_active_time", None, "limits: max_active_time is None, not a timedelta"),
    ("approval_ttl", timedelta.max, "limits: approval_ttl is 999999999 days, 23:59:59.999999, "
                                    "beyond what a duration holds"),
    ("grant_ttl", timedelta.max, "limits: grant_ttl is 999999999 days"),
    ("max_elapsed_time", timedelta.min, "limits: max_elapsed_time is -999999999 days"),
    ("max_active_time", MAX_DURATION + timedelta(microseconds=1),
     "limits: max_active_time is 106751 days, 23:47:16.854776, beyond what a duration holds"),
])
def test_mistyped_or_unholdable_limits_are_refused_naming_the_field(field, value, says):
    d = driver()
    with pytest.raises(ConfigError, match="^agentrt: " + says.replace("(", r"\(")
                       .replace(")", r"\)").replace("*", r"\*")):
        d.start("g", limits(**{field: value}), run_id="r")
    nothing_written(d.store)


@pytest.mark.parametrize("value", [{"max_steps": 10}, 5, "default"])
def test_limits_that_are_not_a_limits_are_refused(value):
    d = driver()
    with pytest.raises(ConfigError, match="^agentrt: limits is .*, not a Limits$"):
        d.start("g", value, run_id="r")
    nothing_written(d.store)


def test_a_negative_optional_limit_is_unlimited_as_in_the_reference():
    # core.md: only max_steps, max_consecutive_tool_failures and loop_threshold must
    # be positive; the others are set only when > 0 (0 = unlimited).
    d = driver()
    run = d.start("g", limits(max_model_calls=-1, max_total_tokens=-5,
                              approval_ttl=timedelta(seconds=-1)), run_id="r")
    assert run.status == "COMPLETED"
    assert d.store.get_run("r").limits.max_model_calls == -1


def push_driver(store=None, **kw) -> Driver:
    agent = ScriptedAgent([call("push"), Decision.complete()])
    return driver(store, agent=agent,
                  tools=[FuncTool("push", rd, side_effect="remote_mutation", timeout=5)], **kw)


def test_the_longest_approval_and_grant_ttls_pause_and_resume_without_overflow():
    d = push_driver()
    run = d.start("g", limits(approval_ttl=MAX_DURATION, grant_ttl=MAX_DURATION), run_id="r")
    assert run.status == "WAITING_FOR_APPROVAL"
    a = d.store.list_approvals("r")[0]
    assert a.expires_at is not None and a.expires_at.year > 2200
    d.approve("r", a.id, "op")
    assert d.resume("r").status == "COMPLETED"


# ---------------------------------------------------------------------------
# 2. Driver(...), FuncTool(...), ModelConfig(...): refused at construction.

def test_a_store_that_is_a_path_is_refused_at_construction():
    with pytest.raises(ConfigError, match=r"^agentrt: store is a str \('x.db'\), not a Store; "
                                          r"open one with open_store\(path\)$"):
        driver(store="x.db")


def test_a_closed_store_is_refused_at_construction(tmp_path):
    store = open_store(str(tmp_path / "runs.db"))
    store.close()
    with pytest.raises(ConfigError, match="cannot be read .*; is it closed"):
        driver(store=store)


def test_a_read_only_store_is_refused_at_construction(tmp_path):
    path = str(tmp_path / "runs.db")
    open_store(path).close()
    with pytest.raises(ConfigError, match="was opened read-only and a driver writes every step"):
        driver(store=open_existing(path))


@pytest.mark.parametrize(("agent", "says"), [
    ("agent", "agent is a str ('agent'), not an Agent (an object with a decide(step) method)"),
    (lambda step: Decision.complete(), "agent is a function, not an Agent (an object with a "
                                       "decide(step) method); wrap a function in AgentFunc"),
    (object(), "agent is an object, not an Agent (an object with a decide(step) method)"),
])
def test_an_agent_without_decide_is_refused_at_construction(agent, says):
    with pytest.raises(ConfigError) as info:
        driver(agent=agent)
    assert str(info.value) == "agentrt: " + says


@pytest.mark.parametrize(("policy", "says"), [
    ("allow", "policy is a str ('allow'), not a Policy"),
    (lambda r, v: PolicyDecision.allow(), "policy is a function, not a Policy"),
    (ScriptedAgent([]), "policy is a ScriptedAgent, not a Policy"),
])
def test_a_policy_without_evaluate_is_refused_at_construction(policy, says):
    with pytest.raises(ConfigError) as info:
        driver(policy=policy)
    assert str(info.value).startswith("agentrt: " + says)
    assert "evaluate(request, view)" in str(info.value)
    if callable(policy):
        assert str(info.value).endswith("wrap a function in PolicyFunc")


@pytest.mark.parametrize(("tools", "says"), [
    (None, "tools is None, not a list of tools"),
    (rd, "tools is a function, not a list of tools"),
    ("read", "tools is a str ('read'), not a list of tools"),
    (FuncTool("read", rd), "tools is a FuncTool, not a list of tools; pass a list of tools"),
    (["read"], "tools[0] is a str ('read'), not a Tool"),
    ([None], "tools[0] is None, not a Tool"),
    ([read_tool(), rd], "tools[1] is a function, not a Tool (an object with spec() and "
                        "call(call) methods); wrap a function in FuncTool"),
])
def test_tools_that_are_not_tools_are_refused_at_construction(tools, says):
    with pytest.raises(ConfigError) as info:
        driver(tools=tools)
    assert str(info.value).startswith("agentrt: " + says)


def custom_tool(**kw):
    fields = dict(name="t", description="", input_schema=b'{"type":"object"}',
                  side_effect="read_only", timeout=timedelta(seconds=1))
    fields.update(kw)

    class T:
        def spec(self):
            return ToolSpec(**fields)

        def call(self, c):
            return None

    return T()


@pytest.mark.parametrize(("tool", "says"), [
    (custom_tool(name=5), "tool name is an int (5), not a str"),
    (custom_tool(name="a\ud800"), "tool name holds a lone surrogate (U+D800)"),
    (custom_tool(description=None), 'tool "t": description is None, not a str'),
    (custom_tool(input_schema='{"type":"object"}'), 'tool "t": input_schema is a str'),
    (custom_tool(input_schema={"type": "object"}), 'tool "t": input_schema is a dict'),
    (custom_tool(side_effect=None), 'tool "t": side_effect is None, not a str'),
    (custom_tool(timeout=5.0), 'tool "t": timeout is a float (5.0), not a timedelta'),
    (custom_tool(timeout=timedelta.max), 'tool "t": timeout is 999999999 days, 23:59:59.999999, '
                                         "longer than 365 days"),
    (custom_tool(terminal="no"), "tool \"t\": terminal is a str ('no'), not a bool"),
])
def test_a_tool_whose_spec_has_mistyped_fields_is_refused_at_construction(tool, says):
    with pytest.raises(ConfigError) as info:
        driver(tools=[tool])
    assert str(info.value).startswith("agentrt: " + says)


def test_a_tool_whose_spec_is_not_a_tool_spec_is_refused_at_construction():
    class T:
        def spec(self):
            return "nope"

        def call(self, c):
            return None

    with pytest.raises(ConfigError, match=r"tools\[0\].spec\(\) returned a str \('nope'\), not "
                                          "a ToolSpec"):
        driver(tools=[T()])


@pytest.mark.parametrize(("kw", "says"), [
    ({"input_schema": {"type": "object"}}, 'tool "read": input_schema is a dict, not JSON as '
                                           "bytes or str (encode a dict with json.dumps)"),
    ({"input_schema": None}, 'tool "read": input_schema is None'),
    ({"input_schema": 5}, 'tool "read": input_schema is an int (5)'),
    ({"input_schema": '{"a":"\ud800"}'}, 'tool "read": input_schema holds a lone surrogate'),
    ({"timeout": 1e300}, 'tool "read": timeout is 1e+300 seconds, longer than 365 days'),
    ({"timeout": 2**70}, 'tool "read": timeout is 1180591620717411303424 seconds, longer'),
    ({"timeout": float("nan")}, 'tool "read": timeout is nan, not a finite number of seconds'),
    ({"timeout": float("inf")}, 'tool "read": timeout is inf, not a finite number'),
    ({"timeout": "5"}, "tool \"read\": timeout is a str ('5'), not a number of seconds or a "
                       "timedelta"),
    ({"timeout": None}, 'tool "read": timeout is None, not a number of seconds'),
    ({"timeout": True}, 'tool "read": timeout is a bool (True), not a number of seconds'),
    ({"timeout": timedelta.max}, 'tool "read": timeout is 999999999 days, 23:59:59.999999, '
                                 "longer than 365 days"),
    ({"timeout": 0}, 'tool "read": timeout is required'),
    ({"timeout": -1}, 'tool "read": timeout is required'),
    ({"terminal": "no"}, "tool \"read\": terminal is a str ('no'), not a bool"),
    ({"terminal": 1}, 'tool "read": terminal is an int (1), not a bool'),
    ({"description": 5}, 'tool "read": description is an int (5), not a str'),
    ({"side_effect": None}, 'tool "read": side_effect is None, not a str'),
])
def test_func_tool_refuses_mistyped_arguments_at_construction(kw, says):
    with pytest.raises(ConfigError) as info:
        FuncTool("read", rd, **kw)
    assert str(info.value).startswith("agentrt: " + says)


@pytest.mark.parametrize(("name", "fn", "says"), [
    (5, rd, "FuncTool name is an int (5), not a str"),
    (None, rd, "FuncTool name is None, not a str"),
    ("a\ud800", rd, "FuncTool name holds a lone surrogate (U+D800), which is not valid UTF-8"),
    ("read", 5, 'tool "read": fn is an int (5), not a function fn(call)'),
    ("read", None, 'tool "read": fn is None, not a function fn(call)'),
])
def test_func_tool_refuses_a_bad_name_or_function_at_construction(name, fn, says):
    with pytest.raises(ConfigError) as info:
        FuncTool(name, fn, timeout=5)
    assert str(info.value).startswith("agentrt: " + says)


def test_the_longest_tool_timeout_runs_and_records_the_outcome():
    d = driver(tools=[read_tool(timeout=timedelta(days=365))])
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    assert d.store.list_steps("r")[0].observation.kind == "tool_result"


@pytest.mark.parametrize(("value", "says"), [
    (-5, "lease_ttl is an int (-5), negative"),
    ("5", "lease_ttl is a str ('5'), not a number of seconds or a timedelta"),
    (2**70, "lease_ttl is 1180591620717411303424 seconds, longer than a day"),
    (float("nan"), "lease_ttl is nan, not a finite number of seconds"),
    (1e-6, "lease_ttl is a float (1e-06), shorter than the minimum of 0.25 s: the heartbeat "
           "renews the lease every third of its TTL"),
    (timedelta(milliseconds=10), "lease_ttl is a timedelta, shorter than the minimum"),
    (timedelta(days=2), "lease_ttl is 2 days, 0:00:00, longer than a day"),
    (True, "lease_ttl is a bool (True), not a number of seconds"),
])
def test_a_lease_ttl_that_is_not_a_usable_positive_wait_is_refused_at_construction(value, says):
    with pytest.raises(ConfigError) as info:
        driver(lease_ttl=value)
    assert str(info.value).startswith("agentrt: " + says)


def test_a_zero_lease_ttl_is_the_default_and_a_quarter_second_is_accepted():
    assert driver(lease_ttl=0)._core.lease_ttl == timedelta(seconds=30)
    assert driver(lease_ttl=None)._core.lease_ttl == timedelta(seconds=30)
    assert driver(lease_ttl=0.25)._core.lease_ttl == timedelta(milliseconds=250)


@pytest.mark.parametrize("name", ["observer", "now", "new_id", "reconcile", "wall", "monotonic"])
def test_a_function_argument_that_is_not_callable_is_refused_at_construction(name):
    with pytest.raises(ConfigError, match=f"^agentrt: {name} is an int \\(5\\), not a "):
        driver(**{name: 5})


@pytest.mark.parametrize(("kw", "says"), [
    ({"lease_owner": 5}, "lease_owner is an int (5), not a str"),
    ({"lease_owner": "a\ud800"}, "lease_owner holds a lone surrogate"),
    ({"lease_token": None}, "lease_token is None, not a str"),
    ({"model": 5}, "model is an int (5), not a ModelConfig"),
])
def test_a_mistyped_owner_or_model_is_refused_at_construction(kw, says):
    with pytest.raises(ConfigError) as info:
        driver(**kw)
    assert str(info.value).startswith("agentrt: " + says)


def scripted(*replies):
    return ScriptedModel(list(replies) or [ModelResponse("hi", usage=Usage(1, 1))])


@pytest.mark.parametrize(("kw", "says"), [
    ({"prices": [Price(1, 1)]}, "ModelConfig prices is a list, not a mapping of model name to "
                                "Price"),
    ({"prices": {"m": 5}}, 'ModelConfig prices["m"] is an int (5), not a Price'),
    ({"prices": {5: Price()}}, "ModelConfig prices: the key an int (5) is not a model name"),
    ({"call_timeout": 5.0}, "ModelConfig call_timeout is a float (5.0), not a timedelta"),
    ({"call_timeout": timedelta.max}, "ModelConfig call_timeout is 999999999 days, "
                                      "23:59:59.999999, longer than 365 days"),
    ({"backoff": 1.0}, "ModelConfig backoff is a float (1.0), not a timedelta"),
    ({"max_retry_after": None}, "ModelConfig max_retry_after is None, not a timedelta"),
    ({"max_retries": "3"}, "ModelConfig max_retries is a str ('3'), not an int"),
    ({"max_retries": True}, "ModelConfig max_retries is a bool (True), not an int"),
    ({"max_retries": 2**70}, "ModelConfig max_retries is 1180591620717411303424, above"),
])
def test_model_config_refuses_mistyped_fields_at_construction(kw, says):
    with pytest.raises(ConfigError) as info:
        ModelConfig(scripted(), **kw)
    assert str(info.value).startswith("agentrt: " + says)


def test_a_model_config_whose_model_is_not_a_model_is_refused():
    with pytest.raises(ConfigError, match=r"^agentrt: ModelConfig model is a str \('gpt'\), not "
                                          r"a Model \(an object with name\(\) and generate"):
        ModelConfig("gpt")


@pytest.mark.parametrize(("kw", "says"), [
    ({"input": 1.5}, "Price input is a float (1.5), not an int"),
    ({"output": 2**70}, "Price output is 1180591620717411303424, above"),
    ({"cached_input": None}, "Price cached_input is None, not an int"),
])
def test_a_price_that_is_not_an_int64_is_refused(kw, says):
    with pytest.raises(ConfigError) as info:
        Price(**kw)
    assert str(info.value).startswith("agentrt: " + says)


def test_a_model_config_changed_after_construction_is_checked_again_by_the_driver():
    config = ModelConfig(scripted())
    config.backoff = 1.0  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="ModelConfig backoff is a float"):
        driver(model=config)


def model_driver(model, store=None, **kw):
    config = ModelConfig(model, **kw)
    return driver(store, agent=ModelToolAgent(), model=config)


def test_a_doubled_backoff_past_a_year_gives_up_instead_of_overflowing(waits):
    model = scripted(*[rate_limited()] * 31)
    d = model_driver(model, max_retries=30, backoff=timedelta(days=300))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    assert waits == [timedelta(days=300)]  # the next, 600 days, is not waited
    assert [m.status for m in d.store.list_model_calls("r")] == ["error", "error"]


# ---------------------------------------------------------------------------
# 3. start(goal, limits, run_id, cancel) and resume(run_id, cancel).

@pytest.mark.parametrize("goal", [5, True, {}, None, 2**70, b"g", 1.5])
def test_a_goal_that_is_not_a_str_is_refused_so_the_event_and_column_agree(goal):
    d = driver()
    with pytest.raises(ConfigError, match=r"^agentrt: goal is .*, not a str$"):
        d.start(goal, limits(), run_id="r")
    nothing_written(d.store)


@pytest.mark.parametrize(("run_id", "says"), [
    (5, "run_id is an int (5), not a str"),
    (b"r", "run_id is a bytes (b'r'), not a str"),
    ("a\ud800", "run_id holds a lone surrogate (U+D800), which is not valid UTF-8: it would "
                "be stored as U+FFFD, and the run could not be addressed by the id given"),
    ("", "run id is required"),
])
def test_a_run_id_that_cannot_address_its_run_is_refused(run_id, says):
    d = driver()
    with pytest.raises(ConfigError) as info:
        d.start("g", limits(), run_id=run_id)
    assert str(info.value) == "agentrt: " + says
    nothing_written(d.store)


def test_a_new_id_that_returns_no_str_is_refused_before_the_run_is_written():
    d = driver(new_id=lambda: 5)
    with pytest.raises(ConfigError, match=r"the id new_id\(\) returned is an int \(5\), not a str"):
        d.start("g", limits())
    nothing_written(d.store)


@pytest.mark.parametrize("token", [True, threading.Event(), "cancel"])
def test_a_cancel_that_is_not_a_cancel_token_is_refused_before_the_run_is_written(token):
    d = driver()
    with pytest.raises(ConfigError, match=r"^agentrt: cancel is .*, not a CancelToken$"):
        d.start("g", limits(), run_id="r", cancel=token)
    nothing_written(d.store)
    with pytest.raises(ConfigError, match="cancel is .*, not a CancelToken"):
        d.resume("r", cancel=token)


@pytest.mark.parametrize("run_id", [None, 5, "a\ud800"])
def test_resume_refuses_a_run_id_that_is_not_text(run_id):
    with pytest.raises(ConfigError, match="^agentrt: run_id "):
        driver().resume(run_id)


# ---------------------------------------------------------------------------
# 4. The operator's calls: who decided, in text, and the hash that was shown.

def waiting():
    d = push_driver()
    d.start("g", limits(), run_id="r")
    a = d.store.list_approvals("r")[0]
    return d, a


def operator_calls(d, a):
    """Every way to decide or cancel, each taking (by, note)."""
    s = d.store
    op = Operator(s)
    return {
        "Driver.approve": lambda by, note: d.approve("r", a.id, by, note),
        "Driver.reject": lambda by, note: d.reject("r", a.id, by, note),
        "Driver.approve_shown": lambda by, note: d.approve_shown("r", a.id, a.hash, by, note),
        "Driver.reject_shown": lambda by, note: d.reject_shown("r", a.id, a.hash, by, note),
        "Driver.cancel": lambda by, note: d.cancel("r", by, note),
        "Operator.approve": lambda by, note: op.approve("r", a.id, by, note),
        "Operator.cancel": lambda by, note: op.cancel("r", by, note),
        "approve": lambda by, note: approve(s, "r", a.id, by, note),
        "reject": lambda by, note: reject(s, "r", a.id, by, note),
        "approve_shown": lambda by, note: approve_shown(s, "r", a.id, a.hash, by, note),
        "reject_shown": lambda by, note: reject_shown(s, "r", a.id, a.hash, by, note),
        "cancel": lambda by, note: cancel(s, "r", by, note),
    }


def unchanged(d, a, events_before) -> None:
    assert d.store.get_run("r").status == "WAITING_FOR_APPROVAL"
    assert d.store.get_approval("r", a.id).status == "pending"
    assert types(d.store, "r") == events_before


@pytest.mark.parametrize(("by", "says"), [
    ("", "by is '', a blank str: a decision must name who made it"),
    ("  ", "by is '  ', a blank str: a decision must name who made it"),
    (None, "by is None, not a str"),
    (5, "by is an int (5), not a str"),
    (b"me", "by is a bytes (b'me'), not a str"),
])
def test_an_operator_call_by_nobody_or_by_a_non_str_is_refused_and_changes_nothing(by, says):
    d, a = waiting()
    before = types(d.store, "r")
    for name, decide in operator_calls(d, a).items():
        with pytest.raises(ConfigError) as info:
            decide(by, "")
        assert str(info.value) == "agentrt: " + says, name
    unchanged(d, a, before)


@pytest.mark.parametrize("note", [None, 5, {"a": 1}, b"n"])
def test_an_operator_note_that_is_not_a_str_is_refused_and_changes_nothing(note):
    d, a = waiting()
    before = types(d.store, "r")
    for decide in operator_calls(d, a).values():
        with pytest.raises(ConfigError, match="^agentrt: note is .*, not a str$"):
            decide("op", note)
    unchanged(d, a, before)


@pytest.mark.parametrize("shown", [None, 5, b"abc"])
def test_approve_shown_without_a_str_hash_is_refused_rather_than_unbound(shown):
    d, a = waiting()
    before = types(d.store, "r")
    s = d.store
    for decide in (
        lambda: d.approve_shown("r", a.id, shown, "op"),
        lambda: d.reject_shown("r", a.id, shown, "op"),
        lambda: approve_shown(s, "r", a.id, shown, "op"),
        lambda: reject_shown(s, "r", a.id, shown, "op"),
        lambda: Operator(s).approve_shown("r", a.id, shown, "op"),
    ):
        with pytest.raises(ConfigError, match="^agentrt: shown_hash is .*, not a str: a "
                                              "decision bound to what was shown needs the hash"):
            decide()
    unchanged(d, a, before)


@pytest.mark.parametrize("store", [None, "runs.db"])
def test_an_operator_call_on_something_that_is_not_a_store_is_refused(store):
    with pytest.raises(ConfigError, match="^agentrt: store is .*, not a Store$"):
        approve(store, "r", "a", "op")
    with pytest.raises(ConfigError, match="^agentrt: store is .*, not a Store$"):
        cancel(store, "r", "op")


def test_a_well_formed_decision_still_records_who_made_it():
    d, a = waiting()
    decided = d.approve("r", a.id, "op", "fine")
    assert (decided.status, decided.decided_by, decided.note) == ("approved", "op", "fine")


# ---------------------------------------------------------------------------
# 5. Wrong types from the consumer's own objects become recorded outcomes.

@pytest.mark.parametrize(("content", "kind"), [
    ({"a": 1}, "dict"), (5, "int"), ([1], "list"), (memoryview(b"{}"), "memoryview"),
    (bytearray(b"{}"), "bytearray"),
])
def test_tool_content_that_is_not_bytes_or_str_is_a_tool_error_not_a_half_step(content, kind):
    tool = FuncTool("emit", lambda c: ToolResult(content, "s"), timeout=5)
    d = driver(agent=ScriptedAgent([call("emit"), Decision.complete()]), tools=[tool])
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    step = d.store.list_steps("r")[0]
    assert step.status == "failed" and step.observation.kind == "tool_error"
    body = json.loads(step.observation.content)
    assert body == {"error": f"the tool's content is a {kind}, not JSON as bytes or str",
                    "failure": "error", "tool": "emit"}


@pytest.mark.parametrize(("decision", "says"), [
    (Decision("tool_call", tool="read", args={"a": 1}), "a dict args"),
    (Decision("tool_call", tool="read", args=5), "a int args"),
    (Decision("complete", result={"a": 1}), "a dict result"),
    (Decision("complete", result=5), "a int result"),
])
def test_decision_args_or_result_that_are_not_json_bytes_are_an_agent_error(decision, says):
    d = driver(agent=ScriptedAgent([decision]))
    run = d.start("g", limits(), run_id="r")
    detail = f"the agent's decision has {says}, not JSON as bytes or str"
    assert (run.status, run.reason, run.reason_detail) == ("FAILED", "agent_error", detail)
    assert [s.status for s in d.store.list_steps("r")] == ["failed"]


def test_a_model_tool_use_whose_input_is_a_dict_is_an_agent_error_not_a_half_step():
    model = scripted(ModelResponse(tool_uses=[ToolUse("1", "read", {"a": 1})],
                                   usage=Usage(1, 1)))
    d = model_driver(model)
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "agent_error")
    assert "a dict args" in run.reason_detail
    assert [s.status for s in d.store.list_steps("r")] == ["failed"]
    assert [m.status for m in d.store.list_model_calls("r")] == ["ok"]


@pytest.mark.parametrize(("pd", "says"), [
    (PolicyDecision(None), "a NoneType outcome, not a str"),
    (PolicyDecision(5), "a int outcome, not a str"),
    (PolicyDecision("allow", 5), "a int reason, not a str"),
    (PolicyDecision("allow", None), "a NoneType reason, not a str"),
    (PolicyDecision("require_approval", "r", 5, b"{}", b"{}"), "a int kind, not a str"),
    (PolicyDecision("require_approval", "r", "k", {"a": 1}, b"{}"), "a dict capability"),
    (PolicyDecision("require_approval", "r", "k", b"{}", "shown"), "a str presentation"),
    (PolicyDecision("deny", b"x"), "a bytes reason, not a str"),
])
def test_a_policy_decision_with_mistyped_fields_is_a_policy_error(pd, says):
    calls = []
    tools = [FuncTool("read", lambda c: calls.append(c), timeout=5)]
    d = driver(policy=PolicyFunc(lambda r, v: pd), tools=tools)
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "internal_error")
    assert run.reason_detail.startswith(f"policy: the policy's decision has {says}")
    assert calls == []
    assert [s.status for s in d.store.list_steps("r")] == ["failed"]
    assert d.store.list_approvals("r") == []


@pytest.mark.parametrize(("rules", "says"), [
    ({"read_only": 5}, 'rules["read_only"] is an int (5), not a policy outcome'),
    ({"read_only": "frob"}, "rules[\"read_only\"] is a str ('frob'), not a policy outcome"),
    ({"read-only": "allow"}, "rules: a str ('read-only') is not a side effect"),
    ({5: "allow"}, "rules: an int (5) is not a side effect"),
    (None, "rules is None, not a mapping of side effect to policy outcome"),
    ([("read_only", "allow")], "rules is a list, not a mapping"),
])
def test_side_effect_policy_refuses_rules_it_could_not_apply(rules, says):
    with pytest.raises(ConfigError) as info:
        SideEffectPolicy(rules)
    assert str(info.value).startswith("agentrt: " + says)


def test_side_effect_policy_with_good_rules_still_rules():
    d = driver(policy=SideEffectPolicy({"read_only": "deny"}))
    run = d.start("g", limits(), run_id="r")
    assert d.store.list_steps("r")[0].observation.kind == "policy_denied"
    assert run.status == "COMPLETED"


@pytest.mark.parametrize(("usage", "why"), [
    (Usage(1.5, 2), "input_tokens is a float (1.5), not an int"),
    (Usage(None, 2), "input_tokens is None, not an int"),
    (Usage("5", 2), "input_tokens is a str ('5'), not an int"),
    (Usage(True, 2), "input_tokens is a bool (True), not an int"),
    (Usage(5, 2, 1.0), "cached_input_tokens is a float (1.0), not an int"),
    (None, "the usage is None, not a Usage"),
    ({"input_tokens": 1}, "the usage is a dict, not a Usage"),
])
def test_a_usage_with_non_int_counts_is_unusable_and_the_call_is_recorded(usage, why):
    d = model_driver(scripted(ModelResponse("hi", usage=usage)))
    run = d.start("g", limits(max_output_tokens_per_call=100), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    [mc] = d.store.list_model_calls("r")
    assert (mc.status, mc.error) == ("error", f"unusable usage: {why}")
    failed = [json.loads(e.payload) for e in d.store.list_events("r")
              if e.type == "model.failed"]
    assert [f["error"] for f in failed] == [f"unusable usage: {why}"]
    assert failed[0]["usage"]["input_tokens"] == mc.usage.input_tokens  # the estimate


def test_a_usage_past_int64_saturates_in_the_event_as_in_the_row():
    d = model_driver(scripted(ModelResponse("hi", usage=Usage(2**70, 2**63, 2**64))))
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    [mc] = d.store.list_model_calls("r")
    assert (mc.usage.input_tokens, mc.usage.output_tokens,
            mc.usage.cached_input_tokens) == (MAX_INT64, MAX_INT64, MAX_INT64)
    [done] = [json.loads(e.payload) for e in d.store.list_events("r")
              if e.type == "model.completed"]
    assert done["usage"] == {"input_tokens": MAX_INT64, "output_tokens": MAX_INT64,
                             "cached_input_tokens": MAX_INT64}
    totals = d.store.get_run("r").usage
    assert (totals.input_tokens, totals.output_tokens) == (MAX_INT64, MAX_INT64)


@pytest.mark.parametrize(("request_", "says"), [
    ("hello", "request is a str ('hello'), not a ModelRequest"),
    (ModelRequest(max_output_tokens=1.5), "request max_output_tokens is a float (1.5)"),
    (ModelRequest(max_output_tokens=2**70), "request max_output_tokens is "
                                            "1180591620717411303424, above 2**63-1"),
])
def test_a_model_request_of_the_wrong_type_is_refused_before_a_dispatch(request_, says):
    def decide(step):
        step.model.generate(request_)
        return Decision.complete()

    d = driver(agent=AgentFunc(decide), model=ModelConfig(scripted()))
    run = d.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == ("FAILED", "agent_error")
    assert run.reason_detail.startswith(f"agentrt: {says}")
    assert d.store.list_model_calls("r") == []


_GOOD_SPEC = ToolSpec("read", "", b'{"type":"object"}', "read_only", timedelta(seconds=5))


@pytest.mark.parametrize(("turned", "said"), [
    ("nope", "spec() returned a str ('nope'), not a ToolSpec"),
    (ToolSpec("read", "", b'{"type":"object"}', "read_only", 5.0),
     "its spec: timeout is a float (5.0), not a timedelta"),
])
def test_a_tool_whose_spec_turns_bad_is_an_invalid_decision_not_a_half_step(turned, said):
    class Flaky:
        calls = 0

        def spec(self):
            Flaky.calls += 1  # registration (twice) and the run's start read it first
            return _GOOD_SPEC if Flaky.calls <= 3 else turned

        def call(self, c):
            return ToolResult(b"{}", "ok")

    d = driver(tools=[Flaky()], agent=ScriptedAgent([call("read"), Decision.complete()]))
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    obs = d.store.list_steps("r")[0].observation
    assert obs.kind == "invalid_decision"
    assert obs.summary == f'invalid decision: tool "read": {said}'


def test_fixture_tools_and_default_limits_still_run():
    d, store, _, _ = make(script=[call("read", b'{"n":1}'), Decision.complete()],
                          tools=fixture_tools())
    assert d.start("g", Limits(max_steps=5, max_consecutive_tool_failures=1,
                               loop_threshold=2)).status == "COMPLETED"


# -- a class where an instance is meant -------------------------------------------


class _AgentClass:
    def decide(self, step: object) -> Decision:
        return Decision.complete("{}")


class _ModelClass:
    def name(self) -> str:
        return "m"

    def generate(self, request: object, cancel: object) -> object:
        raise AssertionError("never called")


@pytest.mark.parametrize("which", ["agent", "policy", "model"])
def test_a_class_given_for_an_instance_is_refused_before_a_run_is_written(which: str) -> None:
    """``DefaultPolicy`` for ``DefaultPolicy()`` passes a check for its methods,
    which then fail on every call: each start would store a FAILED run."""
    store = open_store(":memory:")
    agent: Any = _AgentClass if which == "agent" else (
        ModelToolAgent() if which == "model" else _AgentClass())
    policy: Any = DefaultPolicy if which == "policy" else DefaultPolicy()
    with pytest.raises(ConfigError, match=f"{which} is the class .*: pass an instance"):
        model: Any = ModelConfig(_ModelClass) if which == "model" else None
        Driver(store, agent, policy, model=model).start("g")
    assert store.list_runs() == []


def test_a_cancel_token_takes_its_timeout_as_a_timedelta_too() -> None:
    from agentrt.driver import CancelToken

    token = CancelToken(timeout=timedelta(seconds=30))
    assert token.deadline is not None and 29 < token.deadline - time.monotonic() <= 30


@pytest.mark.parametrize("given", [{"deadline": "soon"}, {"timeout": "30"}, {"deadline": True}])
def test_a_cancel_token_refuses_a_time_that_is_not_a_number_when_made(
        given: dict[str, Any]) -> None:
    from agentrt.driver import CancelToken

    name = next(iter(given))
    with pytest.raises(TypeError, match=f"CancelToken {name} is .*, not a"):
        CancelToken(**given)


class _StaticAgent:
    """An agent kept as a class on purpose: its one method is static."""

    @staticmethod
    def decide(step: object) -> Decision:
        return Decision.complete("{}")


class _ClassPolicy:
    """A policy as a class: evaluate is a classmethod."""

    _inner = DefaultPolicy()

    @classmethod
    def evaluate(cls, request: Any, view: Any) -> Any:
        return cls._inner.evaluate(request, view)


@pytest.mark.parametrize("which", ["agent", "policy"])
def test_a_class_whose_methods_are_static_or_class_methods_is_accepted(which: str) -> None:
    store = open_store(":memory:")
    agent: Any = _StaticAgent if which == "agent" else _StaticAgent()
    policy: Any = _ClassPolicy if which == "policy" else DefaultPolicy()
    assert Driver(store, agent, policy).start("g").status == "COMPLETED"


def _done(self: object, step: object) -> Decision:
    return Decision.complete("{}")


class _PartialAgent:
    decide = functools.partialmethod(_done)


class _DispatchAgent:
    @functools.singledispatchmethod
    def decide(self, step: object) -> Decision:
        return Decision.complete("{}")


@pytest.mark.parametrize("cls", [_PartialAgent, _DispatchAgent],
                         ids=["partialmethod", "singledispatchmethod"])
def test_a_class_whose_method_binds_only_on_an_instance_is_refused_however_it_is_made(
        cls: Any) -> None:
    store = open_store(":memory:")
    assert Driver(store, cls(), DefaultPolicy()).start("g").status == "COMPLETED"
    with pytest.raises(ConfigError, match="agent is the class .*: pass an instance"):
        Driver(store, cls, DefaultPolicy())
