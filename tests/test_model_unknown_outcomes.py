"""Attempts whose outcome the caller cannot know are ambiguous (spec 9): charged
their estimate and retried, however the adapter reports them.

An adapter that gives up when its attempt token's deadline passes (as the
``Model`` protocol asks) and an HTTP client that wraps a reset connection in its
own exception class both leave the provider's side unknown: it may have served
and billed the request.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from _driver_kit import fixture_tools, limits

from agentrt.driver import (
    AgentFunc,
    CancelledError,
    CancelToken,
    DefaultPolicy,
    Driver,
    ModelConfig,
    ModelRequest,
    ModelResponse,
)
from agentrt.records import Decision, RunStatus, Usage
from agentrt.store import open_store
from agentrt.testing import ModelToolAgent


class _FirstAttemptsFail:
    """A model whose first ``failing`` attempts run ``first``; later ones reply."""

    def __init__(self, first: Any, failing: int = 1) -> None:
        self.first, self.failing, self.calls = first, failing, 0

    def name(self) -> str:
        return "m"

    def generate(self, request: Any, cancel: Any) -> ModelResponse:
        self.calls += 1
        if self.calls <= self.failing:
            self.first(cancel)
        return ModelResponse(text="done", usage=Usage(10, 2))


def _run(model: _FirstAttemptsFail, **config: Any) -> tuple[Any, list[tuple[str, bytes]]]:
    store = open_store(":memory:")
    cfg = ModelConfig(model, max_retries=model.failing, backoff=timedelta(milliseconds=1),
                      **config)
    run = Driver(store, ModelToolAgent(), DefaultPolicy(), fixture_tools(), model=cfg).start(
        "g", limits(), run_id="r")
    return run, [(e.type, e.payload) for e in store.list_events("r")
                 if e.type.startswith("model.")]


def _gives_up_at_its_deadline(cancel: Any) -> None:
    cancel.wait()
    raise CancelledError(cancel.reason)


def test_attempts_that_give_up_at_their_deadline_are_ambiguous_charged_and_retried() -> None:
    # Three attempts: the adapter's own error and the driver's wait for the
    # call end together, and each attempt is a chance for the adapter's to win.
    model = _FirstAttemptsFail(_gives_up_at_its_deadline, failing=3)
    run, events = _run(model, call_timeout=timedelta(milliseconds=100))
    assert [t for t, _ in events] == ["model.dispatched", "model.failed"] * 3 + [
        "model.dispatched", "model.completed"]
    for _, failed in events[1:6:2]:
        assert b'"status":"ambiguous"' in failed
        assert b'"input_tokens":0' not in failed  # charged the estimate, not nothing
    assert run.status == RunStatus.COMPLETED
    assert model.calls == 4


def _resetting_server() -> int:
    """A provider that reads one request and resets the connection (RST)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with server:
            conn, _ = server.accept()
            conn.recv(65536)  # the request arrived: the provider may have served it
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(server.getsockname()[1])


def test_a_reset_connection_wrapped_by_an_http_client_is_ambiguous_and_retried() -> None:
    port = _resetting_server()

    def post(cancel: Any) -> None:
        requests.post(f"http://127.0.0.1:{port}/v1", json={"x": 1}, timeout=5)

    model = _FirstAttemptsFail(post)
    run, events = _run(model)
    failed = events[1][1]
    assert events[1][0] == "model.failed"
    assert b'"status":"ambiguous"' in failed
    assert run.status == RunStatus.COMPLETED
    assert model.calls == 2


def test_an_error_that_only_mentions_no_connection_stays_an_error_and_is_not_retried() -> None:
    def refuse(cancel: Any) -> None:
        raise ValueError("bad request: no connection header")

    model = _FirstAttemptsFail(refuse)
    run, events = _run(model)
    assert b'"status":"error"' in events[1][1]
    assert run.status == RunStatus.FAILED and model.calls == 1


def _refused_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        return int(closed.getsockname()[1])


def _post_to_nobody(cancel: Any) -> None:
    requests.post(f"http://127.0.0.1:{_refused_port()}/v1", json={"x": 1}, timeout=5)


def _refused(cancel: Any) -> None:
    raise ConnectionRefusedError(111, "Connection refused")


