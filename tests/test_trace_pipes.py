"""The trace observers on a non-blocking pipe or socket whose reader is slow.

A full non-blocking descriptor answers a write with EAGAIN. The observers wait
for room, as a blocking descriptor (and the Go reference) would, so a slow
reader (``| less``, a log shipper catching up) gets every record, whole and in
order; a reader that has gone still ends the trace.
"""

from __future__ import annotations

import array
import fcntl
import io
import os
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import IO, Any

import pytest

from agentrt.events import Event
from agentrt.trace import aligned_line, jsonl_record, jsonl_with_err, writer_with_err

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AT = datetime(2026, 10, 1, 9, 0, 0, tzinfo=UTC)


def events(n: int = 60) -> list[Event]:
    """Events of about 1.5 KB each, with multi-byte characters a partial write
    could cut in two."""
    return [Event(i, "run-1", "step-1", AT + timedelta(milliseconds=i), "step.decided",
                  b'{"n":%d,"text":"%s"}' % (i, ("\u00e9t\u00e9 \u6f22\u5b57 " * 100).encode()))
            for i in range(1, n + 1)]


def nonblocking_pipe() -> tuple[int, int]:
    """A pipe with a one-page buffer whose write end is non-blocking."""
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(w, False)
    return r, w


def wait_until_full(fd: int, at_least: int) -> None:
    """Return once the pipe read through ``fd`` holds ``at_least`` bytes and has
    not grown for 50 ms: its writer has met a full pipe (and waits, or gave up)."""
    deadline = time.monotonic() + 30
    held, before = array.array("i", [0]), -1
    while time.monotonic() < deadline:
        fcntl.ioctl(fd, termios.FIONREAD, held)
        if held[0] >= at_least and held[0] == before:
            return
        before = held[0]
        time.sleep(0.05)


def slow_reader(read: Callable[[int], bytes], into: list[bytes],
                filled: Callable[[], None] = lambda: time.sleep(0.05)) -> threading.Thread:
    """A thread that lets the buffer fill, then drains it a small chunk at a time."""

    def drain() -> None:
        filled()
        while chunk := read(1024):
            into.append(chunk)
            time.sleep(0.0002)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    return thread


def stream_over(kind: str, fd: int) -> IO[Any]:
    if kind == "binary":
        return open(fd, "wb", closefd=False)
    if kind == "raw":
        return open(fd, "wb", buffering=0, closefd=False)
    if kind == "text":
        return open(fd, "w", encoding="utf-8", closefd=False)
    assert kind == "latin-1 text"  # written UTF-8 through its buffer
    return open(fd, "w", encoding="latin-1", closefd=False)


OBSERVERS = {"jsonl": (jsonl_with_err, jsonl_record), "writer": (writer_with_err, aligned_line)}


@pytest.mark.parametrize("kind", ["binary", "raw", "text", "latin-1 text"])
@pytest.mark.parametrize("name", sorted(OBSERVERS))
def test_an_observer_on_a_full_nonblocking_pipe_waits_and_delivers_every_record_whole(
        kind, name):
    r, w = nonblocking_pipe()
    make, render = OBSERVERS[name]
    sent = events()
    received: list[bytes] = []
    reader = slow_reader(lambda n: os.read(r, n), received, lambda: wait_until_full(r, 2048))
    try:
        with stream_over(kind, w) as stream:
            observe, err = make(stream)
            for e in sent:
                observe(e)
            assert err() is None
    finally:
        os.close(w)  # the reader's end of file, whatever happened
        reader.join(10)
        os.close(r)
    expected = b"".join(rendered if isinstance(rendered := render(e), bytes)
                        else rendered.encode() for e in sent)
    assert len(expected) > 20 * 4096  # the buffer filled many times over
    assert b"".join(received) == expected


def test_a_jsonl_observer_on_a_full_nonblocking_socket_waits_for_its_reader():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        ours.setblocking(False)
        received: list[bytes] = []
        reader = slow_reader(theirs.recv, received)
        sent = events()
        try:
            with ours.makefile("wb") as stream:
                observe, err = jsonl_with_err(stream)
                for e in sent:
                    observe(e)
                assert err() is None
        finally:
            ours.shutdown(socket.SHUT_WR)
            reader.join(10)
    assert b"".join(received) == b"".join(jsonl_record(e) for e in sent)


_CHILD = """
import os, sys
from datetime import UTC, datetime, timedelta
from agentrt.events import Event
from agentrt.trace import jsonl_with_err
os.set_blocking(1, False)
observe, err = jsonl_with_err(sys.stdout)
for i in range(1, 201):
    observe(Event(i, "run-1", "", datetime(2026, 10, 1, tzinfo=UTC) + timedelta(seconds=i),
                  "step.decided", b'{"pad":"%s"}' % (b"x" * 1000)))
sys.stderr.write(repr(err()))
"""


def test_a_trace_on_a_nonblocking_stdout_reaches_a_slow_reader_process_whole():
    """The pipe's reader is another process that starts reading late and slowly."""
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
    assert child.stdout is not None and child.stderr is not None
    wait_until_full(child.stdout.fileno(), 32768)  # the child has met a full pipe
    chunks = []
    while chunk := child.stdout.read1(8192):
        chunks.append(chunk)
        time.sleep(0.001)
    err = child.stderr.read()
    assert child.wait(30) == 0
    assert err == b"None"
    lines = b"".join(chunks).split(b"\n")
    assert lines.pop() == b""
    assert [int(line.split(b",")[0][len(b'{"seq":'):]) for line in lines] == list(range(1, 201))
    assert all(line.endswith(b'"payload":{"pad":"' + b"x" * 1000 + b'"}}') for line in lines)


def test_a_reader_that_goes_away_while_the_observer_waits_ends_the_trace():
    r, w = nonblocking_pipe()
    closer = threading.Timer(0.1, os.close, (r,))
    closer.start()
    started = time.monotonic()
    with open(w, "wb", closefd=False) as stream:
        observe, err = jsonl_with_err(stream)
        for e in events():
            observe(e)
        assert isinstance(err(), BrokenPipeError)
    closer.join()
    os.close(w)
    assert time.monotonic() - started < 5


class WouldBlock(io.RawIOBase):
    """A non-blocking stream with no descriptor to wait on and no room."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> None:  # type: ignore[override]
        return None


def test_a_stream_with_no_descriptor_that_would_block_ends_the_trace_instead_of_spinning():
    observe, err = jsonl_with_err(WouldBlock())
    for e in events(3):
        observe(e)
    assert isinstance(err(), BlockingIOError)
