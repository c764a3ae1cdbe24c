"""Model calls: every attempt is a row, charged, limited before dispatch, retried with care.

The agent gets a :class:`ModelCaller` for its step. Before each attempt the
caller projects the run's limits (calls, tokens, cost) including other
attempts in flight, then commits the dispatch (a ``model_calls`` row and
``model.dispatched``) before the request leaves, and records the outcome
afterwards whatever the caller's cancellation says. An attempt whose outcome
is unknown (timeout, dropped connection, cancelled caller) is charged its
estimate, because the provider may have served it.
"""

from __future__ import annotations

import contextlib
import http.client
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

import apsw

from agentrt.driver.cancel import CancelToken
from agentrt.driver.checks import (
    MAX_WAIT,
    check_int,
    check_method,
    close_if_coroutine,
    fit,
    wait_duration,
)
from agentrt.driver.errors import (
    CancelledError,
    ConfigError,
    DriverFunctionError,
    LimitError,
    ModelUnavailableError,
    ServedError,
    TransientError,
    UnusableUsageError,
    _retry_after,
    find_cause,
)
from agentrt.driver.lease import Lease, WallClock, lost_to_another
from agentrt.driver.worker import call_in_thread
from agentrt.errors import (
    LeaseLostError,
    NotFoundError,
    RunStateError,
    SessionClosedError,
    described,
    exception_text,
    raised_text,
)
from agentrt.events import EventType, Observer
from agentrt.gojson import dumps, sorted_map
from agentrt.records import ModelCallStatus, Reason, RunStatus, ToolSpec, Usage, duration_ns
from agentrt.store import Store
from agentrt.store.writes import (
    MAX_INT64,
    add_model_totals,
    check_run,
    finish_model_call,
    insert_model_call,
)
from agentrt.timefmt import format_duration, format_time_nano

__all__ = [
    "Message",
    "Model",
    "ModelCaller",
    "ModelConfig",
    "ModelRequest",
    "ModelResponse",
    "Price",
    "ToolUse",
    "cost_micros",
    "estimate_input_tokens",
]

_NO_CAP = (
    "the request sets no output cap, so it cannot be projected; set MaxOutputTokens or "
    "Limits.MaxOutputTokensPerCall"
)


@dataclass(slots=True)
class Message:
    role: str
    content: str

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content}


@dataclass(slots=True)
class ModelRequest:
    """What the agent asks the model."""

    messages: list[Message] = field(default_factory=list)
    system: str = ""
    tools: list[ToolSpec] = field(default_factory=list)
    max_output_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.system:
            out["system"] = self.system
        out["messages"] = [m.to_json() for m in self.messages]
        if self.tools:
            out["tools"] = [t.to_json() for t in self.tools]
        if self.max_output_tokens:
            out["max_output_tokens"] = self.max_output_tokens
        return out


@dataclass(slots=True)
class ToolUse:
    """A tool call the model asked for; ``input`` is raw JSON."""

    id: str
    name: str
    input: bytes


@dataclass(slots=True)
class ModelResponse:
    text: str = ""
    tool_uses: list[ToolUse] = field(default_factory=list)
    stop_reason: str = ""
    usage: Usage = field(default_factory=Usage)
    raw: bytes | None = None


@runtime_checkable
class Model(Protocol):
    """A model adapter. ``generate`` should give up when ``cancel`` is done."""

    def name(self) -> str: ...

    def generate(self, request: ModelRequest, cancel: CancelToken) -> ModelResponse: ...


@dataclass(frozen=True, slots=True)
class Price:
    """Micros per million tokens."""

    input: int = 0
    output: int = 0
    cached_input: int = 0

    def __post_init__(self) -> None:
        for name in ("input", "output", "cached_input"):
            check_int(f"Price {name}", getattr(self, name))


_MODEL = "a Model (an object with name() and generate(request, cancel) methods)"


