"""Running one tool call under its time limit and turning its outcome into an observation.

Whatever the tool does (returns, raises, aborts, hangs past its timeout,
returns bytes that are not JSON) becomes an observation the agent can read on
its next step; none of it reaches the loop as an exception.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentrt.canonical import check_and_hash
from agentrt.driver.cancel import CancelToken
from agentrt.driver.checks import close_if_coroutine
from agentrt.driver.errors import AbortRun, ToolError
from agentrt.driver.session import observation
from agentrt.driver.tools import Tool, ToolCall, ToolResult
from agentrt.driver.worker import Worker
from agentrt.errors import exception_text
from agentrt.records import Observation, ObservationKind, ToolSpec, duration_ns
from agentrt.timefmt import format_duration

__all__ = ["ToolOutcome", "run_tool"]

_ERROR = ObservationKind.TOOL_ERROR.value
_RESULT = ObservationKind.TOOL_RESULT.value


@dataclass(slots=True)
class ToolOutcome:
    observation: Observation
    duration_ms: int
    #: The content bytes as the tool returned them (a terminal tool's run result).
    content: bytes = b""
    #: Set when the tool raised AbortRun: the run ends ``tool_abort`` with it.
    abort: str | None = None
    #: The caller was done (cancelled, or past its deadline) when the tool ended.
    cancelled: bool = False


def _failure(name: str, failure: str, error: str) -> Observation:
    return observation(_ERROR, {"error": error, "failure": failure, "tool": name},
                       f"{name} {failure}: {error}")


def _content(name: str, value: object) -> tuple[Observation, bytes]:
    if isinstance(value, ToolResult):
        raw, summary = value.content, value.summary
        if not isinstance(summary, str):
            msg = f"the tool's summary is a {type(summary).__name__}, not a str"
            return _failure(name, "error", msg), b""
        if raw is not None and not isinstance(raw, (bytes, str)):
            msg = f"the tool's content is a {type(raw).__name__}, not JSON as bytes or str"
            return _failure(name, "error", msg), b""
    elif isinstance(value, (bytes, str)) or value is None:
        raw, summary = value, ""
    else:
        close_if_coroutine(value)
        msg = f"the tool returned {type(value).__name__}, not a ToolResult"
        return _failure(name, "error", msg), b""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data is None or not data.strip():
        data = b"{}"
    problem, digest = check_and_hash(data)
    if problem is not None:
        error = f"content is not usable JSON: {problem}"
        fields = {"error": error, "failure": "invalid_content", "tool": name}
        try:
            fields["content"] = data.decode("utf-8")
        except UnicodeDecodeError:
            fields["content_base64"] = base64.b64encode(data).decode("ascii")
        return observation(_ERROR, fields, f"{name} returned {error}"), b""
    obs = Observation(_RESULT, data, summary, digest)
    return obs, data


def run_tool(worker: Worker, tool: Tool, spec: ToolSpec, run_id: str, step_id: str,
             args: bytes, caller: CancelToken,
             monotonic: Callable[[], float] = time.monotonic) -> ToolOutcome:
    """Call ``tool`` on the session's worker; stop waiting at ``spec.timeout``, or
    once the caller is done (cancelled or past its deadline): a tool that ignores
    its token is then abandoned, and recorded as cancelled, not timed out.

    ``duration_ms`` is measured on ``monotonic`` (read once before, once after).
    """
    name = spec.name
    timeout = spec.timeout.total_seconds()
    token = caller.child(timeout=timeout)
    call = ToolCall(run_id, step_id, args, token)
    started = monotonic()
    try:
        out = worker.call(tool.call, timeout, call, stop=caller)
    except BaseException:
        # A Ctrl-C (or another BaseException) ended the wait, not the tool: the call
        # is abandoned, so ask it to stop, as at its timeout.
        token.cancel("interrupted")
        raise
    finally:
        caller.release(token)
    duration_ms = int((monotonic() - started) * 1000)
    if out is None:
        if caller.done:  # cancelled, or its deadline passed before the timer said so
            reason = caller.reason
            token.cancel(reason)
            return _cancelled(name, f"abandoned when its caller stopped ({reason})",
                              duration_ms)
        token.cancel("deadline exceeded")
        error = f"no outcome within the timeout of {format_duration(duration_ns(spec.timeout))}"
        return ToolOutcome(_failure(name, "timeout", error), duration_ms)
    exc = out.error
    # The caller is done (cancelled, or its deadline passed, which the tool's
    # token shares): the run stops here. Only past that is a timed-out token the
    # tool's own timeout.
    stopped = caller.done
    if exc is None:
        obs, data = _content(name, out.value)
        return ToolOutcome(obs, duration_ms, content=data, cancelled=stopped)
    if isinstance(exc, AbortRun):
        obs = observation(_ERROR, {"error": exc.detail, "failure": "abort", "tool": name},
                          f"{name} aborted the run: {exc.detail}")
        return ToolOutcome(obs, duration_ms, abort=exc.detail, cancelled=stopped)
    text = exception_text(exc)
    if stopped:
        return _cancelled(name, text, duration_ms)
    if isinstance(exc, ToolError):
        failure = "timeout" if token.timed_out else "error"
        return ToolOutcome(_failure(name, failure, text), duration_ms)
    if token.timed_out:
        return ToolOutcome(_failure(name, "timeout", text), duration_ms)
    obs = observation(_ERROR, {"error": f"panic: {type(exc).__name__}: {text}", "tool": name},
                      f"{name} panicked")
    return ToolOutcome(obs, duration_ms)


def _cancelled(name: str, error: str, duration_ms: int) -> ToolOutcome:
    obs = observation(ObservationKind.INTERRUPTED.value,
                      {"error": error, "failure": "cancelled", "tool": name},
                      f"{name} was cancelled and its outcome is unknown: {error}")
    return ToolOutcome(obs, duration_ms, cancelled=True)
