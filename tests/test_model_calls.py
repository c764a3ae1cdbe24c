"""Model calls: every attempt a row, charged, limited before dispatch, retried with care."""

from __future__ import annotations

import json
import ssl
import threading
import time
from datetime import timedelta

import pytest
from _driver_kit import fixture_tools, limits, make, types

from agentrt.driver import (
    CancelledError,
    CancelToken,
    ConfigError,
    LimitError,
    Message,
    ModelConfig,
    ModelRequest,
    ModelResponse,
    Price,
    ServedError,
    ToolUse,
    UnusableUsageError,
    cost_micros,
)
from agentrt.records import Decision, Usage
from agentrt.store.writes import MAX_INT64
from agentrt.testing import ModelToolAgent, ScriptedModel, rate_limited

PRICES = {"scripted-model": Price(input=1_000_000, output=5_000_000, cached_input=100_000)}
REQ = ModelRequest(messages=[Message("user", "hello")], max_output_tokens=50)


def reply(text: str = "ok", i: int = 10, o: int = 5, cached: int = 0) -> ModelResponse:
    return ModelResponse(text=text, usage=Usage(i, o, cached))


def asking(times: int = 1, request: ModelRequest = REQ, then: Decision | None = None):
    """An agent step that calls the model ``times`` times, then decides ``then``."""
    def decide(step):
        for _ in range(times):
            step.model.generate(request)
        return then or Decision.complete()
    return decide


def drive(replies, script, lim=None, **cfg):
    model = ScriptedModel(replies)
    config = ModelConfig(model, prices=cfg.pop("prices", PRICES), **cfg)
    d, store, agent, obs = make(script=script, model=config)
    run = d.start("g", lim or limits(), run_id="r")
    return run, store, model


def test_usage_and_cost_are_recorded_on_the_row_the_run_and_the_events():
    run, store, _ = drive([reply(i=100, o=20, cached=50)], [asking()])
    assert run.status == "COMPLETED"
    (mc,) = store.list_model_calls("r")
    assert (mc.attempt, mc.status, mc.model, mc.error) == (1, "ok", "scripted-model", "")
    assert mc.usage == Usage(100, 20, 50)
    # 50 uncached at 1 micro, 50 cached at 0.1 micro, 20 out at 5 micros.
    assert mc.cost_micros == 50 + 5 + 100 == cost_micros(PRICES["scripted-model"], mc.usage)
    assert (run.model_calls, run.usage, run.estimated_cost_micros) == (1, Usage(100, 20, 50), 155)
    events = store.list_events("r")
    assert [e.type for e in events[3:5]] == ["model.dispatched", "model.completed"]
    assert json.loads(events[3].payload) == {"attempt": 1, "call_id": mc.id,
                                             "model": "scripted-model"}
    done = json.loads(events[4].payload)
    assert list(done) == ["attempt", "call_id", "cost_micros", "error", "latency_ms", "model",
                          "status", "usage"]
    assert done["usage"] == {"input_tokens": 100, "output_tokens": 20,
                             "cached_input_tokens": 50}
    assert events[3].step_id == events[2].step_id == mc.step_id


def test_a_transient_error_is_retried_then_succeeds():
    run, store, _ = drive([rate_limited(), reply()], [asking()], max_retries=1,
                          backoff=timedelta(milliseconds=1))
    assert run.status == "COMPLETED"
    calls = store.list_model_calls("r")
    assert [(c.attempt, c.status, c.error) for c in calls] == [
        (1, "error", "429 slow down"), (2, "ok", "")]
    assert calls[0].usage == Usage() and calls[0].cost_micros == 0
    assert run.model_calls == 2
    assert types(store, "r")[3:7] == ["model.dispatched", "model.failed", "model.dispatched",
                                      "model.completed"]


def test_no_retry_unless_configured():
    run, store, _ = drive([rate_limited(), reply()], [asking()])
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    assert run.reason_detail == "model unavailable after 1 attempt(s): 429 slow down"
    assert len(store.list_model_calls("r")) == 1


def test_exhausted_retries_make_the_model_unavailable():
    run, store, _ = drive([rate_limited(), rate_limited(), reply()], [asking()], max_retries=1,
                          backoff=timedelta(milliseconds=1))
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    assert run.reason_detail == "model unavailable after 2 attempt(s): 429 slow down"
    # The reference writes limit.exceeded for model_unavailable too.
    assert types(store, "r")[-3:] == ["step.failed", "limit.exceeded", "run.finished"]