@dataclass(slots=True)
class ModelConfig:
    """The model and how calls to it are charged, timed and retried.

    ``max_retries`` is 0 by default: no retry unless asked for.
    """

    model: Model | None
    prices: Mapping[str, Price] = field(default_factory=dict)
    call_timeout: timedelta = timedelta(minutes=2)
    max_retries: int = 0
    backoff: timedelta = timedelta(seconds=1)
    max_retry_after: timedelta = timedelta(minutes=1)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse fields of the wrong type, or waits past a year (a model without
        one is refused by the Driver, as the reference does)."""
        if self.model is not None:
            check_method("ModelConfig model", self.model, ("name", "generate"), _MODEL)
        prices = self.prices
        if not isinstance(prices, Mapping):
            raise ConfigError(f"ModelConfig prices is {described(prices)}, not a mapping of "
                              "model name to Price")
        for name, price in prices.items():
            if not isinstance(name, str):
                raise ConfigError(f"ModelConfig prices: the key {described(name)} is not a "
                                  "model name (a str)")
            if not isinstance(price, Price):
                raise ConfigError(f'ModelConfig prices["{name}"] is {described(price)}, not '
                                  "a Price")
        for field_name in ("call_timeout", "backoff", "max_retry_after"):
            wait_duration(f"ModelConfig {field_name}", getattr(self, field_name),
                          seconds=False)
        check_int("ModelConfig max_retries", self.max_retries)

    def resolved(self) -> ModelConfig:
        """Zero values replaced by the defaults."""
        return replace(
            self,
            call_timeout=self.call_timeout if self.call_timeout > timedelta(0)
            else timedelta(minutes=2),
            max_retries=max(self.max_retries, 0),
            backoff=self.backoff if self.backoff > timedelta(0) else timedelta(seconds=1),
            max_retry_after=self.max_retry_after if self.max_retry_after > timedelta(0)
            else timedelta(minutes=1),
        )


def estimate_input_tokens(request: ModelRequest) -> int:
    """A conservative estimate: a token per three bytes of the request's JSON, plus one."""
    return len(dumps(request.to_json())) // 3 + 1


def _term(tokens: int, price: int) -> int:
    v = tokens * price // 1_000_000
    return max(0, min(v, MAX_INT64))


def cost_micros(price: Price | None, usage: Usage) -> int:
    """The charge for ``usage`` at ``price`` (0 for an unpriced model), saturating."""
    if price is None:
        return 0
    total = (
        _term(usage.input_tokens - usage.cached_input_tokens, price.input)
        + _term(usage.cached_input_tokens, price.cached_input)
        + _term(usage.output_tokens, price.output)
    )
    return min(total, MAX_INT64)


def _unusable(usage: object) -> str:
    if not isinstance(usage, Usage):
        return f"the usage is {described(usage)}, not a Usage"
    for name in ("input_tokens", "output_tokens", "cached_input_tokens"):
        count = getattr(usage, name)
        if not isinstance(count, int) or isinstance(count, bool):
            return f"{name} is {described(count)}, not an int"
    if usage.input_tokens < 0 or usage.output_tokens < 0 or usage.cached_input_tokens < 0:
        return "a token count is negative"
    if usage.cached_input_tokens > usage.input_tokens:
        return "more cached input tokens than input tokens"
    return ""


def _charged(usage: Usage) -> Usage:
    """A usable reported usage as recorded: each count saturating at max int64, so the
    event and the row (which holds no more) agree, as the run totals saturate."""
    return Usage(min(int(usage.input_tokens), MAX_INT64),
                 min(int(usage.output_tokens), MAX_INT64),
                 min(int(usage.cached_input_tokens), MAX_INT64))