@pytest.mark.parametrize("attempt", [_post_to_nobody, _refused], ids=["wrapped", "bare"])
def test_a_refused_connection_never_reached_the_provider_and_is_an_uncharged_error(
        attempt: Any) -> None:
    model = _FirstAttemptsFail(attempt)
    run, events = _run(model)
    failed = events[1][1]
    assert b'"status":"error"' in failed and b'"cost_micros":0' in failed
    assert b'"input_tokens":0,"output_tokens":0' in failed
    assert run.status == RunStatus.FAILED and model.calls == 1


class _Deaf:
    """A model that ignores its token and answers late."""

    def name(self) -> str:
        return "m"

    def generate(self, request: Any, cancel: Any) -> ModelResponse:
        time.sleep(2)
        raise RuntimeError("late")


def test_the_callers_deadline_stops_the_wait_on_a_model_that_ignores_its_token() -> None:
    def decide(step: Any) -> Decision:
        step.model.generate(ModelRequest())
        return Decision.complete()

    store = open_store(":memory:")
    driver = Driver(store, AgentFunc(decide), DefaultPolicy(), [],
                    model=ModelConfig(_Deaf(), call_timeout=timedelta(seconds=60)))
    started = time.monotonic()
    with pytest.raises(CancelledError):
        driver.start("g", limits(), run_id="r", cancel=CancelToken(timeout=0.3))
    assert time.monotonic() - started < 1.5
    failed = [e.payload for e in store.list_events("r") if e.type == "model.failed"]
    assert len(failed) == 1 and b'"status":"ambiguous"' in failed[0]
    assert b"abandoned when its caller stopped (deadline exceeded)" in failed[0]


def _asks_the_model_once(step: Any) -> Decision:
    step.model.generate(ModelRequest(max_output_tokens=10))
    return Decision.complete()


class _Polite:
    """A model that gives up when its token is done, as the protocol asks."""

    def name(self) -> str:
        return "m"

    def generate(self, request: Any, cancel: Any) -> ModelResponse:
        cancel.wait(5)
        raise TimeoutError(f"request abandoned: {cancel.reason}")


class _LateTimer(threading.Timer):
    """The deadline's timer fires a second late, as a busy host can make it."""

    def __init__(self, interval: float, *args: Any, **kwargs: Any) -> None:
        super().__init__(interval + 1.0, *args, **kwargs)


@pytest.mark.parametrize("max_retries", [0, 2])
def test_the_callers_deadline_is_a_cancel_before_its_timer_fires(monkeypatch, max_retries):
    """An adapter that honours its token gives up at the deadline, which can be
    before the timer cancelling the loop fires: the run is left for a resume,
    never failed as model_unavailable (spec 9: a caller's cancel is ambiguous)."""
    monkeypatch.setattr(threading, "Timer", _LateTimer)
    store = open_store(":memory:")
    driver = Driver(store, AgentFunc(_asks_the_model_once), DefaultPolicy(), [],
                    model=ModelConfig(_Polite(), max_retries=max_retries,
                                      backoff=timedelta(milliseconds=1)))
    with pytest.raises(CancelledError):
        driver.start("g", limits(), run_id="r", cancel=CancelToken(timeout=0.2))
    assert store.get_run("r").status == RunStatus.RUNNING
    assert [c.status for c in store.list_model_calls("r")] == ["ambiguous"]


def test_no_attempt_is_dispatched_once_the_callers_deadline_passed(monkeypatch):
    """The agent thinks past the deadline and the timer is late: no request is sent
    (and paid for) only to be thrown away."""
    def decide(step: Any) -> Decision:
        time.sleep(0.3)
        step.model.generate(ModelRequest(max_output_tokens=10))
        return Decision.complete()

    monkeypatch.setattr(threading, "Timer", _LateTimer)
    model = _Served()
    store = open_store(":memory:")
    driver = Driver(store, AgentFunc(decide), DefaultPolicy(), [], model=ModelConfig(model))
    with pytest.raises(CancelledError):
        driver.start("g", limits(), run_id="r", cancel=CancelToken(timeout=0.2))
    assert store.list_model_calls("r") == [] and model.calls == 0


