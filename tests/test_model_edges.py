"""Model adapters a consumer might write carelessly: every attempt still recorded and
charged, the run ending in a documented state, misuse said in one sentence."""

from __future__ import annotations

from datetime import timedelta

from _driver_kit import limits, make

from agentrt.driver import (
    Message,
    ModelConfig,
    ModelRequest,
    ModelResponse,
    Price,
    ServedError,
    TransientError,
    cost_micros,
)
from agentrt.driver.model import estimate_input_tokens
from agentrt.records import Decision, Usage
from agentrt.testing import ScriptedModel

PRICES = {"scripted-model": Price(input=1_000_000, output=5_000_000)}
REQ = ModelRequest(messages=[Message("user", "hello")], max_output_tokens=50)
ESTIMATE = Usage(estimate_input_tokens(REQ), 50)
OK = ModelResponse(text="ok", usage=Usage(10, 5))


def asking(request: ModelRequest = REQ):
    def decide(step):
        step.model.generate(request)
        return Decision.complete()
    return decide


def drive(replies, script=None, lim=None, **cfg):
    model = ScriptedModel(replies)
    config = ModelConfig(model, prices=PRICES, **cfg)
    d, store, _, _ = make(script=script or [asking()], model=config)
    run = d.start("g", lim or limits(), run_id="r")
    return run, store


def failed_detail(store) -> str:
    (event,) = [e for e in store.list_events("r") if e.type == "step.failed"]
    return event.payload.decode()


class BareTransient(TransientError):
    """A 429 whose adapter forgot ``super().__init__``: no ``retry_after``."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)


class BareServed(ServedError):
    """A served failure whose adapter forgot ``super().__init__``: no ``usage``."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)


class HeaderTransient(TransientError):
    """A 429 whose adapter sets ``retry_after`` itself, after the constructor."""

    def __init__(self, message: str, retry_after: object) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # type: ignore[assignment]


class Unreadable(int):
    """A token count that cannot be compared: reading the reply fails."""

    def __lt__(self, other: object) -> bool:
        raise RuntimeError("no comparing")


def test_a_transient_error_subclass_that_skips_init_is_recorded_and_retried():
    run, store = drive([BareTransient("429"), OK], max_retries=1,
                       backoff=timedelta(milliseconds=1))
    assert run.status == "COMPLETED"
    assert [(m.status, m.error) for m in store.list_model_calls("r")] == [
        ("error", "429"), ("ok", "")]
    assert run.model_calls == 2


def test_a_served_error_subclass_that_skips_init_is_charged_the_estimate():
    run, store = drive([BareServed("500 after serving")])
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    (mc,) = store.list_model_calls("r")
    assert (mc.status, mc.usage) == ("error", ESTIMATE)
    assert run.estimated_cost_micros == cost_micros(PRICES["scripted-model"], ESTIMATE) > 0


def test_a_served_error_with_unusable_usage_is_charged_the_estimate_and_says_so():
    run, store = drive([ServedError("400 context too long", Usage(-5, 3))])
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    (mc,) = store.list_model_calls("r")
    assert (mc.status, mc.usage) == ("error", ESTIMATE)
    assert mc.error == ("400 context too long (unusable usage: a token count is negative; "
                        "charged the estimate)")


def test_a_retry_after_set_in_seconds_after_construction_is_honoured():
    run, store = drive([HeaderTransient("429", 0.01), OK], max_retries=1,
                       backoff=timedelta(microseconds=1))
    assert run.status == "COMPLETED"
    assert [m.status for m in store.list_model_calls("r")] == ["error", "ok"]


def test_a_retry_after_that_is_not_a_duration_fails_the_call_with_its_attempt_recorded():
    run, store = drive([HeaderTransient("429", "1.5"), OK], max_retries=1,
                       backoff=timedelta(microseconds=1))
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    (mc,) = store.list_model_calls("r")
    assert mc.status == "error"
    assert "retry_after is a str ('1.5'), not a timedelta or a number of seconds" in mc.error
    assert run.model_calls == 1


def test_a_reply_that_cannot_be_read_is_recorded_and_charged_not_left_dispatched():
    run, store = drive([ModelResponse(usage=Usage(Unreadable(5), 1))])
    assert (run.status, run.reason) == ("FAILED", "model_unavailable")
    (mc,) = store.list_model_calls("r")
    assert (mc.status, mc.usage) == ("error", ESTIMATE)
    assert mc.error == "reading the model's reply raised RuntimeError: no comparing"
    assert run.model_calls == 1 and run.usage == ESTIMATE


def test_a_request_with_dict_messages_is_refused_naming_the_field():
    request = ModelRequest(messages=[{"role": "user", "content": "hi"}],  # type: ignore[list-item]
                           max_output_tokens=5)
    run, store = drive([OK], script=[asking(request)])
    assert (run.status, run.reason) == ("FAILED", "agent_error")
    assert "request messages[0] is a dict, not a Message" in failed_detail(store)
    assert store.list_model_calls("r") == []


def test_a_request_with_bytes_content_is_refused_naming_the_field():
    request = ModelRequest(messages=[Message("user", b"hi")],  # type: ignore[arg-type]
                           max_output_tokens=5)
    run, store = drive([OK], script=[asking(request)])
    assert "request messages[0] content is a bytes (b'hi'), not a str" in failed_detail(store)


def test_token_and_cost_limits_of_exactly_the_projection_allow_the_call():
    tokens = ESTIMATE.input_tokens + ESTIMATE.output_tokens
    cost = cost_micros(PRICES["scripted-model"], ESTIMATE)
    run, _ = drive([ModelResponse(usage=Usage(0, 0))],
                   lim=limits(max_total_tokens=tokens, max_estimated_cost_micros=cost))
    assert run.status == "COMPLETED"
    run, _ = drive([OK], lim=limits(max_total_tokens=tokens - 1))
    assert (run.status, run.reason, run.model_calls) == ("FAILED", "limit_tokens", 0)


def test_a_retry_after_far_in_the_past_is_no_wait_not_an_overflow():
    from agentrt.driver import TransientError

    assert TransientError("busy", retry_after=-1e15).retry_after == timedelta(0)
    assert TransientError("busy", retry_after=-3).retry_after == timedelta(0)
