"""Helpers for testing agents built on the runtime, and for our own fixtures.

Plain objects, no mocks: a :class:`ScriptedAgent` that answers each step from a
fixed list, a :class:`ScriptedModel` with canned replies and errors (a 429
with Retry-After among them), a :class:`FakeClock` that counts its readings, a
:class:`MemoryObserver` that keeps every event it is handed, and
:func:`static_tool` for a tool that always returns the same content.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from agentrt.driver.agent import StepInput
from agentrt.driver.cancel import CancelToken
from agentrt.driver.errors import TransientError
from agentrt.driver.model import Message, ModelRequest, ModelResponse
from agentrt.driver.tools import FuncTool, ToolCall, ToolResult
from agentrt.errors import described
from agentrt.events import Event
from agentrt.gojson import dumps
from agentrt.records import Decision, SideEffect

__all__ = [
    "FakeClock",
    "MemoryObserver",
    "ModelToolAgent",
    "ScriptExhausted",
    "ScriptedAgent",
    "ScriptedModel",
    "rate_limited",
    "static_tool",
]

_T = TypeVar("_T")

#: A scripted entry: a decision, a function of the step's input, or an exception to raise;
#: None holds the place of a step a resumed run will not ask for again.
Entry = Decision | Callable[[StepInput], Decision] | BaseException | None


class ScriptExhausted(Exception):
    """The agent was asked for a step its script does not have."""


class ScriptedAgent:
    """Answers step ``i`` with ``script[i]``, so a resumed run picks up where it was."""

    def __init__(self, script: Sequence[Entry]) -> None:
        if isinstance(script, (Decision, str, bytes)) or not isinstance(script, Iterable):
            raise TypeError(f"ScriptedAgent takes a list of decisions (or functions of the "
                            f"step input, or exceptions); it was given {described(script)}")
        self.script = list(script)
        self.inputs: list[StepInput] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.inputs)

    def decide(self, step: StepInput) -> Decision:
        with self._lock:
            self.inputs.append(step)
        index = step.index
        if index >= len(self.script):
            raise ScriptExhausted(f"no decision scripted for step {index}")
        entry = self.script[index]
        if isinstance(entry, BaseException):
            raise entry
        if isinstance(entry, Decision):
            return entry
        if entry is None:  # the place of a step a resumed run was not to ask again
            raise ScriptExhausted(f"no decision scripted for step {index}: its entry is None")
        if not callable(entry):  # else recorded as "'str' object is not callable"
            raise TypeError(f"the script's entry for step {index} is {described(entry)}, "
                            "not a Decision, a function of the step input or an exception")
        return entry(step)


class ScriptedModel:
    """A model that returns ``replies`` in order (an exception entry is raised).

    Thread-safe; every request it was handed is kept in ``requests``.
    """

    def __init__(self, replies: Sequence[ModelResponse | BaseException],
                 name: str = "scripted-model") -> None:
        self.replies = list(replies)
        self.requests: list[ModelRequest] = []
        self._name = name
        self._lock = threading.Lock()

    def name(self) -> str:
        return self._name

    def generate(self, request: ModelRequest, cancel: CancelToken) -> ModelResponse:
        with self._lock:
            index = len(self.requests)
            self.requests.append(request)
        if index >= len(self.replies):
            raise ScriptExhausted(f"no reply scripted for call {index}")
        reply = self.replies[index]
        if isinstance(reply, BaseException):
            raise reply
        return reply


def rate_limited(retry_after: timedelta | None = None,
                 message: str = "429 slow down") -> TransientError:
    """The error a provider's 429 becomes: transient, with an optional Retry-After."""
    return TransientError(message, retry_after=retry_after)


class ModelToolAgent:
    """Asks the model once per step: acts on the first tool use, completes on text.
    Its decisions name no origin, as the reference's fixture agent's do."""

    def __init__(self, max_output_tokens: int = 256) -> None:
        self.max_output_tokens = max_output_tokens

    def decide(self, step: StepInput) -> Decision:
        if step.model is None:
            raise RuntimeError("ModelToolAgent needs a driver configured with a model")
        messages = [Message("user", step.run.goal)]
        for past in step.steps:
            if past.observation is not None:
                messages.append(Message("tool", past.observation.summary))
        reply = step.model.generate(ModelRequest(
            messages=messages, tools=step.tools, max_output_tokens=self.max_output_tokens))
        if reply.tool_uses:
            use = reply.tool_uses[0]
            return Decision.tool_call(use.name, use.input)
        return Decision.complete(dumps({"text": reply.text}))


class FakeClock:
    """A clock that moves only when told to (or by ``step`` per reading) and counts
    its readings."""

    def __init__(self, start: datetime | None = None, step: timedelta = timedelta(0)) -> None:
        self._t = _checked("FakeClock start", start, datetime) if start is not None else \
            datetime(2026, 10, 1, 9, 0, tzinfo=UTC)
        self.step = _checked("FakeClock step", step, timedelta)
        self.readings = 0
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            self.readings += 1
            t = self._t
            self._t = t + self.step
            return t

    def peek(self) -> datetime:
        """The time the next reading returns, without counting a reading."""
        with self._lock:
            return self._t

    def advance(self, d: timedelta) -> None:
        _checked("FakeClock.advance", d, timedelta)
        with self._lock:
            self._t += d

    def set(self, t: datetime) -> None:
        _checked("FakeClock.set", t, datetime)
        with self._lock:
            self._t = t


def _checked(name: str, value: object, kind: type[_T]) -> _T:
    """``value`` if it is a ``kind``; else a TypeError saying so when the clock is
    set, not a TypeError from ``+`` when the driver first reads it."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} is {described(value)}, not a {kind.__name__}")
    return value


class MemoryObserver:
    """Keeps every event delivered to it, in delivery order."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def types(self) -> list[str]:
        with self._lock:
            return [e.type for e in self.events]


def static_tool(
    name: str,
    side_effect: str = SideEffect.READ_ONLY.value,
    *,
    content: bytes | str = b'{"ok":true}',
    summary: str | None = None,
    input_schema: bytes | str = b'{"type":"object"}',
    timeout: timedelta | float = timedelta(seconds=5),
    terminal: bool = False,
    calls: list[ToolCall] | None = None,
) -> FuncTool:
    """A tool that returns ``content`` with the summary ``<name> done``; each call is
    appended to ``calls`` when given."""
    shown = f"{name} done" if summary is None else summary

    def fn(call: ToolCall) -> ToolResult:
        if calls is not None:
            calls.append(call)
        return ToolResult(content, shown)

    return FuncTool(name, fn, description=f"the {name} tool", input_schema=input_schema,
                    side_effect=side_effect, timeout=timeout, terminal=terminal)