class _Served:
    """Served after ``delay`` seconds, and charged for it; counts what it served."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay, self.calls = delay, 0

    def name(self) -> str:
        return "m"

    def generate(self, request: Any, cancel: Any) -> ModelResponse:
        time.sleep(self.delay)
        self.calls += 1
        return ModelResponse(text="ok", usage=Usage(100, 10))


def test_a_ctrl_c_during_a_model_call_charges_it_and_a_resume_counts_it() -> None:
    """The request left before the interrupt: the attempt is recorded ambiguous and
    charged, not left dispatched and uncounted for a resume to exceed the limit."""
    import _thread

    store = open_store(":memory:")
    driver = Driver(store, AgentFunc(_asks_the_model_once), DefaultPolicy(), [],
                    model=ModelConfig(_Served(0.5)))
    threading.Timer(0.2, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        driver.start("g", limits(max_model_calls=1), run_id="r")
        time.sleep(1)  # the interrupt lands here if the call was not interrupted
    calls = store.list_model_calls("r")
    assert [c.status for c in calls] == ["ambiguous"]
    assert store.get_run("r").model_calls == 1 and calls[0].usage.output_tokens > 0
    time.sleep(0.5)  # the provider has answered by now
    run = driver.resume("r")
    assert len(store.list_model_calls("r")) == 1
    assert (run.status, run.reason) == (RunStatus.FAILED, "limit_model_calls")


def _refused_after_a_reset(cancel: Any) -> None:
    """A stale keep-alive socket resets; the adapter reconnects and the provider
    answers 401: a definite refusal, raised while handling the reset."""
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError:
        raise RuntimeError("401 Unauthorized: invalid API key")  # noqa: B904 - the point


def test_an_error_raised_while_handling_a_reset_is_an_error_not_ambiguous() -> None:
    model = _FirstAttemptsFail(_refused_after_a_reset)
    run, events = _run(model)
    assert b'"status":"error"' in events[1][1]
    assert run.status == RunStatus.FAILED and model.calls == 1


class _Unauthorized(Exception):
    def __init__(self, *, status: int) -> None:
        super().__init__()
        self.status = status


def _refused_without_a_message_after_a_reset(cancel: Any) -> None:
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError:
        raise _Unauthorized(status=401)  # noqa: B904 - the point: not wrapped


def test_an_error_without_arguments_raised_while_handling_a_reset_is_an_error_too() -> None:
    model = _FirstAttemptsFail(_refused_without_a_message_after_a_reset)
    run, events = _run(model)
    assert b'"status":"error"' in events[1][1]
    assert run.status == RunStatus.FAILED and model.calls == 1


def test_a_ctrl_c_is_what_the_caller_sees_even_when_the_clock_then_fails() -> None:
    """Recording the interrupted attempt reads the clock; a consumer's clock that
    fails then must not replace the KeyboardInterrupt."""
    import _thread

    interrupted = threading.Event()

    def now() -> datetime:
        if interrupted.is_set():
            raise RuntimeError("clock service unreachable")
        return datetime.now(UTC)

    def fire() -> None:
        interrupted.set()
        _thread.interrupt_main()

    store = open_store(":memory:")
    driver = Driver(store, AgentFunc(_asks_the_model_once), DefaultPolicy(), [], now=now,
                    model=ModelConfig(_Served(0.5)))
    threading.Timer(0.2, fire).start()
    with pytest.raises(KeyboardInterrupt):
        driver.start("g", limits(), run_id="r")
        time.sleep(1)


def test_a_model_thread_that_could_not_start_is_an_uncharged_error(monkeypatch) -> None:
    """No thread, no request: not an interrupted request charged its estimate."""
    from agentrt.driver import model as model_module

    def no_thread(fn: Any, timeout: Any, name: str, stop: Any = None) -> Any:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(model_module, "call_in_thread", no_thread)
    store = open_store(":memory:")
    driver = Driver(store, AgentFunc(_asks_the_model_once), DefaultPolicy(), [],
                    model=ModelConfig(_Served(0.5)))
    run = driver.start("g", limits(), run_id="r")
    assert (run.status, run.reason) == (RunStatus.FAILED, "agent_error")
    (call,) = store.list_model_calls("r")
    assert (call.status, call.usage) == ("error", Usage())
    assert call.error == "starting the model call raised RuntimeError: can't start new thread"