_MICROSECOND = timedelta(microseconds=1)
_MAX_WAIT_US = MAX_WAIT // _MICROSECOND
#: A TLS connection closed or cut mid-reply is one too (``ssl.SSLEOFError`` is
#: Python's unexpected EOF there, which ``ConnectionError`` does not cover).
_CONNECTION_LOST = (ConnectionError, EOFError, TimeoutError, http.client.IncompleteRead,
                    ssl.SSLEOFError, ssl.SSLZeroReturnError)


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is, or wraps (as HTTP clients wrap a reset or a read timeout:
    ``__cause__`` or an argument), a lost connection or a timeout,
    as the reference's ``errors.Is`` finds one under wrapping. A refused
    connection is not one: the request never left, so nothing was served."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen or len(seen) > 32:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError):
            return False
        if isinstance(e, _CONNECTION_LOST):
            return True
        todo += [e.__cause__, *e.args]  # explicit wrapping only, as errors.Is
    return False


@dataclass(slots=True, eq=False)
class _Reservation:
    """One dispatched attempt's share of the limits; released by identity, once."""

    tokens: int
    cost: int


@dataclass(slots=True)
class InFlight:
    """The attempts of a run's model calls that are dispatched and not yet
    recorded, shared by the callers of every step of one loop: a call an agent
    left running past its step still counts against the limits of the next."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    reservations: list[_Reservation] = field(default_factory=list)


@dataclass(slots=True)
class _Attempt:
    status: str
    usage: Usage
    cost: int
    error: str
    response: ModelResponse | None = None
    retry: bool = False
    raise_: BaseException | None = None
    retry_after: timedelta | None = None


def _model_name(model: Model) -> str:
    """The model's ``name()``, which every attempt records and prices by. One that
    raises or is not a str makes the model unusable for the step (the run ends
    ``model_unavailable``), not a failure in the middle of the step's bookkeeping."""
    try:
        name = model.name()
    except Exception as exc:  # noqa: BLE001 - consumer code; said in the record
        raise ModelUnavailableError(0, raised_text("the model's name()", exc)) from exc
    if not isinstance(name, str):
        raise ModelUnavailableError(0, f"the model's name() returned {described(name)}, not a str")
    return name


def _bad_request(request: ModelRequest, exc: Exception) -> str:
    """Why a request cannot be encoded (so estimated, or sent), naming the field,
    rather than the encoder's ``'dict' object has no attribute 'to_json'``."""
    messages: object = request.messages
    if not isinstance(messages, (list, tuple)):
        return f"request messages is {described(messages)}, not a list of Message"
    for i, m in enumerate(messages):
        if not isinstance(m, Message):
            return f"request messages[{i}] is {described(m)}, not a Message"
        for name in ("role", "content"):
            if not isinstance(getattr(m, name), str):
                return (f"request messages[{i}] {name} is {described(getattr(m, name))}, "
                        "not a str")
    for name, kind in (("system", str), ("tools", list)):
        if not isinstance(getattr(request, name), kind):
            return f"request {name} is {described(getattr(request, name))}, not a {kind.__name__}"
    for i, t in enumerate(request.tools):
        if not isinstance(t, ToolSpec):
            return f"request tools[{i}] is {described(t)}, not a ToolSpec"
    return f"the request cannot be encoded: {exception_text(exc)}"


def _transient_retry_after(exc: TransientError) -> timedelta | None | str:
    """The error's Retry-After, or why it is unusable. Read as the constructor
    reads it: a subclass may skip ``__init__`` or set ``retry_after`` itself (to
    seconds, or a header's text), which would otherwise fail the retry loop
    after the attempt was recorded, or leave its row dispatched."""
    try:
        return _retry_after(getattr(exc, "retry_after", None))
    except (TypeError, OverflowError) as bad:
        return exception_text(bad)


def _lease_gone(lease: Lease) -> str:
    """Why a model call may not start: a lease that lapsed (a frozen process, a
    starved heartbeat) is said to have expired, as the session says it."""
    expires = lease.expires_at
    if lease.lost or expires is None:
        return "the lease is no longer held"
    return f"the lease expired at {format_time_nano(expires)}"


