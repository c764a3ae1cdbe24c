"""Errors the loop and its collaborators raise, and the signals tools and models use.

Runtime refusals derive from :class:`agentrt.AgentrtError`. The signals a tool or a
model adapter raises (:class:`ToolError`, :class:`AbortRun`, :class:`TransientError`,
:class:`ServedError`) and the errors the model caller hands back to the agent
(:class:`LimitError`, :class:`ModelUnavailableError`) keep the reference's exact
``str()`` because the run's recorded detail is that text.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TypeVar

from agentrt.errors import AgentrtError, described
from agentrt.records import Usage

__all__ = [
    "AbortRun",
    "CancelledError",
    "ConfigError",
    "DriverFunctionError",
    "LimitError",
    "ModelUnavailableError",
    "ServedError",
    "ToolError",
    "TransientError",
    "UnusableUsageError",
    "find_cause",
]


class ConfigError(AgentrtError, ValueError):
    """A driver, tool, limit or call argument the runtime refuses before writing."""

    base = "agentrt"


class DriverFunctionError(ConfigError):
    """The driver's own ``now`` or ``new_id`` failed or answered something unusable.

    Not the agent's doing even when it surfaces inside the agent's model call:
    the loop lets it through (the run is left as a crashed driver leaves it, for
    a resume) instead of recording it as the agent's error."""


class CancelledError(AgentrtError):
    """The caller's cancel token fired; what was recorded stays recorded."""

    base = "agentrt: cancelled"


class ToolError(Exception):
    """Raised by a tool to report an expected failure (recorded as ``tool_error``).

    Any other exception a tool raises is recorded as a crash (``<tool> panicked``).
    """


class AbortRun(Exception):
    """Raised by a tool to end the run as ``tool_abort`` with ``detail``
    (anything but a str is recorded as its ``str()``: records hold text)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail if isinstance(detail, str) else str(detail)
        super().__init__(self.detail)


class TransientError(Exception):
    """A model failure worth retrying (a 429 or 5xx); ``retry_after`` is the
    provider's Retry-After, honoured up to ``ModelConfig.max_retry_after``."""

    def __init__(self, message: str, retry_after: timedelta | float | None = None) -> None:
        self.retry_after = _retry_after(retry_after)
        super().__init__(message)


#: Longer than any max_retry_after, which such a wait exceeds: the call fails at once.
_LONGEST_RETRY_AFTER = timedelta(days=365 * 100)


def _retry_after(value: object) -> timedelta | None:
    """A Retry-After as a timedelta: one given in seconds (as the header says it)
    is converted; anything else is refused here, in the adapter that made it,
    rather than failing a comparison deep in the retry loop."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        # Clamped both ways: a huge negative one overflowed timedelta (a wait in
        # the past is no wait), a huge one the thread's wait.
        return timedelta(seconds=min(max(value, 0), _LONGEST_RETRY_AFTER.total_seconds()))
    raise TypeError(f"TransientError retry_after is {described(value)}, "
                    "not a timedelta or a number of seconds")


class ServedError(Exception):
    """The provider served the request and charged ``usage``, then failed it.

    Charged and never retried.
    """

    def __init__(self, message: str, usage: Usage | None = None) -> None:
        self.usage = usage if usage is not None else Usage()
        super().__init__(message)


class UnusableUsageError(Exception):
    """The reply's usage cannot be believed (negative, or cached above input)."""


class LimitError(Exception):
    """A model call would break a run limit; the run ends with ``reason``."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class ModelUnavailableError(Exception):
    """The model could not be used; the run ends ``model_unavailable``."""

    def __init__(self, attempts: int, last: BaseException | str) -> None:
        self.attempts = attempts
        self.last = last
        super().__init__(f"model unavailable after {attempts} attempt(s): {last}")


E = TypeVar("E", bound=BaseException)


def find_cause(exc: BaseException, kind: type[E]) -> E | None:
    """``exc`` or the first exception of ``kind`` in its ``__cause__`` chain (Go's errors.As)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, kind):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__
    return None
