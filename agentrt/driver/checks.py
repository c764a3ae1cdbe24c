"""Argument checks for the public API: one sentence naming the argument, before any write.

Every check here runs where a value enters (a constructor, ``start``, an
operator call), never on the per-step path. Each raises
:class:`~agentrt.driver.errors.ConfigError` (a ``ValueError``) whose text names
the argument, what it was given and what it takes.
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import apsw

from agentrt.driver.errors import ConfigError
from agentrt.errors import described
from agentrt.records import duration_ns

__all__ = [
    "MAX_INT64",
    "MAX_LEASE_TTL",
    "MAX_WAIT",
    "MIN_INT64",
    "MIN_LEASE_TTL",
    "check_callable",
    "check_duration",
    "check_int",
    "check_method",
    "check_text",
    "clipped",
    "fit",
    "wait_duration",
]

MAX_INT64 = (1 << 63) - 1
MIN_INT64 = -(1 << 63)
#: The longest tool or model-call timeout and the longest wait between model
#: attempts: a year. Far inside what a thread can wait (``threading.TIMEOUT_MAX``,
#: about 292 years, past which the wait itself overflows and the step is left
#: half-way) and what a duration holds as int64 nanoseconds.
MAX_WAIT = timedelta(days=365)
assert MAX_WAIT.total_seconds() < threading.TIMEOUT_MAX
#: The shortest lease: the heartbeat renews it every third of its TTL, and a
#: lease much shorter than this expires before a step's first transaction has
#: committed, so the run stops at once with its lease lost.
MIN_LEASE_TTL = timedelta(milliseconds=250)
#: The longest lease: a run whose driver stopped waits a whole lease before
#: another driver may take it over (and the heartbeat's busy timeout, a third
#: of it in ms, must fit a C int: some 74 days).
MAX_LEASE_TTL = timedelta(days=1)


def check_text(name: str, value: Any, *, blank: str = "", utf8: str = "",
               error: type[ConfigError] = ConfigError) -> str:
    """``value`` when it is a str; with ``blank``, not blank (``blank`` says why);
    with ``utf8``, free of lone surrogates (``utf8`` says what they would break).
    Else ``error``."""
    if not isinstance(value, str):
        raise error(f"{name} is {described(value)}, not a str")
    if blank and not value.strip():
        raise error(f"{name} is {value!r}, a blank str: {blank}")
    if utf8:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = value[exc.start]
            raise error(
                f"{name} holds a lone surrogate (U+{ord(bad):04X}), which is not valid "
                f"UTF-8: {utf8}") from None
    return value


def check_int(name: str, value: Any, *, lo: int = MIN_INT64, hi: int = MAX_INT64) -> int:
    """``value`` when it is an int (never a bool) within ``lo..hi``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} is {described(value)}, not an int")
    if value < lo:
        raise ConfigError(f"{name} is {value}, below {lo}")
    if value > hi:
        bound = "2**63-1, the largest 64-bit integer" if hi == MAX_INT64 else str(hi)
        raise ConfigError(f"{name} is {value}, above {bound}")
    return value


def check_duration(name: str, value: Any) -> timedelta:
    """``value`` when it is a timedelta that int64 nanoseconds hold (about ±292 years)."""
    if not isinstance(value, timedelta):
        raise ConfigError(f"{name} is {described(value)}, not a timedelta")
    ns = duration_ns(value)
    if not MIN_INT64 <= ns <= MAX_INT64:
        raise ConfigError(
            f"{name} is {value}, beyond what a duration holds (int64 nanoseconds, "
            "about 292 years)")
    return value


def wait_duration(name: str, value: Any, *, seconds: bool = True,
                  hi: timedelta = MAX_WAIT) -> timedelta:
    """A wait given as a timedelta (or, when ``seconds``, a finite number of seconds)
    of at most ``hi``; zero and negative values are returned for the caller to judge."""
    if isinstance(value, timedelta):
        out = value
    elif seconds and isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} is {value}, not a finite number of seconds")
        if value > hi.total_seconds():
            raise ConfigError(f"{name} is {value} seconds, longer than {_span(hi)}")
        # A negative wait is the caller's to refuse; one past -hi stays negative.
        out = timedelta(seconds=max(value, -hi.total_seconds()))
    else:
        expected = "a number of seconds or a timedelta" if seconds else "a timedelta"
        raise ConfigError(f"{name} is {described(value)}, not {expected}")
    if out > hi:
        raise ConfigError(f"{name} is {out}, longer than {_span(hi)}")
    return out


def _span(d: timedelta) -> str:
    if d.days and not d.seconds and not d.microseconds:
        return "a day" if d.days == 1 else f"{d.days} days"
    return str(d)


def check_callable(name: str, value: Any, expected: str, *, sync: bool = False) -> None:
    """Refuse what cannot be called; with ``sync``, also an async function, for
    the functions the runtime calls for its own bookkeeping (an observer, a
    clock, ids): their coroutine would never run, and no record could say so."""
    if not callable(value):
        raise ConfigError(f"{name} is {described(value)}, not {expected}")
    if sync and (inspect.iscoroutinefunction(value)
                 or inspect.iscoroutinefunction(type(value).__call__)):
        raise ConfigError(f"{name} is an async function, not {expected}: agentrt calls it "
                          "synchronously; pass a plain function (run async code inside it "
                          "with asyncio.run)")


def check_method(name: str, value: Any, methods: tuple[str, ...], expected: str,
                 hint: str = "") -> None:
    """Refuse ``value`` unless each of ``methods`` is a callable attribute of it.
    A class passes that test though its methods, bound only on an instance,
    fail on every call (``DefaultPolicy`` for ``DefaultPolicy()``): a class is
    refused as such unless each method is static, a class method, or an
    attribute that binds to nothing (a builtin, a ``functools.partial``)."""
    if isinstance(value, type) and not all(_works_on_the_class(value, m) for m in methods):
        raise ConfigError(f"{name} is the class {value.__name__}, not {expected}: pass an "
                          f"instance, such as {value.__name__}()")
    for method in methods:
        if not callable(getattr(value, method, None)):
            suffix = f"; {hint}" if hint and callable(value) else ""
            raise ConfigError(f"{name} is {described(value)}, not {expected}{suffix}")


def _works_on_the_class(cls: type, method: str) -> bool:
    attr = inspect.getattr_static(cls, method, None)
    return isinstance(attr, (staticmethod, classmethod)) or not hasattr(type(attr), "__get__")


def close_if_coroutine(value: object) -> None:
    """An async function's result (a coroutine) never runs here, since consumer
    code is called synchronously: close it, or Python warns "never awaited" at
    some later, unrelated moment."""
    if inspect.iscoroutine(value):
        value.close()


#: How many characters of a text too large to store are kept.
CLIP = 1000

_T = TypeVar("_T")


def clipped(text: str) -> str:
    """The start of a consumer's text too large to store, saying how long it was."""
    if len(text) <= CLIP:
        return text
    return f"{text[:CLIP]}... ({len(text)} characters in all: too large to store)"


def fit(write: Callable[[str], _T], text: str) -> _T:
    """``write(text)``; when SQLite cannot hold that much (past its length limit),
    ``write`` with the text clipped, so the record says what it can rather than
    nothing at all."""
    try:
        return write(text)
    except apsw.TooBigError:
        if len(text) <= CLIP:
            raise
    return write(clipped(text))