class ModelCaller:
    """The model as one step's agent sees it; safe to call from several threads."""

    def __init__(
        self,
        *,
        config: ModelConfig,
        store: Store,
        run_id: str,
        step_id: str,
        step_started_at: datetime | None,
        owner: str,
        lease: Lease,
        now: Callable[[], datetime],
        wall: WallClock,
        new_id: Callable[[], str],
        observer: Observer | None,
        cancel: CancelToken,
        in_flight: InFlight,
    ) -> None:
        assert config.model is not None
        self._config = config
        self._model = config.model
        self._name = _model_name(config.model)
        self._price = config.prices.get(self._name)
        self._store = store
        self._run_id = run_id
        self._step_id = step_id
        self._step_started_at = step_started_at
        self._owner = owner
        self._lease = lease
        self._now = now
        self._wall = wall
        self._new_id = new_id
        self._observer = observer
        self._cancel = cancel
        self._lock = in_flight.lock
        self._inflight = in_flight.reservations
        self._closed = False

    @property
    def name(self) -> str:
        return self._name

    def close(self) -> None:
        """End the caller with its step's decision: an attempt started later (from a
        thread the agent left running) is refused, so every call is charged and
        limited within its step. An attempt already dispatched still records."""
        with self._lock:
            self._closed = True

    def generate(self, request: ModelRequest) -> ModelResponse:
        """Call the model, retrying what is worth retrying.

        Raises LimitError before a dispatch that would break a limit,
        ModelUnavailableError when the model cannot be used, LeaseLostError when
        the run is no longer this driver's, CancelledError when the caller cancels.
        """
        if not isinstance(request, ModelRequest):
            raise ConfigError(f"request is {described(request)}, not a ModelRequest")
        cap = check_int("request max_output_tokens", request.max_output_tokens)
        run = self._store.get_run(self._run_id)
        per_call = run.limits.max_output_tokens_per_call
        if per_call > 0 and (cap <= 0 or cap > per_call):
            request = replace(request, max_output_tokens=per_call)
            cap = per_call
        try:
            estimate = Usage(estimate_input_tokens(request), max(cap, 0))
        except (AttributeError, TypeError, ValueError) as exc:
            raise ConfigError(_bad_request(request, exc)) from exc
        estimate_cost = cost_micros(self._price, estimate)
        attempts = self._config.max_retries + 1
        last = ""
        for attempt in range(1, attempts + 1):
            if self._cancel.done:  # cancelled, or the caller's deadline passed (its timer may lag)
                raise CancelledError(self._cancel.reason)
            if not self._lease.ok():
                raise self._lease_lost()
            reservation = self._reserve(cap, estimate, estimate_cost)
            try:
                outcome = self._attempt(attempt, request, estimate, estimate_cost, reservation)
            finally:
                self._release(reservation)
            if outcome.response is not None and outcome.raise_ is None:
                return outcome.response
            if outcome.raise_ is not None:
                raise outcome.raise_
            last = outcome.error
            if attempt == attempts:
                break
            wait = self._retry_wait(attempt, outcome)
            if wait is None:
                raise ModelUnavailableError(attempt, last)
            if self._cancel.wait(wait.total_seconds()):
                raise CancelledError(self._cancel.reason)
        raise ModelUnavailableError(attempts, last)

    # -- limits --------------------------------------------------------------

    def _reserve(self, cap: int, estimate: Usage, estimate_cost: int) -> _Reservation:
        # The store's lock, then the callers': the order _record takes them in, so
        # the run's committed totals and the reservations are read as one state.
        with self._store.locked(), self._lock:
            if self._closed:
                raise SessionClosedError(
                    f"the model caller of step {self._step_id} was used after the step's "
                    "decision was made; call the model from within decide()")
            run = self._store.get_run(self._run_id)
            limits = run.limits
            calls = run.model_calls + len(self._inflight)
            tokens = run.usage.input_tokens + run.usage.output_tokens + sum(
                r.tokens for r in self._inflight)
            cost = run.estimated_cost_micros + sum(r.cost for r in self._inflight)
            if limits.max_model_calls > 0 and calls >= limits.max_model_calls:
                raise LimitError(Reason.LIMIT_MODEL_CALLS.value,
                                 f"{calls} model calls made, limit {limits.max_model_calls}")
            if cap <= 0:
                if limits.max_total_tokens > 0:
                    raise LimitError(Reason.LIMIT_TOKENS.value, _NO_CAP)
                if limits.max_estimated_cost_micros > 0 and self._price is not None:
                    raise LimitError(Reason.LIMIT_COST.value, _NO_CAP)
            projected = tokens + estimate.input_tokens + estimate.output_tokens
            if limits.max_total_tokens > 0 and projected > limits.max_total_tokens:
                raise LimitError(Reason.LIMIT_TOKENS.value,
                                 f"projected {projected} tokens, limit {limits.max_total_tokens}")
            projected_cost = cost + estimate_cost
            if (limits.max_estimated_cost_micros > 0
                    and projected_cost > limits.max_estimated_cost_micros):
                raise LimitError(
                    Reason.LIMIT_COST.value,
                    f"projected cost {projected_cost} micros, limit "
                    f"{limits.max_estimated_cost_micros}")
            reservation = _Reservation(estimate.input_tokens + estimate.output_tokens,
                                       estimate_cost)
            self._inflight.append(reservation)
            return reservation

    def _release(self, reservation: _Reservation) -> None:
        with self._lock:
            if reservation in self._inflight:  # by identity (eq=False): once
                self._inflight.remove(reservation)

    def _retry_wait(self, attempt: int, outcome: _Attempt) -> timedelta | None:
        """The wait before the next attempt, or None when it cannot usefully be waited."""
        cfg = self._config
        # Backoff doubles per attempt; a wait past a year is not waited (nor, with
        # many retries, computed into an overflow): every backoff is >= 1 µs, and
        # 1 µs doubled 64 times is far past a year.
        backoff_us = cfg.backoff // _MICROSECOND
        if attempt > 64 or backoff_us << (attempt - 1) > _MAX_WAIT_US:
            return None
        wait = cfg.backoff * (1 << (attempt - 1))
        retry_after = outcome.retry_after
        if retry_after is not None:
            if retry_after > cfg.max_retry_after:
                return None
            wait = max(wait, retry_after)
        deadline = self._cancel.deadline
        if deadline is not None and time.monotonic() + wait.total_seconds() >= deadline:
            return None
        run = self._store.get_run(self._run_id)
        limits = run.limits
        if limits.max_elapsed_time > timedelta(0) or limits.max_active_time > timedelta(0):
            now = self._now()
            if (limits.max_elapsed_time > timedelta(0) and run.created_at is not None
                    and now + wait - run.created_at >= limits.max_elapsed_time):
                return None
            if limits.max_active_time > timedelta(0):
                active_ns = run.active_ms * 1_000_000  # a timedelta of it could overflow
                if self._step_started_at is not None:
                    active_ns += max(duration_ns(now - self._step_started_at), 0)
                if active_ns + duration_ns(wait) >= duration_ns(limits.max_active_time):
                    return None
        return wait

    def _lease_lost(self) -> LeaseLostError:
        """Why no attempt may start once the lease is gone: the owner that holds
        the run now when the heartbeat found one, as the dispatch's write would."""
        if self._lease.lost:
            with contextlib.suppress(NotFoundError):
                taken = lost_to_another(self._store.get_run(self._run_id), self._owner)
                if taken is not None:
                    return taken
        return LeaseLostError(f"run {self._run_id}: {_lease_gone(self._lease)}")

    # -- one attempt ---------------------------------------------------------

    def _attempt(self, attempt: int, request: ModelRequest, estimate: Usage,
                 estimate_cost: int, reservation: _Reservation) -> _Attempt:
        call_id = self._new_id()
        dispatched_at = self._now()
        try:
            with self._store.tx(self._observer, own_writes=True) as tx:
                check_run(tx, self._run_id, (RunStatus.RUNNING.value,), owner=self._owner,
                          live_at=self._wall())
                insert_model_call(tx, call_id, self._run_id, self._step_id, attempt,
                                  self._name, dispatched_at)
                tx.append(self._run_id, self._step_id, dispatched_at,
                          EventType.MODEL_DISPATCHED.value,
                          {"attempt": attempt, "call_id": call_id, "model": self._name})
        except LeaseLostError:
            raise
        except RunStateError as exc:  # another owner (named, and the cause), or the run ended
            raise LeaseLostError(exc.detail) from exc
        except NotFoundError as exc:
            raise LeaseLostError(f"run {self._run_id} is no longer in the database") from exc
        except apsw.TooBigError as exc:  # nothing was written: only the name is the model's
            raise ModelUnavailableError(attempt, (
                f"the model's name ({len(self._name)} characters) is too large to store "
                f"({exc})")) from None
        token = self._cancel.child(timeout=self._config.call_timeout.total_seconds())
        model = self._model
        try:
            out = call_in_thread(lambda: model.generate(request, token),
                                 self._config.call_timeout.total_seconds(),
                                 f"agentrt-model-{call_id[:8]}", stop=self._cancel)
        except BaseException as exc:
            token.cancel("interrupted")  # the wait ended (a Ctrl-C), not the call: stop it
            if isinstance(exc, Exception):  # no thread to run it on: the request never left
                text = raised_text("starting the model call", exc)
                abandoned = _Attempt(ModelCallStatus.ERROR.value, Usage(), 0, text)
            else:  # the request left: charge it as any abandoned attempt
                abandoned = _Attempt(ModelCallStatus.AMBIGUOUS.value, estimate, estimate_cost,
                                     "abandoned when its caller stopped (interrupted)")
            with contextlib.suppress(Exception):  # the interrupt is what the caller must see
                try:
                    completed_at = self._now()
                except Exception:  # noqa: BLE001 - a failing clock must not mask the interrupt
                    completed_at = dispatched_at
                latency = max(int((completed_at - dispatched_at) / timedelta(milliseconds=1)), 0)
                self._record(call_id, attempt, abandoned, latency, completed_at, reservation)
            raise
        finally:
            self._cancel.release(token)
        if out is None:
            token.cancel(self._cancel.reason if self._cancel.done else "deadline exceeded")
        clock_failed: DriverFunctionError | None = None
        try:
            completed_at = self._now()
        except DriverFunctionError as exc:  # the call was made: recorded, then the driver stops
            clock_failed, completed_at = exc, dispatched_at
        latency = max(int((completed_at - dispatched_at) / timedelta(milliseconds=1)), 0)
        try:
            result = self._classify(attempt, out, estimate, estimate_cost, token)
        except Exception as exc:  # noqa: BLE001 - a hostile reply; the row must not stay dispatched
            text = raised_text("reading the model's reply", exc)
            result = _Attempt(ModelCallStatus.ERROR.value, estimate, estimate_cost, text,
                              raise_=ModelUnavailableError(attempt, text))
        self._record(call_id, attempt, result, latency, completed_at, reservation)
        if clock_failed is not None:
            raise clock_failed
        return result

    def _classify(self, attempt: int, out: Any, estimate: Usage, estimate_cost: int,
                  token: CancelToken) -> _Attempt:
        ambiguous = ModelCallStatus.AMBIGUOUS.value
        error = ModelCallStatus.ERROR.value
        if out is None:
            if self._cancel.done:  # abandoned: the caller stopped (a cancel, its deadline)
                text = f"abandoned when its caller stopped ({self._cancel.reason})"
                return _Attempt(ambiguous, estimate, estimate_cost, text,
                                raise_=CancelledError(self._cancel.reason))
            text = (f"no reply within the call timeout of "
                    f"{format_duration(duration_ns(self._config.call_timeout))}")
            return _Attempt(ambiguous, estimate, estimate_cost, text, retry=True)
        exc = out.error
        if exc is None:
            response = out.value
            if not isinstance(response, ModelResponse):
                close_if_coroutine(response)
                text = f"the model returned {type(response).__name__}, not a ModelResponse"
                return _Attempt(error, Usage(), 0, text,
                                raise_=ModelUnavailableError(attempt, text))
            why = _unusable(response.usage)
            if why:
                text = f"unusable usage: {why}"
                return _Attempt(error, estimate, estimate_cost, text,
                                raise_=ModelUnavailableError(attempt, text))
            usage = _charged(response.usage)
            done = _Attempt(ModelCallStatus.OK.value, usage, cost_micros(self._price, usage), "",
                            response=response)
            if self._cancel.done:  # cancelled, or the caller's deadline passed
                done.raise_ = CancelledError(self._cancel.reason)
            return done
        text = exception_text(exc)
        # Each signal is found where an adapter raised it, or under the error it
        # wrapped it in (``raise ... from``), as the reference's errors.As finds it.
        unusable = find_cause(exc, UnusableUsageError)
        if unusable is not None:
            text = exception_text(unusable)
            if not text.startswith("unusable usage"):
                text = f"unusable usage: {text}"
            return _Attempt(error, estimate, estimate_cost, text,
                            raise_=ModelUnavailableError(attempt, text))
        served_error = find_cause(exc, ServedError)
        if served_error is not None:
            # getattr: a subclass that skips ServedError.__init__ has no usage; it
            # was still served, so it is charged the estimate, not left dispatched.
            served: object = getattr(served_error, "usage", None)
            why = _unusable(served)
            if isinstance(served, Usage) and not why:
                usage = _charged(served)
                cost = cost_micros(self._price, usage)
            else:  # said, so the record does not read as the provider's own count
                usage, cost = estimate, estimate_cost
                text = f"{text} (unusable usage: {why}; charged the estimate)"
            return _Attempt(error, usage, cost, text,
                            raise_=ModelUnavailableError(attempt, text))
        if self._cancel.done:  # cancelled, or the caller's deadline passed (its timer may lag)
            return _Attempt(ambiguous, estimate, estimate_cost, text,
                            raise_=CancelledError(self._cancel.reason))
        if _connection_lost(exc) or token.timed_out:
            # a connection lost, or an adapter that gave up at the attempt's
            # deadline (as Model asks): the provider may have served it
            return _Attempt(ambiguous, estimate, estimate_cost, text, retry=True)
        transient = find_cause(exc, TransientError)
        if transient is not None:
            after = _transient_retry_after(transient)
            if isinstance(after, str):
                text = f"{text} ({after})"
                return _Attempt(error, Usage(), 0, text,
                                raise_=ModelUnavailableError(attempt, text))
            return _Attempt(error, Usage(), 0, text, retry=True, retry_after=after)
        return _Attempt(error, Usage(), 0, text, raise_=ModelUnavailableError(attempt, text))

    def _record(self, call_id: str, attempt: int, result: _Attempt, latency: int,
                completed_at: datetime, reservation: _Reservation) -> None:
        """Commit the attempt's row, the run totals and its event; never cancelled.

        The reservation is released inside the transaction, under the store's
        lock: no other caller sees the committed charge and the reservation
        together, which would count the attempt twice."""
        u = result.usage
        kind = (EventType.MODEL_COMPLETED if result.status == ModelCallStatus.OK
                else EventType.MODEL_FAILED)

        def write(error: str) -> None:
            payload = sorted_map({
                "attempt": attempt,
                "call_id": call_id,
                "cost_micros": result.cost,
                "error": error,
                "latency_ms": latency,
                "model": self._name,
                "status": result.status,
                "usage": u.to_json(),
            })
            with self._store.tx(self._observer, own_writes=True) as tx:
                finish_model_call(tx, call_id, result.status, u.input_tokens, u.output_tokens,
                                  u.cached_input_tokens, result.cost, latency, error,
                                  completed_at)
                add_model_totals(tx, self._run_id, u.input_tokens, u.output_tokens,
                                 u.cached_input_tokens, result.cost)
                tx.append(self._run_id, self._step_id, completed_at, kind.value, payload)
                self._release(reservation)

        # A model's error text too large to store is clipped: unrecorded, the
        # attempt's row stayed dispatched and its charge uncounted.
        fit(write, result.error)
