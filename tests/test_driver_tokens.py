"""Cancel tokens and the worker: how a call is asked to stop and given up on."""

from __future__ import annotations

import threading
import time

from agentrt.driver import CancelToken
from agentrt.driver.worker import Worker


def test_cancelling_a_parent_cancels_its_children_not_the_reverse():
    parent = CancelToken()
    child = parent.child()
    grandchild = child.child()
    child.cancel("mine")
    assert child.cancelled and grandchild.cancelled and not parent.cancelled
    other = parent.child()
    parent.cancel()
    assert other.cancelled and other.reason == "cancelled"
    assert parent.child().cancelled  # born cancelled


def test_a_wait_is_cut_short_by_a_cancel_and_never_passes_the_deadline():
    token = CancelToken()
    threading.Timer(0.05, token.cancel).start()
    started = time.monotonic()
    assert token.wait(5) is True
    assert time.monotonic() - started < 2
    timed = CancelToken(timeout=0.05)
    started = time.monotonic()
    assert timed.wait(5) is False and timed.timed_out and timed.done
    assert time.monotonic() - started < 2 and timed.reason == "deadline exceeded"


def test_released_children_are_forgotten():
    parent = CancelToken()
    kids = [parent.child() for _ in range(3)]
    for k in kids:
        parent.release(k)
    parent.cancel()
    assert not any(k.cancelled for k in kids)


def test_the_worker_gives_up_at_the_timeout_and_keeps_serving():
    worker = Worker()
    release = threading.Event()
    assert worker.call(lambda: release.wait(5), 0.05) is None  # abandoned
    out = worker.call(lambda: 42, 5)
    assert out is not None and out.value == 42
    boom = worker.call(lambda: 1 / 0, 5)
    assert boom is not None and isinstance(boom.error, ZeroDivisionError)
    release.set()
    worker.close()