def test_the_call_limit_stops_before_a_dispatch():
    run, store, _ = drive([reply(), reply()], [asking(2)], lim=limits(max_model_calls=1))
    assert (run.status, run.reason) == ("FAILED", "limit_model_calls")
    assert run.reason_detail == "limit_model_calls: 1 model calls made, limit 1"
    assert len(store.list_model_calls("r")) == 1
    assert types(store, "r")[-2:] == ["limit.exceeded", "run.finished"]


def test_token_and_cost_limits_are_projected_before_the_dispatch():
    run, store, _ = drive([reply()], [asking()], lim=limits(max_total_tokens=20))
    assert run.reason == "limit_tokens" and "projected" in run.reason_detail
    assert "limit 20" in run.reason_detail and store.list_model_calls("r") == []
    run, store, _ = drive([reply()], [asking()], lim=limits(max_estimated_cost_micros=10))
    assert run.reason == "limit_cost"
    assert run.reason_detail.startswith("limit_cost: projected cost ")
    assert store.list_model_calls("r") == []


def test_an_uncapped_request_is_refused_under_a_projected_limit():
    uncapped = ModelRequest(messages=[Message("user", "hi")])
    run, store, _ = drive([reply()], [asking(request=uncapped)], lim=limits(max_total_tokens=10**6))
    assert run.reason == "limit_tokens"
    assert "the request sets no output cap" in run.reason_detail
    # A per-call cap in the limits makes it projectable.
    run, store, model = drive([reply()], [asking(request=uncapped)],
                              lim=limits(max_total_tokens=10**6, max_output_tokens_per_call=64))
    assert run.status == "COMPLETED" and model.requests[0].max_output_tokens == 64


def test_an_ambiguous_attempt_is_charged_conservatively_and_retried():
    run, store, _ = drive([ConnectionResetError("reset by peer"), reply()], [asking()],
                          max_retries=1, backoff=timedelta(milliseconds=1))
    assert run.status == "COMPLETED"
    first, second = store.list_model_calls("r")
    assert first.status == "ambiguous"
    estimate = len(json.dumps(REQ.to_json(), separators=(",", ":"))) // 3 + 1
    assert first.usage == Usage(estimate, 50)
    assert first.cost_micros == cost_micros(PRICES["scripted-model"], Usage(estimate, 50))
    assert second.status == "ok"


def test_a_served_error_is_charged_and_not_retried():
    run, store, _ = drive([ServedError("content filtered", Usage(30, 7)), reply()], [asking()],
                          max_retries=3)
    assert run.reason == "model_unavailable"
    (mc,) = store.list_model_calls("r")
    assert (mc.status, mc.error, mc.usage) == ("error", "content filtered", Usage(30, 7))
    assert run.usage == Usage(30, 7)


def test_unusable_usage_is_charged_the_estimate():
    run, store, _ = drive([reply(i=-5)], [asking()], max_retries=2)
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    (mc,) = store.list_model_calls("r")
    assert mc.status == "error" and "unusable usage" in mc.error
    assert mc.usage.output_tokens == 50 and mc.usage.input_tokens > 0
    err = ServedError("bad usage")
    err.__cause__ = UnusableUsageError("cached above input")
    run, store, _ = drive([err], [asking()])
    assert store.list_model_calls("r")[0].error == "unusable usage: cached above input"


def test_a_timed_out_attempt_is_ambiguous():
    class Slow:
        def name(self):
            return "scripted-model"

        def generate(self, request, cancel):
            cancel.wait(5)
            raise TimeoutError("gave up")

    config = ModelConfig(Slow(), prices=PRICES, call_timeout=timedelta(milliseconds=100))
    d, store, _, _ = make(script=[asking()], model=config)
    run = d.start("g", limits(), run_id="r")
    assert run.reason == "model_unavailable"
    (mc,) = store.list_model_calls("r")
    assert mc.status == "ambiguous"  # our deadline or the adapter's own, whichever came first


def test_concurrent_calls_reserve_against_the_limits():
    gate = threading.Barrier(4)
    outcomes: list = []

    class Waiting:
        def name(self):
            return "scripted-model"

        def generate(self, request, cancel):
            time.sleep(0.05)
            return reply()

    def decide(step):
        def one():
            gate.wait()
            try:
                step.model.generate(REQ)
                outcomes.append("ok")
            except LimitError as exc:
                outcomes.append(exc.reason)
        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return Decision.complete()

    config = ModelConfig(Waiting(), prices=PRICES)
    d, store, _, _ = make(script=[decide], model=config)
    run = d.start("g", limits(max_model_calls=2), run_id="r")
    assert run.status == "COMPLETED"
    assert sorted(outcomes) == ["limit_model_calls", "limit_model_calls", "ok", "ok"]
    assert len(store.list_model_calls("r")) == 2


