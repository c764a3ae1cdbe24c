"""Waking a caught-up follower when the database changes.

Polling ``PRAGMA data_version`` every few milliseconds costs about 2% of a
core in Python while idle (measured: 1.8% at 5 ms). On Linux the follower
instead watches the database's directory with inotify: a commit writes the
``-wal`` file (or the database itself in rollback-journal mode), which ends
the wait at once, and the follower sleeps otherwise. Where inotify is not
available the waiter falls back to a plain timed wait.

The binding is a few ctypes calls into libc, so it needs no dependency.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import struct
import sys
import threading

__all__ = ["ChangeWaiter", "open_waiter"]

_IN_MODIFY = 0x00000002
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_EVENT_HEADER = struct.Struct("iIII")


class ChangeWaiter:
    """Waits for a change to the database files or for the timeout, whichever is first."""

    #: Whether a change ends a wait early (False: the wait is a plain sleep).
    notifies = False

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Wait; True when a change notification ended the wait."""
        stop.wait(timeout)
        return False

    def close(self) -> None:
        pass


class _InotifyWaiter(ChangeWaiter):
    notifies = True

    def __init__(self, fd: int, names: frozenset[bytes]) -> None:
        self._fd = fd
        self._names = names

    def _drain(self) -> bool:
        """Read pending events; True if one names a database file."""
        hit = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return hit
            if not data:
                return hit
            offset = 0
            while offset + _EVENT_HEADER.size <= len(data):
                _, _, _, length = _EVENT_HEADER.unpack_from(data, offset)
                start = offset + _EVENT_HEADER.size
                name = data[start:start + length].rstrip(b"\0")
                if name in self._names:
                    hit = True
                offset = start + length

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        # Waits in slices so a stop request is noticed within a quarter second.
        remaining = timeout
        while remaining > 0 and not stop.is_set():
            step = min(remaining, 0.25)
            ready, _, _ = select.select([self._fd], [], [], step)
            if ready and self._drain():
                return True
            remaining -= step
        return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None


def open_waiter(db_path: str) -> ChangeWaiter:
    """A waiter watching ``db_path`` and its journal files, or a plain timed one
    (no inotify, or no file to watch: an in-memory store)."""
    if db_path in ("", ":memory:") or not os.path.isfile(db_path):
        return ChangeWaiter()
    libc = _libc()
    if libc is None:
        return ChangeWaiter()
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return ChangeWaiter()
    directory = os.path.dirname(os.path.abspath(db_path)) or "."
    mask = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE
    if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
        os.close(fd)
        return ChangeWaiter()
    base = os.fsencode(os.path.basename(db_path))
    names = frozenset({base, base + b"-wal", base + b"-journal"})
    return _InotifyWaiter(fd, names)
