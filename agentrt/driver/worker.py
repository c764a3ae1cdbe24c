"""Calls that must not outlive their timeout: tools and model attempts.

Python cannot interrupt a thread, so a call runs on a worker thread and the
loop stops *waiting* for it at the deadline. The abandoned call keeps running
until it returns (its cancel token is set, asking it to stop); its outcome is
discarded. A session keeps one worker for its tools, so an ordinary tool call
costs a hand-off, not a thread start.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Outcome", "Worker", "call_in_thread"]


class Outcome:
    """Filled in by the worker: the value, or the exception the call raised.

    A plain lock stands for "not done yet": cheaper to hand over than an Event,
    and a step hands one over per tool call.
    """

    __slots__ = ("_pending", "error", "value")

    def __init__(self) -> None:
        self._pending = threading.Lock()
        self._pending.acquire()
        self.value: Any = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        self._pending.release()

    def wait(self, timeout: float | None) -> bool:
        """True once finished; False when ``timeout`` seconds passed first."""
        if self._pending.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            self._pending.release()
            return True
        return False


def _run(fn: Callable[[], Any], out: Outcome) -> None:
    try:
        out.value = fn()
    except BaseException as exc:  # noqa: BLE001 - the caller classifies it
        out.error = exc
    finally:
        out.finish()


class _Thread(threading.Thread):
    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Outcome] | None] = (
            queue.SimpleQueue())
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

    def call(self, fn: Callable[[], Any], timeout: float | None) -> Outcome | None:
        """The finished outcome, or None when ``timeout`` seconds passed first."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            thread = self._thread = _Thread(self._name)
            thread.start()
        out = Outcome()
        thread.jobs.put((fn, out))
        if out.wait(timeout):
            return out
        thread.abandoned = True
        thread.jobs.put(None)
        self._thread = None
        return None

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.jobs.put(None)


def call_in_thread(fn: Callable[[], Any], timeout: float | None, name: str) -> Outcome | None:
    """One call on its own thread; None when ``timeout`` seconds passed first."""
    out = Outcome()
    threading.Thread(target=_run, args=(fn, out), name=name, daemon=True).start()
    return out if out.wait(timeout) else None