def test_a_call_recorded_by_one_thread_is_counted_once_by_the_next_thread():
    # The window between one attempt's committed totals and the release of its
    # reservation: the observer runs there, in the calling thread, and starts
    # the second call. Counting both the committed call and its reservation
    # would refuse the second call of a limit of two.
    outcomes: list = []
    second_done = threading.Event()
    holder: dict = {}

    def second() -> None:
        try:
            holder["step"].model.generate(REQ)
            outcomes.append("ok")
        except LimitError as exc:
            outcomes.append(exc.reason)
        finally:
            second_done.set()

    def observer(event) -> None:
        if event.type == "model.completed" and not outcomes and "thread" not in holder:
            holder["thread"] = threading.Thread(target=second)
            holder["thread"].start()
            assert second_done.wait(10)

    def decide(step):
        holder["step"] = step
        step.model.generate(REQ)
        outcomes.append("ok")
        holder["thread"].join()
        return Decision.complete()

    config = ModelConfig(ScriptedModel([reply(), reply()]), prices=PRICES)
    d, store, _, _ = make(script=[decide], model=config, observer=observer)
    run = d.start("g", limits(max_model_calls=2), run_id="r")
    assert outcomes == ["ok", "ok"]
    assert run.status == "COMPLETED" and run.model_calls == 2


def test_retry_after_is_honoured():
    started = time.monotonic()
    run, store, _ = drive([rate_limited(timedelta(milliseconds=300)), reply()], [asking()],
                          max_retries=1, backoff=timedelta(milliseconds=1))
    assert run.status == "COMPLETED"
    assert time.monotonic() - started >= 0.3


def test_a_retry_wait_that_cannot_fit_is_unavailable_at_once():
    started = time.monotonic()
    run, store, _ = drive([rate_limited(timedelta(hours=1)), reply()], [asking()],
                          max_retries=1, max_retry_after=timedelta(seconds=5))
    assert run.reason == "model_unavailable" and time.monotonic() - started < 2
    assert len(store.list_model_calls("r")) == 1
    run, store, _ = drive([rate_limited(), reply()], [asking()], max_retries=1,
                          backoff=timedelta(hours=1),
                          lim=limits(max_elapsed_time=timedelta(minutes=30)))
    assert run.reason == "model_unavailable" and len(store.list_model_calls("r")) == 1


def test_a_cancelled_caller_still_records_the_call():
    token = CancelToken()

    class Cancelling:
        def name(self):
            return "scripted-model"

        def generate(self, request, cancel):
            token.cancel()
            return reply(i=40, o=4)

    config = ModelConfig(Cancelling(), prices=PRICES)
    d, store, _, _ = make(script=[asking()], model=config)
    with pytest.raises(CancelledError):
        d.start("g", limits(), run_id="r", cancel=token)
    (mc,) = store.list_model_calls("r")
    assert mc.status == "ok" and mc.usage == Usage(40, 4)
    assert store.get_run("r").model_calls == 1
    assert store.list_steps("r")[0].status == "deciding"


def test_a_call_cut_by_the_callers_cancel_is_ambiguous():
    token = CancelToken()

    class Hanging:
        def name(self):
            return "scripted-model"

        def generate(self, request, cancel):
            token.cancel()
            cancel.wait(5)
            raise ConnectionError("aborted")

    d, store, _, _ = make(script=[asking()], model=ModelConfig(Hanging(), prices=PRICES,
                                                               max_retries=2))
    with pytest.raises(CancelledError):
        d.start("g", limits(), run_id="r", cancel=token)
    (mc,) = store.list_model_calls("r")
    assert mc.status == "ambiguous"


def test_totals_saturate_rather_than_wrap():
    big = 1 << 62
    run, store, _ = drive([reply(i=big, o=big), reply(i=big, o=big)], [asking(2)], prices={})
    assert run.usage.input_tokens == MAX_INT64 and run.usage.output_tokens == MAX_INT64
    assert run.model_calls == 2


