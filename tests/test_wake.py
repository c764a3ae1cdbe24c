"""Waking a caught-up follower: a change to the database's files ends the wait."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from agentrt_export.wake import open_waiter

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def _write_later(path, delay=0.1):
    def go():
        time.sleep(delay)
        with open(path, "ab") as f:
            f.write(b"x")

    thread = threading.Thread(target=go)
    thread.start()
    return thread


@linux_only
def test_a_write_to_the_wal_file_ends_the_wait_at_once(tmp_path):
    db = tmp_path / "runs.db"
    db.write_bytes(b"")
    waiter = open_waiter(str(db))
    assert waiter.notifies
    writer = _write_later(str(db) + "-wal")
    began = time.monotonic()
    assert waiter.wait(10, threading.Event()) is True
    # Written 0.1 s in; a waiter that only looked every few seconds would not be
    # here for seconds (a loaded machine is given more than a notification needs).
    assert time.monotonic() - began < 2
    writer.join()
    waiter.close()


@linux_only
def test_other_files_in_the_directory_do_not_wake_it(tmp_path):
    db = tmp_path / "runs.db"
    db.write_bytes(b"")
    waiter = open_waiter(str(db))
    writer = _write_later(str(tmp_path / "export.cursor"), delay=0.05)
    assert waiter.wait(0.5, threading.Event()) is False
    writer.join()
    waiter.close()


def test_a_stop_ends_the_wait(tmp_path):
    db = tmp_path / "runs.db"
    db.write_bytes(b"")
    waiter = open_waiter(str(db))
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    began = time.monotonic()
    waiter.wait(30, stop)
    assert time.monotonic() - began < 2
    waiter.close()


def test_an_in_memory_store_is_polled():
    assert open_waiter(":memory:").notifies is False
