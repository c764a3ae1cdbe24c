"""Calls that must not outlive their timeout: tools and model attempts.

Python cannot interrupt a thread, so a call runs on a worker thread and the
loop stops *waiting* for it at the deadline. The abandoned call keeps running
until it returns (its cancel token is set, asking it to stop); its outcome is
discarded. The same holds when the caller stops first (a cancel, or its
deadline): a call that ignores its token is not waited for past that. A
session keeps one worker for its tools, so an ordinary tool call costs a
hand-off, not a thread start.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from agentrt.driver.cancel import CancelToken

__all__ = ["Outcome", "Worker", "call_in_thread"]

#: How often a wait looks at its caller's token: a call that ignores its own
#: token is abandoned at most this long after the grace below.
_SLICE = 0.05
#: How long a call whose caller stopped is still waited for: its token was
#: cancelled with the caller's, and a call that honours it winds down (rolls
#: back, reports what it did) in this time; one that ignores it is abandoned.
_STOP_GRACE = 0.5


class Outcome:
    """Filled in by the worker: the value, or the exception the call raised.

    ``done`` is a plain lock held until then (cheaper to hand over than an
    Event); a worker thread keeps one for all its calls, as it runs one at a
    time, so a step's tool call allocates no lock.
    """

    __slots__ = ("done", "error", "value")

    def __init__(self, done: threading.Lock | None = None) -> None:
        if done is None:
            done = threading.Lock()
            done.acquire()
        self.done = done
        self.value: Any = None
        self.error: BaseException | None = None

    def wait(self, timeout: float | None) -> bool:
        """True once finished; False when ``timeout`` seconds passed first. Only
        one wait may succeed: it takes the finished signal."""
        return self.done.acquire(True, -1 if timeout is None else max(timeout, 0.0))

    def wait_unless(self, timeout: float | None, stop: CancelToken) -> bool:
        """As :meth:`wait`, and also False once ``stop`` is done (looked at every
        ``_SLICE`` seconds). A call that finishes within the first slice costs
        what :meth:`wait` costs: one acquire, no clock reading."""
        first = _SLICE if timeout is None else min(max(timeout, 0.0), _SLICE)
        if self.done.acquire(True, first):
            return True
        if timeout is not None and timeout <= _SLICE:
            return False
        end = None if timeout is None else time.monotonic() + timeout - first
        while not stop.done:
            left = _SLICE if end is None else min(end - time.monotonic(), _SLICE)
            if left <= 0:
                return False
            if self.done.acquire(True, left):
                return True
        grace = _STOP_GRACE if end is None else min(_STOP_GRACE, end - time.monotonic())
        return self.done.acquire(True, max(grace, 0.0))


def _run(out: Outcome, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        out.value = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - the caller classifies it
        out.error = exc
    finally:
        out.done.release()


# Threads do not survive a fork: a worker started before one is not used after it.
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_count_fork)


class _Thread(threading.Thread):
    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs: queue.SimpleQueue[
            tuple[Outcome, Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self.done = threading.Lock()
        self.done.acquire()
        self.forks = _forks
        self.abandoned = False

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            _run(*job)
            if self.abandoned:
                return


class Worker:
    """Runs one call at a time on a reusable thread; a call past its deadline is
    abandoned together with its thread."""

    def __init__(self, name: str = "agentrt-tool") -> None:
        self._name = name
        self._thread: _Thread | None = None

    def call(self, fn: Callable[..., Any], timeout: float | None, *args: Any,
             stop: CancelToken | None = None) -> Outcome | None:
        """``fn(*args)``'s finished outcome, or None when ``timeout`` seconds passed
        first, or ``stop`` (the caller's token) was done first."""
        thread = self._thread
        if thread is None or thread.forks != _forks:
            thread = self._thread = _Thread(self._name)
            try:
                thread.start()
            except BaseException:  # not kept: the next call would wait on a thread never run
                self._thread = None
                thread.jobs.put(None)  # and one that did start (a Ctrl-C in start()) ends
                raise
        out = Outcome(thread.done)
        thread.jobs.put((out, fn, args))
        if out.wait(timeout) if stop is None else out.wait_unless(timeout, stop):
            return out
        thread.abandoned = True
        thread.jobs.put(None)
        self._thread = None
        return None

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.jobs.put(None)


def call_in_thread(fn: Callable[[], Any], timeout: float | None, name: str,
                   stop: CancelToken | None = None) -> Outcome | None:
    """One call on its own thread; None when ``timeout`` seconds passed first, or
    ``stop`` (the caller's token) was done first."""
    out = Outcome()
    threading.Thread(target=_run, args=(out, fn, ()), name=name, daemon=True).start()
    done = out.wait(timeout) if stop is None else out.wait_unless(timeout, stop)
    return out if done else None