def test_the_model_fixture_scenario():
    """export.md's `model` fixture: a 429, a tool use, then text."""
    model = ScriptedModel([
        rate_limited(),
        ModelResponse(tool_uses=[ToolUse("t1", "read", b'{"n":7}')], usage=Usage(100, 20)),
        ModelResponse(text="done", usage=Usage(120, 5, 50)),
    ])
    config = ModelConfig(model, prices=PRICES, max_retries=1,
                         backoff=timedelta(milliseconds=1), call_timeout=timedelta(seconds=1))
    d, store, _, _ = make(model=config, tools=fixture_tools())
    d._core.agent = ModelToolAgent()
    run = d.start("read seven", limits(max_model_calls=10), run_id="r")
    assert (run.status, run.step_count) == ("COMPLETED", 2)
    calls = store.list_model_calls("r")
    steps = store.list_steps("r")
    assert [(c.step_id, c.attempt, c.status) for c in calls] == [
        (steps[0].id, 1, "error"), (steps[0].id, 2, "ok"), (steps[1].id, 1, "ok")]
    assert sum(c.cost_micros for c in calls if c.step_id == steps[0].id) == 200
    assert steps[0].decision.origin == "" and steps[0].decision.args == b'{"n":7}'
    got = set(types(store, "r"))
    assert {"model.dispatched", "model.completed", "model.failed"} <= got


def _wrapped(signal: Exception) -> Exception:
    """``signal`` as an adapter wraps it: ``raise AdapterError(...) from signal``."""
    outer = RuntimeError(f"provider call failed: {signal}")
    outer.__cause__ = signal
    return outer


def test_a_served_error_wrapped_by_the_adapter_is_still_charged_and_not_retried():
    """Before: only the outermost exception was looked at, so the 520 served
    tokens went uncharged (errors.As finds a ServedError under wrapping)."""
    run, store, model = drive([_wrapped(ServedError("content filtered", Usage(500, 20))),
                               reply()], [asking()], max_retries=2,
                              backoff=timedelta(milliseconds=1))
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    (mc,) = store.list_model_calls("r")
    assert (mc.status, mc.usage, mc.error) == (
        "error", Usage(500, 20), "provider call failed: content filtered")
    assert mc.cost_micros == 500 + 100 and run.usage == Usage(500, 20)
    assert len(model.requests) == 1


def test_a_transient_error_wrapped_by_the_adapter_is_retried_with_its_retry_after():
    run, store, model = drive([_wrapped(rate_limited(timedelta(milliseconds=2))), reply()],
                              [asking()], max_retries=1, backoff=timedelta(milliseconds=1))
    assert run.status == "COMPLETED" and len(model.requests) == 2
    assert [(c.status, c.usage) for c in store.list_model_calls("r")] == [
        ("error", Usage()), ("ok", Usage(10, 5))]


def test_unusable_usage_wrapped_twice_is_charged_the_estimate_and_not_retried():
    served = ServedError("bad meter", Usage(1, 1))
    served.__cause__ = UnusableUsageError("unusable usage: negative count")
    run, store, model = drive([_wrapped(served), reply()], [asking()], max_retries=2)
    (mc,) = store.list_model_calls("r")
    assert (mc.status, mc.error) == ("error", "unusable usage: negative count")
    assert mc.usage.input_tokens > 1 and len(model.requests) == 1


@pytest.mark.parametrize("cut", [ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
                                 ssl.SSLZeroReturnError(6, "TLS/SSL connection has been closed")],
                         ids=["eof", "zero-return"])
def test_a_tls_connection_cut_mid_reply_is_ambiguous_and_retried(cut):
    """The spec's 'unexpected EOF': the provider may have served it. Before: a
    final, uncharged error."""
    run, store, _ = drive([cut, reply()], [asking()], max_retries=1,
                          backoff=timedelta(milliseconds=1))
    assert run.status == "COMPLETED"
    first, second = store.list_model_calls("r")
    assert (first.status, second.status) == ("ambiguous", "ok") and first.cost_micros > 0


def test_the_call_timeout_is_said_exactly_in_the_recorded_error():
    """Before: 65 µs went through a float and was said as 64.999µs."""
    class Deaf:
        def name(self) -> str:
            return "scripted-model"

        def generate(self, request, cancel):
            time.sleep(0.2)  # past the timeout, ignoring its token
            raise RuntimeError("late")

    d, store, _, _ = make(script=[asking()], model=ModelConfig(
        Deaf(), call_timeout=timedelta(microseconds=65)))
    d.start("g", limits(), run_id="r")
    (mc,) = store.list_model_calls("r")
    assert mc.error == "no reply within the call timeout of 65µs"


def test_a_request_tool_that_is_not_a_tool_spec_is_refused_by_its_place():
    said = []

    def decide(step):
        with pytest.raises(ConfigError) as info:
            step.model.generate(ModelRequest(messages=[Message("user", "hi")],
                                             tools=[{"name": "read"}], max_output_tokens=5))
        said.append(str(info.value))
        return Decision.complete()

    run, store, model = drive([], [decide])
    assert said == ["agentrt: request tools[0] is a dict, not a ToolSpec"]
    assert run.status == "COMPLETED" and store.list_model_calls("r") == []
