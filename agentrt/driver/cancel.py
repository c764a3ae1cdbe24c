"""Cancellation by an explicit token, never by killing a thread.

A :class:`CancelToken` is handed to ``Driver.start``/``resume`` and, as a child
token, to every tool call and model attempt. Cancelling a parent cancels its
children; a child's own timeout never reaches the parent. Python cannot stop a
thread, so a tool that ignores its token keeps running after the loop gives
up on it; the token is how it is asked to stop.
"""

from __future__ import annotations

import operator
import threading
import time
from datetime import timedelta

from agentrt.errors import described

__all__ = ["CancelToken"]


class CancelToken:
    """A one-way flag: once cancelled it stays cancelled.

    ``deadline`` is a :func:`time.monotonic` instant after which the token also
    counts as done (``timed_out``); waits never run past it.
    """

    __slots__ = ("_cancelled", "_children", "_deadline", "_event", "_lock", "_reason")

    def __init__(self, *, timeout: float | timedelta | None = None,
                 deadline: float | None = None) -> None:
        # The Event exists only once someone waits: a tool call makes a token,
        # and most are never waited on.
        self._cancelled = False
        self._event: threading.Event | None = None
        self._lock = threading.Lock()
        self._children: list[CancelToken] = []
        self._reason = ""
        if isinstance(timeout, timedelta):  # as every other duration of the API is given
            timeout = timeout.total_seconds()
        for name, value, what in (("timeout", timeout, "a number of seconds or a timedelta"),
                                  ("deadline", deadline, "a time.monotonic() reading")):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"CancelToken {name} is {described(value)}, not {what}")
            if value != value:  # NaN: not before, not after any instant
                raise ValueError(f"CancelToken {name} is NaN, not a number of seconds")
        if timeout is not None:
            at = time.monotonic() + timeout
            deadline = at if deadline is None else min(deadline, at)
        self._deadline = deadline

    @property
    def deadline(self) -> float | None:
        return self._deadline

    # A property whose getter is C (attrgetter), no Python frame: the loop reads
    # it before every write.
    cancelled = property(operator.attrgetter("_cancelled"),
                         doc="True once :meth:`cancel` was called (here or on a parent).")

    @property
    def timed_out(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    @property
    def done(self) -> bool:
        """Cancelled or past the deadline."""
        return self._cancelled or self.timed_out

    @property
    def reason(self) -> str:
        if self._cancelled:
            return self._reason or "cancelled"
        return "deadline exceeded" if self.timed_out else ""

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self._cancelled:
                return
            self._reason = reason
            self._cancelled = True
            if self._event is not None:
                self._event.set()
            children, self._children = self._children, []
        for child in children:
            child.cancel(reason)

    def wait(self, seconds: float | None = None) -> bool:
        """Sleep up to ``seconds`` (never past the deadline); True if cancelled meanwhile."""
        if self._deadline is not None:
            left = max(0.0, self._deadline - time.monotonic())
            seconds = left if seconds is None else min(seconds, left)
        with self._lock:
            if self._cancelled:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(seconds)

    def child(self, timeout: float | None = None) -> CancelToken:
        """A token cancelled with this one, with its own optional timeout."""
        token = CancelToken(timeout=timeout, deadline=self._deadline)
        # acquire and release rather than ``with`` (half the cost): a tool call
        # makes and releases a child.
        self._lock.acquire()
        try:
            if not self._cancelled:
                self._children.append(token)
                return token
        finally:
            self._lock.release()
        token.cancel(self._reason or "cancelled")
        return token

    def release(self, child: CancelToken) -> None:
        """Forget a finished child so a long-lived parent does not collect them."""
        self._lock.acquire()  # (not ``with``, nor contextlib.suppress: see child)
        try:
            children = self._children
            if child in children:  # not when this token was cancelled first
                children.remove(child)
        finally:
            self._lock.release()

    def __repr__(self) -> str:
        state = self.reason or "live"
        return f"CancelToken({state})"
